"""Exact latency-aware schedule: a disjunctive MILP (pulp + HiGHS) for small cases.

Variables: a start time per action (F, I, W of each micro-batch on each rank), a leave time
per send on a link, the makespan C, and one order binary per pair of actions on a rank.
Constraints, the model of planner.simulate.latency exactly:

- dependencies: F(r, j) after F(r-1, j)'s activation arrives; I(r, j) after F(r, j) and after
  I(r+1, j)'s gradient arrives; W(r, j) after I(r, j);
- a send leaves after its action ends and, on one directed link, ``transfer_s`` after the
  previous send in the sender's order (the same binary that orders the two actions); it
  arrives ``latency_s`` after it has left the link;
- one action at a time per rank (big-M disjunctions, M = the greedy's makespan, which also
  caps C: the greedy order is a feasible point);
- memory: when F(r, j) starts, the micro-batches with F before it and W not before it are at
  most cap - 1 (a sum of order binaries).

Symmetry: micro-batches are interchangeable, so rank 0's forwards are fixed in micro-batch
order (any schedule relabelled by rank 0's forward order is one of these).  A valid cut per
rank, C >= (earliest first input) + (the rank's total work), tightens the relaxation.

The order read back from the start times is re-timed by ``latency.retime``; at a proved optimum
that equals the objective (the evaluator starts each action as early as the order allows, and
the MILP's optimum leaves nothing to shift).  ``bound_s`` is HiGHS's proved lower bound.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from itertools import combinations

import pulp

from planner.simulate.actions import Action, Schedule
from planner.simulate.latency import SCHEDULE_NAME, LatencyProblem, lower_bound_s, retime

MAX_ACTIONS = 120          # 3 p m: p = 4, m = 10 at most; beyond it the greedy is the tool


@dataclass
class ExactResult:
    schedule: Schedule | None
    makespan_s: float | None     # the evaluator on the MILP's order
    objective_s: float | None    # the MILP's own C
    bound_s: float               # proved lower bound on every schedule under the model
    status: str                  # "optimal", "feasible" (time limit) or "no-solution"
    wall_s: float


def _dual_bound(model) -> float:
    """HiGHS's proved lower bound, NaN where the solver gives none (an older highspy)."""
    try:
        return float(model.getInfo().mip_dual_bound) if model is not None else math.nan
    except Exception:  # noqa: BLE001 - no info: the analytic bound stands
        return math.nan


def _highs(time_limit_s: float):
    return pulp.HiGHS(msg=False, timeLimit=max(0.1, time_limit_s), gapRel=0.0, threads=1,
                      mip_abs_gap=1e-9, mip_feasibility_tolerance=1e-9, primal_feasibility_tolerance=1e-9)


def exact(problem: LatencyProblem, upper_bound_s: float, time_limit_s: float = 30.0) -> ExactResult:
    """Minimise the makespan.  ``upper_bound_s``: a makespan some schedule reaches (the
    greedy's), used as big-M and as a cap on C."""
    with warnings.catch_warnings():   # pulp 3.3 warns that LpVariable(...) changes in pulp 4 (pinned < 4)
        warnings.simplefilter("ignore", DeprecationWarning)
        return _exact(problem, upper_bound_s, time_limit_s)


