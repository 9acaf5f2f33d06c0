"""One knob tuple, priced, solved under each objective (solve.py's heap hands it over):

- ``throughput`` / ``throughput-under-budget``: the MILP's least time, then with no-good cuts
  the next best for ``--top K``; its dual bound joins the search's bound.
- ``cost-above-floor``: the least price with time <= tokens per iteration / floor, then the
  fastest plan at that price.
- ``cost``: a walk up the tuple's price/time Pareto front from its cheapest plan, each level
  a price MILP (the least price among plans faster than the last level) and a time MILP (the
  fastest plan at that price), each cut off where it cannot beat the incumbent; the walk ends
  once a level's price x the tuple's time bound reaches it.

A tuple that is not proved (a deadline, an unproved MILP) leaves its lower bound in
``bounds``: the floor of floors.py for the cost objectives, the MILP's dual bound for time.
"""

from __future__ import annotations

import math

from planner.search import clock
from planner.search.incumbent import POLISH_SHARE, Candidate, exact_solver, warm_horizon_s
from planner.search.objectives import ObjectiveSpec
from planner.search.polish import polish
from planner.search.schedules import SCHEDULES

# The cost walk's next level asks for plans this much faster than the last: well above the
# solvers' tolerance on the time cap (~1e-9), or a level would return its own plan again.  A
# plan skipped by it costs more (a dearer level) and is at most this much faster: it cannot win
# unless two price levels differ by less than this.
STEP_REL = 1e-7


def prunes(spec: ObjectiveSpec, bound: float, threshold: float, gap_rel: float) -> bool:
    """Whether a bound on a tuple's value rules it out against the K-th best plan.  Under
    cost-above-floor a tuple at the same price may still win on time: only a higher one goes."""
    cut = threshold * (1 - gap_rel)
    if spec.kind == "cost-above-floor" and gap_rel == 0:
        return bound > cut * (1 + 1e-12)
    return bound >= cut


def loses_tie(spec: ObjectiveSpec, bound: float, time_s: float, best, gap_rel: float) -> bool:
    """Under cost-above-floor a tuple whose least price is the K-th best plan's price can win
    only on time (ties go to the faster plan): not when its time bound is at least that
    plan's time.  Without this, every tuple at the incumbent's price was solved."""
    if spec.kind != "cost-above-floor" or gap_rel != 0 or len(best.items) < best.k:
        return False
    price, time_s_k = best.items[-1].key
    return bound >= price * (1 - 1e-12) and time_s >= time_s_k


def _polish_into(prob, sol, mine: Candidate, knobs, spec, best, stats, milp, deadline: float) -> None:
    """Local search from an unproved MILP's plan (``mine``, its candidate); the better plan, by
    its exact time (the rows of zb-h1 and the V schedules only bound it), joins ``best`` and
    the MILP's no-goods (the next ``--top`` round looks past it)."""
    value, assign = polish(prob, sol.assign, deadline=deadline)
    if assign == sol.assign:
        return
    found = Candidate.of(prob, assign, value, knobs, spec)
    if found.time_s < mine.time_s:
        stats.polished += 1
        best.add(found)
        milp.exclude(assign)


