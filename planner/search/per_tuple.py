"""One knob tuple, priced, solved under each objective (solve.py's heap hands it over):

- ``throughput`` / ``throughput-under-budget``: the MILP's least time, then with no-good cuts
  the next best for ``--top K``; its dual bound joins the search's bound.
- ``cost-above-floor``: the least price with time <= tokens per iteration / floor, then the
  fastest plan at that price.
- ``cost``: a walk down the tuple's price/time Pareto front from its fastest plan, each step
  cheaper, until (its time) x (the tuple's least price) cannot beat the incumbent; each step's
  MILP is cut off at that time, so a tuple that cannot win stops at once.

A tuple that is not proved (a deadline, an unproved MILP) leaves its lower bound in
``bounds``: the floor of floors.py for the cost objectives, the MILP's dual bound for time.
"""

from __future__ import annotations

import math
import time

from planner.search.incumbent import Candidate, exact_solver
from planner.search.objectives import ObjectiveSpec


def prunes(spec: ObjectiveSpec, bound: float, threshold: float, gap_rel: float) -> bool:
    """Whether a bound on a tuple's value rules it out against the K-th best plan.  Under
    cost-above-floor a tuple at the same price may still win on time: only a higher one goes."""
    cut = threshold * (1 - gap_rel)
    if spec.kind == "cost-above-floor" and gap_rel == 0:
        return bound > cut * (1 + 1e-12)
    return bound >= cut


def solve_tuple(milp, prob, knobs, spec, training, best, bounds, stats, settings, deadline, top_k, lb):
    stats["solved"] += 1
    tokens = training.global_batch_size * training.seq_len
    if spec.kind in ("throughput", "throughput-under-budget"):
        for j in range(top_k):
            cut = best.threshold()
            sol = milp.solve(settings, deadline=deadline, cutoff=cut if math.isfinite(cut) else None)
            if sol.status == "unknown":
                stats["timed_out"] = stats.get("timed_out", 0) + 1
            if j == 0 and sol.status != "infeasible":      # a proved-infeasible tuple bounds nothing
                bounds.append(max(lb, sol.bound) if sol.bound is not None else lb)
                if sol.status in ("feasible", "unknown"):
                    stats["milp_optimal"] = False
            if not sol.ok or sol.objective >= best.threshold():
                break
            best.add(Candidate.of(prob, sol.assign, sol.objective, knobs, spec))
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
                stats["milp_optimal"] = False
            return
        prob.budget_usd_per_hour = sol.objective * (1 + 1e-12)
        fast = exact_solver(prob).solve(settings, deadline=deadline)
        pick = fast if fast.ok else sol
        if pick.status != "optimal" or sol.status != "optimal":
            stats["milp_optimal"] = False
        best.add(Candidate.of(prob, pick.assign, prob.objective(pick.assign), knobs, spec))
        return
    # cost: walk the price/time Pareto front of this knob tuple from the fastest plan down in
    # price; a point can improve price x time only while (its time) x (cheapest price) < best.
    cheapest = milp.solve(settings, mode="price", deadline=deadline)
    if not cheapest.ok:
        if cheapest.status == "unknown":
            stats["milp_optimal"] = False
            bounds.append(lb)
        return
    pmin = cheapest.objective
    budget = None
    proved = cheapest.status == "optimal"
    while True:
        if time.monotonic() > deadline:      # the walk is cut short: not proved
            proved = False
            break
        prob.budget_usd_per_hour = budget
        # every plan here costs at least pmin: one beats the incumbent only below this time
        cut = best.threshold() / pmin if pmin > 0 else math.inf
        sol = exact_solver(prob).solve(settings, deadline=deadline, cutoff=cut if math.isfinite(cut) else None)
        if not sol.ok:
            if sol.status == "unknown":            # stopped by the deadline: not proved
                proved = False
            break      # infeasible, or no plan below the cutoff: the rest cannot win
        proved &= sol.status == "optimal"
        cand = Candidate.of(prob, sol.assign, sol.objective, knobs, spec)
        best.add(cand)
        price, t = cand.price_usd_per_hour, cand.time_s
        if t * pmin >= best.threshold() or price <= pmin:
            break
        budget = price * (1 - 1e-9)
    prob.budget_usd_per_hour = None
    if not proved:
        # the walk's plans stand; what it did not reach is bounded by the tuple's floor
        stats["milp_optimal"] = False
        bounds.append(lb)
