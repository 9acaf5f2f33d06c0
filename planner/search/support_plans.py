"""Incumbents from the bound's own LPs, for the knob tuples too big for the exact MILP.

Such a tuple (hundreds of options over 6-32 stages: bench scenarios c and e) is bounded by its
position LPs (packed.py, position_lp.py) and otherwise only gets the send-free relaxation
(``incumbent.relaxed``), whose MILP over all its options finds poor plans in the seconds it
is given.  The position LPs' optima, though, put nearly all their weight on a few options:
on c's p = 12, B = 128 interleaved tuple, three (A100 at TP 8 and H100 at TP 4 and 8, each
with 128 replicas).  The exact MILP on those few alone, sends included, solves in seconds,
and its plan (1.922 s per iteration) beat the search's answer (1.975 s) there.

So before the relaxation, such a tuple is priced on the ``SUPPORT_OPTIONS`` options its LPs
weighed most (``KnobBound.support``) and solved, capped like a warm start; its plan is then
polished over all the tuple's options.  Proves nothing: an incumbent only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from planner.search import clock
from planner.search.incumbent import (
    POLISH_SHARE,
    WARM_TUPLE_SHARE,
    Candidate,
    _horizon,
    exact_solver,
    polish_into,
    priced,
    relaxed,
)
from planner.search.polish import polish

if TYPE_CHECKING:       # annotations only: bound.py and solve.py import the search's modules
    from planner.search.bound import KnobBound
    from planner.search.core.milp import MilpSettings
    from planner.search.incumbent import Best
    from planner.search.objectives import ObjectiveSpec
    from planner.search.space import Pricer
    from planner.search.stats import SearchStats

SUPPORT_OPTIONS = 6     # the options a support plan is solved on (c's best needed 3)


@dataclass(frozen=True)
class SearchState:
    """What the heap's steps for one tuple share (solve.py builds it once per search)."""
    pricer: Pricer
    knob_bound: KnobBound       # the heap's, which holds the LPs' options
    spec: ObjectiveSpec
    launcher: str | None
    best: Best
    bounds: list[float]         # the bounds of the tuples closed so far
    stats: SearchStats
    settings: MilpSettings
    deadline: float
    gap_rel: float
    time_like: bool


def too_big(s: SearchState, knobs, ctx, keys, lb: float) -> None:
    """A tuple too big for the exact MILP: a plan on its LPs' options, then the send-free
    relaxation (its dual bound, its plan)."""
    s.stats.too_big += 1
    if s.time_like:
        from_support(s, knobs, ctx, keys)
    relaxed(s.pricer, knobs, ctx, keys, lb, s.spec, s.launcher, s.best, s.bounds, s.stats, s.settings,
            s.deadline, s.gap_rel, s.time_like)


def from_support(s: SearchState, knobs, ctx, keys) -> None:
    """The exact plan on the options the tuple's position LPs weighed most, polished over
    ``keys``, added to the incumbents when it beats them."""
    own = set(keys)
    support = [k for k in s.knob_bound.support(knobs, SUPPORT_OPTIONS) if k in own]
    if not support or clock.now() >= s.deadline:
        return
    prob, qb = priced(s.pricer, knobs, ctx, support, s.spec, s.launcher)
    cut = s.best.threshold()
    if qb is None or qb >= cut:
        return
    until = min(s.deadline, clock.now() + WARM_TUPLE_SHARE * _horizon(s.settings))
    sol = exact_solver(prob).solve(s.settings, deadline=until, cutoff=cut if math.isfinite(cut) else None)
    if not sol.ok:
        return
    # local search on the few options first (milliseconds: c's 1.974-s MILP plan became
    # 1.929 s), then over all of the tuple's (pricing them all takes a second or two on c)
    polish_s = POLISH_SHARE * _horizon(s.settings)
    t, assign = polish(prob, sol.assign, deadline=min(s.deadline, clock.now() + polish_s))
    before = s.best.threshold()
    s.best.add(Candidate.of(prob, assign, t, knobs, s.spec))
    s.stats.support_plans += s.best.threshold() < before
    polish_into(s.pricer, knobs, ctx, keys, prob, assign, s.spec, s.launcher, s.best,
                min(s.deadline, clock.now() + polish_s))