def solve_tuple(milp, prob, knobs, spec, training, best, bounds, stats, settings, deadline, top_k, lb,
                time_lb: float = 0.0):
    stats.solved += 1
    tokens = training.global_batch_size * training.seq_len
    if not SCHEDULES[knobs.schedule].exact and spec.kind not in ("throughput", "throughput-under-budget"):
        # the rows only bound this schedule's time (schedules.py): the price MILPs' time caps
        # and the cost walk's steps read the bound, so what they find is not proved best
        # among the tuple's plans; its floor stays in the bounds
        stats.milp_optimal = False
        bounds.append(lb)
    if spec.kind in ("throughput", "throughput-under-budget"):
        # an unproved MILP's plan is polished by local search (milliseconds; on a three-zone
        # 70B tuple a 46.2-s plan became 38.7 s): the MILP stops this much before the deadline
        reserve = POLISH_SHARE * warm_horizon_s(settings)
        for j in range(top_k):
            cut = best.threshold()
            sol = milp.solve(settings, deadline=max(clock.now(), deadline - reserve),
                             cutoff=cut if math.isfinite(cut) else None)
            if sol.status == "unknown":
                stats.timed_out += 1
            if j == 0 and sol.status != "infeasible":      # a proved-infeasible tuple bounds nothing
                bounds.append(max(lb, sol.bound) if sol.bound is not None else lb)
                if sol.status in ("feasible", "unknown"):
                    stats.milp_optimal = False
            if not sol.ok:
                break
            # priced once (a V schedule's exact time runs the executor), for the polish and best
            mine = Candidate.of(prob, sol.assign, sol.objective, knobs, spec)
            if sol.status != "optimal":
                _polish_into(prob, sol, mine, knobs, spec, best, stats, milp, min(deadline, clock.now() + reserve))
            if sol.objective >= best.threshold():
                break
            best.add(mine)
            milp.exclude(sol.assign)
        return
    if spec.kind == "cost-above-floor":
        cap = tokens / spec.min_tokens_per_s
        sol = milp.solve(settings, mode="price", time_cap=cap * (1 + 1e-12), deadline=deadline)
        if sol.status != "optimal" and sol.status != "infeasible":
            # not proved: the tuple's floor, or the MILP's own bound on its price, bounds it
            bounds.append(max(lb, sol.bound) if sol.bound is not None else lb)
        if not sol.ok:
            if sol.status == "unknown":
                stats.milp_optimal = False
            return
        prob.budget_usd_per_hour = sol.objective * (1 + 1e-12)
        fast = exact_solver(prob).solve(settings, deadline=deadline)
        pick = fast if fast.ok else sol
        if pick.status != "optimal" or sol.status != "optimal":
            stats.milp_optimal = False
        cand = Candidate.of(prob, pick.assign, prob.objective(pick.assign), knobs, spec)
        if cand.time_s <= cap * (1 + 1e-12):     # the exact time (a bound's plan may be slower)
            best.add(cand)
        return
    # cost: walk the tuple's price/time Pareto front up from its cheapest plan.  Each level:
    # the least price p among the plans faster than the last level (a price MILP: fast, few
    # price levels), then the fastest plan at price <= p (cut off where p x time cannot win).
    # The plans left are faster still, so they cost more than p and take at least the tuple's
    # time bound: the walk ends once p x that bound reaches the incumbent.
    cap = None
    proved = True
    while True:
        if clock.now() > deadline:      # the walk is cut short: not proved
            proved = False
            break
        # a plan dearer than this cannot win, however fast (at least the tuple's time bound)
        dear = best.threshold() / time_lb if time_lb > 0 else math.inf
        step = milp.solve(settings, mode="price", time_cap=cap, deadline=deadline,
                          cutoff=dear if math.isfinite(dear) else None)
        if not step.ok:
            # infeasible: no plan is faster, the front is walked; cutoff: the faster ones are
            # too dear to win
            proved &= step.status != "unknown"
            break
        proved &= step.status == "optimal"
        price = step.objective
        best.add(Candidate.of(prob, step.assign, prob.objective(step.assign), knobs, spec))
        if price * time_lb >= best.threshold():
            break
        cut = best.threshold() / price if price > 0 else math.inf
        prob.budget_usd_per_hour = price * (1 + 1e-12)
        fast = exact_solver(prob).solve(settings, deadline=deadline, cutoff=cut if math.isfinite(cut) else None)
        prob.budget_usd_per_hour = None
        if fast.ok:
            proved &= fast.status == "optimal"
            best.add(Candidate.of(prob, fast.assign, fast.objective, knobs, spec))
            cap = fast.objective * (1 - STEP_REL)
        elif fast.status == "cutoff":   # none at this price is fast enough to win
            cap = cut * (1 - STEP_REL)
        else:
            proved = False
            break
    prob.budget_usd_per_hour = None
    if not proved:
        # the walk's plans stand; what it did not reach is bounded by the tuple's floor
        stats.milp_optimal = False
        bounds.append(lb)
