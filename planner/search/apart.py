"""The packed bound with the pipeline's max terms and the stages' own taken apart (the knob
bound's last level, for the tuples too big for the exact MILP; docs/search-space.md, "The max
terms apart").

packed.py prices every stage's max terms together, ``max_s (P_s + D_s)``: P the pipeline's
rows (those with sends), D the rows each stage pays on its own, the exposed DP sync and the
optimizer step.  A plan pays ``max_s P_s + max_s D_s``, and its largest D need not sit on its
largest P: on scenario c's 12-stage plan the pipeline's bottleneck is an H100 stage, the
largest exposed sync an A100 stage by the zone boundary, and the sum bound lost 0.075 s of
the 0.095 s between the bound and the plan.

Every plan's ``D* = max_s D_s`` lies in some interval ``[a, b]`` of a grid.  Its stages then
hold only the blocks with ``D <= b`` (per option and position: a cap on the position LP's
columns, never an average over them, which is where an LP variable for D lost it), so the plan
costs at least ``a + pipeline(b)``: the packed bound of the pipeline's rows and the fill under
those caps.  Plans with ``D* >= a`` cost at least ``a + pipeline(no cap)``, which ends the grid.
The least over the intervals bounds the tuple; the interval that binds is halved a few times.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from planner.search import clock
from planner.search.knobs import knob_rows
from planner.search.mixed import StandIn
from planner.search.packing import KNAPSACK_STAGES, MaxTerms, position_kinds, suffix_min

if TYPE_CHECKING:
    from planner.search.packed import PackedBound

APART_STEP = 0.02           # the grid's step on D, a share of the bound it improves
APART_POINTS = 16           # grid intervals at most (above the last: D at least its end)
APART_REFINE = 6            # halvings of the interval that binds


def applies(knobs, keys) -> bool:
    """Whether the level can add to the LP level's bound: a pipeline the packed bound reads
    (2 <= p <= KNAPSACK_STAGES) whose rows have max terms of both groups (the V schedules'
    pipeline is a sum term on long pipelines: nothing to take apart)."""
    if not 2 <= knobs.num_stages <= KNAPSACK_STAGES:
        return False
    rows, terms = knob_rows(knobs, any(isinstance(k, StandIn) for k in keys))
    groups = {MaxTerms.PIPELINE.takes(rows[t.row]) for t in terms if t.kind == "max"}
    return len(groups) == 2


def bound_apart(packed: PackedBound, knobs, ctx, keys, pieces: tuple, L: int, U_pos: np.ndarray, enough: float,
                sums: float, joint: float, num_classes: int) -> float:
    """A lower bound on every plan of the tuple (``packed``: its PackedBound; ``U_pos`` [K, p]
    each option's memory limit at each position; the rest as PackedBound.__call__ takes
    them; ``joint``: the bound with the max terms together, the grid's scale): -inf where the
    level does not apply or the time is out, inf where no option holds a block.  At least
    ``enough`` once that is shown."""
    if not applies(knobs, keys) or clock.now() > packed.deadline:
        return -math.inf
    pipe = packed.stage_tables(knobs, ctx, keys, pieces, L, MaxTerms.PIPELINE)
    own = packed.stage_tables(knobs, ctx, keys, pieces, L, MaxTerms.STAGE)
    # each position kind's D at each block count, memory limits applied, as a suffix minimum:
    # the most blocks with D <= b is how many entries are at most b
    over = np.arange(1, L + 1)[None, :] > pieces[2][:, None]
    at = np.stack([own.first, own.first if own.mid is None else own.mid, own.last])
    at = suffix_min(np.where(over[None], math.inf, at))
    finite = at[np.isfinite(at)]
    if not len(finite):
        return math.inf
    kinds = position_kinds(knobs.num_stages)
    lo, hi = max(0.0, float(finite.min())), float(finite.max())     # D* is floored at 0, as a max term

    def at_least(a: float, b: float | None) -> float:
        """A bound on the plans with D* >= a whose stages each have D <= b (None: any): a +
        the pipeline rows' packed bound with the fill, each column capped at its blocks with
        D <= b; ``enough`` itself once the inner bound shows its share (a + (enough - a) may
        round below it, and the tuple would not be pruned)."""
        caps = U_pos if b is None else np.minimum(U_pos, np.moveaxis((at <= b).sum(axis=-1)[kinds], 0, -1))
        inner = packed.bound_on(knobs, pipe, pieces, L, caps, num_classes, enough - a, sums)
        return enough if inner >= enough - a else a + inner

    uncapped = at_least(lo, None) - lo              # D* >= a: at least a + uncapped
    step = APART_STEP * joint
    grid: list[list[float]] = []                    # [a, b, a bound on the plans with D* in [a, b]]
    a, tail = lo, math.inf
    while True:
        least = min((v for _, _, v in grid), default=math.inf)
        if a + uncapped >= min(least, enough) or len(grid) >= APART_POINTS or clock.now() > packed.deadline:
            tail = a + uncapped
            break
        b = min(hi, a + step)
        grid.append([a, b, at_least(a, b)])
        if b >= hi:
            # no column's suffix minimum is above hi: its cap holds every block, so a plan with
            # D* > hi (a D that falls as blocks grow) costs at least hi + uncapped
            tail = b + uncapped
            break
        a = b
    for _ in range(APART_REFINE):
        i = min(range(len(grid)), key=lambda j: grid[j][2], default=None)
        if i is None or grid[i][2] >= min(tail, enough) or clock.now() > packed.deadline:
            break
        a, b, value = grid[i]
        mid = 0.5 * (a + b)
        # [mid, b] keeps the cap at b, its bound moves up by mid - a
        grid[i:i + 1] = [[a, mid, at_least(a, mid)], [mid, b, value + (mid - a)]]
    return min(tail, min((v for _, _, v in grid), default=math.inf))
