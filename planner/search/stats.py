"""What a search counts as it goes: the report's figures (answer.finish), the live line's
frontier (watch.py) and the reason given when no plan comes back (diagnose.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.search.baselines import BaselineResult


@dataclass
class SearchStats:
    """Counts of knob tuples by how each ended, and the figures read after the search.  One
    object for the whole search, written by solve.py, support_plans.too_big, incumbent.relaxed
    and per_tuple."""

    knobs: int                          # knob tuples enumerated
    solved: int = 0                     # solved exactly (MILP or enumeration)
    pruned: int = 0                     # a bound reached the incumbent (twins included)
    empty: int = 0                      # no plan: none fits, over the budget or under the floor
    unexplored: int = 0                 # neither solved nor pruned when the search stopped
    milp_optimal: bool = True           # False once a MILP stopped at a limit unproved
    twins: int = 0                      # left out for a twin that bounds them (twins.py)
    too_big: int = 0                    # too big for the exact MILP (support_plans.too_big)
    relaxed: int = 0                    # send-free relaxations solved for those
    support_plans: int = 0              # better plans found on their position LPs' options (support_plans.py)
    path_bounds: int = 0                # path bounds taken for them (path_level.py)
    path_lifted: int = 0                # ... that rose above the knob bound
    timed_out: int = 0                  # per-tuple MILPs stopped by the time limit
    polished: int = 0                   # their plans that local search then improved (per_tuple.py)
    out_of_reach: int = 0               # empty by a finite bound over the budget or floor
    no_options: int = 0                 # no replica count gives an allowed share
    given: int = 0                      # plans given whole (a replan's old plan, given.py)
    interrupted: bool = False           # stopped by Ctrl-C with a plan in hand
    # the heap's least bound when it was last read (None before the heap, or where no bound
    # covers the tuples left): no tuple left holds a better plan
    frontier: float | None = None
    least_time_s: float | None = None   # the least memory-free time bound of any tuple
    least_price_usd_per_hour: float | None = None   # the cheapest rent any tuple's floor allows
    over_budget: dict[str, float] = field(default_factory=dict)   # class -> least rent of a node
    tokens_per_iteration: int | None = None
    baseline: BaselineResult | None = None          # the baselines' best (baselines.seed)
    shared_warm_start: int | None = None            # plans the throughput warm start kept (cost objectives)
    # the longest set-up so far, so that the next starts only with the time to finish
    price_s: float = 0.0                # pricing one tuple
    relaxed_setup_s: float = 0.0        # pricing and building one relaxation
    path_price_s: float = 0.0           # pricing one tuple with its sends for its path bound

    def out_of_reach_tuple(self, time_bound_s: float) -> None:
        """A tuple whose value bound is inf: no plan under the budget or floor (or none at
        all); out of reach when its time bound is finite (diagnose.py reads the two apart)."""
        self.empty += 1
        self.out_of_reach += math.isfinite(time_bound_s)
