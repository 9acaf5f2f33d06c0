"""Which slot of the search's per-option arrays holds what: a stage's quantities (``Quantity``,
the entries of core rows' coefficients and of options' slopes and intercepts) and its
position in the pipeline (``Position``, the columns of per-position intercepts).  Imports
nothing from the search, so pricing, rows and bounds alike can read it."""

from __future__ import annotations

from enum import IntEnum


class Quantity(IntEnum):
    """A stage's quantities, each affine in its block count (core/problem.py)."""
    # every quantity vector (rows' coefficients, CoreOption slope and fixed) is laid out in this order
    FORWARD = 0
    BACKWARD = 1
    SYNC_LESS_BACKWARD = 2      # the DP sync's backward-side traffic less the backwards it hides behind
    OPTIMIZER = 3
    GATHER_LESS_FORWARD = 4     # its forward-side traffic less the forwards (cost/comm.exposed_sync_parts)
    BACKWARD_INPUT = 5          # the backward less its W (zero-bubble schedules)


QUANTITIES = tuple(q.name.lower() for q in Quantity)


def per_quantity(**values: float) -> tuple[float, ...]:
    """A vector over the quantities from their lower-case names; 0 for those not named."""
    unknown = set(values) - set(QUANTITIES)
    if unknown:
        raise ValueError(f"not a stage quantity: {', '.join(sorted(unknown))}")
    return tuple(values.get(name, 0) for name in QUANTITIES)


class Position(IntEnum):
    """Where a stage sits, by the ends it holds: the first stage holds the embedding, the last
    the head, the only one both.  Also a stage's role (SearchSchedule.role_positions: a V's
    first stage pays the only position's intercepts, its last the middle's)."""
    # every per-position array (intercepts, memory limits, the capacity floor's roles) has its columns in this order
    MIDDLE = 0
    FIRST = 1
    LAST = 2
    ONLY = 3

    @property
    def ends(self) -> tuple[bool, bool]:
        """(embedding, head) of a stage here."""
        return self in (Position.FIRST, Position.ONLY), self in (Position.LAST, Position.ONLY)


POSITIONS = tuple(pos.ends for pos in Position)


class End(IntEnum):
    """A stage of a pipeline of two or more, as packed.py's and packing.py's tables stack them."""
    # stage order, so that p stages read first, p - 2 middle, last
    FIRST = 0
    MIDDLE = 1
    LAST = 2


ENDS_ORDER = tuple(Position[end.name] for end in End)   # each End's Position
