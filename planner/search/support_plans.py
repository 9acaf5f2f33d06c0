"""Incumbents from the bound's own LPs: a knob tuple solved on the few options its position
LPs weigh.

A tuple of hundreds of options over 6-32 stages (bench scenarios c and e) is too big for the
exact MILP; its capped MILPs over many options (the warm start's on ``warm.warm_keys``, the
send-free relaxation's, ``incumbent.relaxed``) find poor plans in the seconds they get.  The
knob bound's position LPs (packed.py, position_lp.py), though, put nearly all their weight
on a few options: on c's p = 12, B = 128 interleaved tuple, three (A100 at TP 8 and H100 at
TP 4 and 8, each with 128 replicas).  The exact MILP on those alone, sends included, finds a
1.922-s plan in seconds, where the search's answer was 1.975 s.

``support_plan``: the tuple priced on the ``SUPPORT_OPTIONS`` options its LPs weighed most
(``KnobBound.support``), laid out as runs (runs.py: stage counts near the LPs' weights) and
then solved capped, its best plan polished on them and then over all the tuple's options.
The warm start (warm.py) runs it on each longer tuple whose LPs it has just run, and the
heap (``too_big``) on each tuple too big for the exact MILP, before the relaxation.  Proves
nothing: incumbents only.
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
    exact_solver,
    polish_into,
    priced,
    relaxed,
    share_until,
)
from planner.search.path_level import path_level
from planner.search.polish import polish
from planner.search.runs import run_layouts

if TYPE_CHECKING:       # annotations only: bound.py and solve.py import the search's modules
    from planner.search.bound import KnobBound
    from planner.search.core.milp import MilpSettings
    from planner.search.incumbent import Best
    from planner.search.objectives import ObjectiveSpec
    from planner.search.space import Pricer
    from planner.search.stats import SearchStats

SUPPORT_OPTIONS = 6     # the options a support plan is solved on (c's best needed 3)


@dataclass(frozen=True)
class Planning:
    """What a support plan needs: where to price and bound, what to add to, until when."""
    pricer: Pricer
    knob_bound: KnobBound       # the one whose LPs bounded the tuple: it holds their options
    spec: ObjectiveSpec
    launcher: str | None
    best: Best
    settings: MilpSettings
    deadline: float


@dataclass(frozen=True)
class SearchState(Planning):
    """What the heap's steps for one tuple share (solve.py builds it once per search)."""
    bounds: list[float]         # the bounds of the tuples closed so far
    stats: SearchStats
    gap_rel: float
    time_like: bool


def too_big(s: SearchState, knobs, ctx, keys, lb: float) -> None:
    """A tuple too big for the exact MILP: the path bound (path_level.py), and unless that
    prunes it, a plan on its LPs' options and the send-free relaxation (its dual bound, its
    plan).  The bound first: on bench c and e it prunes each such tuple in 3-5 s, where the
    support plans took 2-5 s a tuple and found no better plan (their answers come earlier,
    from the warm start)."""
    s.stats.too_big += 1
    if s.time_like:
        lb = path_level(s, knobs, ctx, keys, lb)
        if lb >= s.best.threshold() * (1 - s.gap_rel):
            s.stats.pruned += 1
            s.bounds.append(lb)
            return
        s.stats.support_plans += support_plan(s, knobs, ctx, keys)
    relaxed(s.pricer, knobs, ctx, keys, lb, s.spec, s.launcher, s.best, s.bounds, s.stats, s.settings,
            s.deadline, s.gap_rel, s.time_like)


def support_plan(s: Planning, knobs, ctx, keys) -> bool:
    """Plans on the options the tuple's position LPs weighed most: their run layouts
    (runs.py), then the exact MILP on them (capped like a warm start's), polished; the better
    of the two then polished over ``keys`` (each step up to POLISH_SHARE of the limit), all
    before ``s.deadline``; whether it improved the incumbents."""
    own = set(keys)
    weights = {k: w for k, w in s.knob_bound.support(knobs, SUPPORT_OPTIONS).items() if k in own}
    support = list(weights)
    if not support or clock.now() >= s.deadline:
        return False
    started = clock.now()
    prob, qb = priced(s.pricer, knobs, ctx, support, s.spec, s.launcher)
    price_all_s = (clock.now() - started) * len(keys) / len(support)     # pricing is per option
    before = cut = s.best.threshold()
    if qb is None or qb >= cut:
        return False
    # the options as runs first (runs.py: e's 12-stage tuple, 2.057 s where the capped MILP
    # alone ended at 2.105 s), which also gives the MILP its cutoff
    found = []          # (its Candidate, its assignment): compared on their true times
    ran = run_layouts(prob, [weights[o.label] for o in prob.options], share_until(s.deadline, POLISH_SHARE, s.settings))
    if ran is not None:
        found.append((Candidate.of(prob, ran[1], ran[0], knobs, s.spec), ran[1]))
        s.best.add(found[-1][0])
        cut = s.best.threshold()
    until = share_until(s.deadline, WARM_TUPLE_SHARE, s.settings)
    sol = exact_solver(prob).solve(s.settings, deadline=until, cutoff=cut if math.isfinite(cut) else None)
    if sol.ok:
        # local search on the few options (milliseconds: c's 1.974-s MILP plan became 1.929 s)
        t, assign = polish(prob, sol.assign, deadline=share_until(s.deadline, POLISH_SHARE, s.settings))
        found.append((Candidate.of(prob, assign, t, knobs, s.spec), assign))
        s.best.add(found[-1][0])
    if not found:
        return False
    _, assign = min(found, key=lambda f: f[0].time_s)
    # pricing all the options cannot be interrupted (1-2 s on c): only when it fits the time left
    if clock.now() + price_all_s < s.deadline:
        polish_into(s.pricer, knobs, ctx, keys, prob, assign, s.spec, s.launcher, s.best,
                    share_until(s.deadline, POLISH_SHARE, s.settings))
    return bool(s.best.threshold() < before)     # a numpy bool would make the counter numpy's
