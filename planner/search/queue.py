"""The search's work items (solve.py; docs/search-space.md, "How it is searched"): every knob
tuple ranked by its first, memory-free bound, then heap entries that climb the bound levels
until they are priced and solved.  Named tuples, so the fields read by name and the heap
still orders them as tuples (value first, then the enumeration index, which is unique)."""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple


class BoundLevel(IntEnum):
    """How far a tuple's bound has been tightened (bound.KnobBound), each level dearer than the
    last; an entry at level L gets the next one from ``knob_bound(..., packed=L)``."""

    MEMORY_FREE = 0      # ranking: forward, backward and optimizer slopes only
    MEMORY_AWARE = 1     # block limits per option, class subsets, sends between classes
    KNAPSACK = 2         # and the packed bottleneck's knapsacks (packed.py)
    LP = 3               # and its position LPs; at the head again, priced and solved, unless ordered or too big for the exact MILP
    ORDERED = 4          # (pipelines of 2-3 classes that do not wrap) those LPs per order of the classes (position_lp.orders)
    APART = 5            # (too big) and the max terms apart (apart.py); at the head again, support_plans.too_big


class Ranked(NamedTuple):
    """A knob tuple as ranked before any pricing."""

    bound_s: float       # memory-free lower bound on its iteration time (the sort key)
    index: int           # its place in the enumeration (ties keep the space's order)
    knobs: Any           # knobs.Knobs
    ctx: Any             # cost.context.CostContext of its recompute and ZeRO stage
    keys: list           # the knobs.OptionKeys it may use


class Pending(NamedTuple):
    """A heap entry: a tuple waiting for its next bound level, or for its MILP."""

    value: float         # lower bound on the objective's value (the heap key)
    index: int
    level: int           # BoundLevel reached
    knobs: Any
    ctx: Any
    keys: list
    time_bound_s: float  # the time bound behind ``value``
