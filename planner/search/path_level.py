"""The path bound for a tuple too big for the exact MILP (core/path_bound.py; docs/search-space.md,
"Paths over boxes").

Bench c's and e's last gaps were each held by two interleaved tuples of 12-16 stages over
130-230 options, where every knob-bound level (the position LPs, the class orders, the max
terms apart) stopped 1.5-3% under the best plan known, and their MILPs' dual bounds lie 10-30%
lower still.  The path DP walks the stages in order with whole options and block counts, each
boundary's send from the two options it joins, and prices the class capacities by their
Lagrangian duals: on c's p = 12 tuples it shows 1.9034 s (the 1% line under the 1.9224-s
answer) where the levels gave 1.869 and 1.892 s.

It runs on the tuple priced with its sends, before the support plans (support_plans.too_big:
where it prunes the tuple they are not needed), with at most PATH_SHARE of the limit.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from planner.search import clock
from planner.search.core.path_bound import path_bound
from planner.search.incumbent import priced, share_until

if TYPE_CHECKING:
    from planner.search.support_plans import SearchState

PATH_SHARE = 0.25       # of the limit, at most, for one tuple's path bound (c: 3-5 s of its 30 s)


def path_level(s: SearchState, knobs, ctx, keys, lb: float) -> float:
    """A bound on every plan of the tuple, at least ``lb`` (the knob bound it came with): the
    path bound, asked to show the pruning threshold; ``lb`` itself where the time is out."""
    cut = s.best.threshold() * (1 - s.gap_rel)
    # pricing the tuple with its sends cannot be interrupted (1-2 s on c): only when the
    # longest such pricing so far fits the time left; and only with a threshold to show
    if not math.isfinite(cut) or clock.now() + max(s.stats.price_s, s.stats.path_price_s) >= s.deadline:
        return lb
    started = clock.now()
    prob, qb = priced(s.pricer, knobs, ctx, keys, s.spec, s.launcher)
    s.stats.path_price_s = max(s.stats.path_price_s, clock.now() - started)
    if qb is None:
        return lb                       # some stage has no option: the relaxation counts it empty
    until = share_until(s.deadline, PATH_SHARE, s.settings)
    found = path_bound(prob, cut, out_of_time=lambda: clock.now() > until)
    s.stats.path_bounds += 1
    if found > lb:
        s.stats.path_lifted += 1
    return max(lb, qb, found)