def _exact(problem: LatencyProblem, upper_bound_s: float, time_limit_s: float) -> ExactResult:
    from planner.search.core.guard import solver_output_silenced

    p, m, st = problem.num_ranks, problem.num_micro_batches, problem.stages
    if 3 * p * m > MAX_ACTIONS:
        raise ValueError(f"the exact solver takes at most {MAX_ACTIONS} actions (3 p m); "
                         f"p = {p}, m = {m} has {3 * p * m}: use the greedy")
    t0 = time.monotonic()
    big = upper_bound_s * (1 + 1e-6) + 1e-9
    lp = pulp.LpProblem("latency_aware", pulp.LpMinimize)
    acts = [[(k, j) for j in range(m) for k in "FIW"] for _ in range(p)]
    S = {(r, k, j): pulp.LpVariable(f"s_{r}_{k}_{j}", 0, big) for r in range(p) for k, j in acts[r]}
    C = pulp.LpVariable("C", lower_bound_s(problem), big)
    lp += C
    dur = {(r, k): st[r].duration_s(k) for r in range(p) for k in "FIW"}

    def end(r, k, j):
        return S[r, k, j] + dur[r, k]

    # order binaries: before[(r, a, b)] is an expression, 1 when a runs before b on rank r
    before: dict = {}
    for r in range(p):
        for a, b in combinations(acts[r], 2):
            fixed = None
            if a[1] == b[1]:           # same micro-batch: F < I < W by dependency
                fixed = "FIW".index(a[0]) < "FIW".index(b[0])
            elif r == 0 and a[0] == b[0] == "F":
                fixed = a[1] < b[1]    # symmetry: rank 0's forwards in micro-batch order
            if fixed is None:
                y = pulp.LpVariable(f"y_{r}_{a[0]}{a[1]}_{b[0]}{b[1]}", cat="Binary")
                before[r, a, b], before[r, b, a] = y, 1 - y
                lp += S[(r, *b)] >= end(r, *a) - big * (1 - y)
                lp += S[(r, *a)] >= end(r, *b) - big * y
            else:
                before[r, a, b], before[r, b, a] = int(fixed), int(not fixed)
                first, second = (a, b) if fixed else (b, a)
                lp += S[(r, *second)] >= end(r, *first)

    # sends: leave time per (link, mb); arrival = leave + transfer + latency
    arrival = {}
    for r in range(p):
        for kind in ("F", "I"):
            key = problem.send_link(r, kind)
            if key is None:
                continue
            link = problem.link(key)
            if link.transfer_s > 0:
                leave = {j: pulp.LpVariable(f"l_{r}_{kind}_{j}", 0, big) for j in range(m)}
                for j in range(m):
                    lp += leave[j] >= end(r, kind, j)
                    arrival[r, kind, j] = leave[j] + link.transfer_s + link.latency_s
                for j, k in combinations(range(m), 2):
                    y = before[r, (kind, j), (kind, k)]
                    lp += leave[k] >= leave[j] + link.transfer_s - big * (1 - y)
                    lp += leave[j] >= leave[k] + link.transfer_s - big * y
            else:
                for j in range(m):
                    arrival[r, kind, j] = end(r, kind, j) + link.latency_s

    for r in range(p):
        for j in range(m):
            if r > 0:
                lp += S[r, "F", j] >= arrival[r - 1, "F", j]
            if r < p - 1:
                lp += S[r, "I", j] >= arrival[r + 1, "I", j]
            lp += C >= end(r, "W", j)
            lp += C >= end(r, "I", j)
        # memory cap at each forward's start
        for j in range(m):
            held = [before[r, ("F", k), ("F", j)] - before[r, ("W", k), ("F", j)] for k in range(m) if k != j]
            if held:
                lp += pulp.lpSum(held) <= problem.memory_cap[r] - 1

    # cut: nothing on rank r starts before its first activation can arrive
    head = 0.0
    for r in range(p):
        work = sum(dur[r, k] for k in "FIW") * m
        for k, j in acts[r]:
            lp += S[r, k, j] >= head
        lp += C >= head + work
        head += st[r].forward_s + (problem.forward[r].total_s if r < p - 1 else 0.0)

    with solver_output_silenced():
        lp.solve(_highs(time_limit_s))
    wall = time.monotonic() - t0
    info = getattr(lp, "solverModel", None)
    bound = lower_bound_s(problem)
    dual = _dual_bound(info)
    if math.isfinite(dual):
        bound = max(bound, dual)
    if lp.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible) or C.varValue is None:
        return ExactResult(None, None, None, bound, "no-solution", wall)
    optimal = lp.sol_status == pulp.LpSolutionOptimal
    lists = []
    for r in range(p):
        # order by start; among equal starts (zero-length actions) by how many precede it
        def rank_key(a, r=r):
            preds = sum(pulp.value(before[r, b, a]) for b in acts[r] if b != a)
            return (round(S[(r, *a)].varValue, 9), preds)
        lists.append(tuple(Action(k, 0, j) for k, j in sorted(acts[r], key=rank_key)))
    sched = Schedule(SCHEDULE_NAME, p, 1, m, "loop", tuple(lists))
    run = retime(problem, sched)
    objective = float(C.varValue)
    if optimal:
        bound = max(bound, min(objective, run.makespan_s))
    return ExactResult(sched, run.makespan_s, objective, bound, "optimal" if optimal else "feasible", wall)
