"""Rewrite a plan's schedule as a latency-aware one (``planner schedule --latency-aware``).

The plan's stages and devices stay; its one-stage-per-rank schedule (1F1B, GPipe, ZB-H1, or a
latency-aware plan to re-schedule) becomes ``latency-aware`` with ``pipeline_actions`` from the
greedy rule, or the exact MILP where asked and better.  Stage times are the cost model's with
the backward split into I and W (as for zb-h1); each boundary's send splits into the
topology's wire latency and the transfer.  "Before" is the input plan as the cost model prices
it (its closed form, sends blocking) and, like for like, its order under the latency model
(1F1B's B as I then W); "after" is the new plan's evaluation.

A split backward holds each block's weight-op gradients from I until W, which a whole backward
(B) frees as it goes; on a rank near its memory that alone can overflow, whatever the memory
cap (at cap 1 the one micro-batch between I and W still holds them).  Where the split order
does not fit, the ranks that overflow keep whole backwards and the order is made again
(``whole_backward_stages``): they lose W as filler, the other ranks keep it.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import InputError


@dataclass
class Rewrite:
    plan: object                         # the new Plan
    before: object                       # Evaluation of the input plan
    after: object                        # Evaluation of the new plan
    before_retimed_s: float              # the input order under the latency model
    greedy_s: float
    greedy_rule: str
    exact: object | None                 # latency_milp.ExactResult, with --exact
    method: str                          # which schedule the plan got: "greedy" or "exact"
    memory_cap: tuple[int, ...]
    problem: object                      # the latency.LatencyProblem the schedule was made for
    whole_backward_stages: tuple[int, ...] = ()   # ranks that run B, not I + W (module docstring)

    @property
    def over_memory_stages(self) -> set[int]:
        """The new plan's stages with a replica over its GPU's memory."""
        return over_memory_stages(self.plan, self.after)

    @property
    def gap(self) -> float | None:
        if self.exact is None or self.exact.bound_s <= 0:
            return None
        return (self.greedy_s - self.exact.bound_s) / self.exact.bound_s

    def to_json(self) -> dict:
        e = self.exact
        return {
            "before": {"schedule": self.before.schedule, "pipeline_time_s": self.before.pipeline_time_s,
                       "iteration_time_s": self.before.iteration_time_s,
                       "pipeline_time_latency_model_s": self.before_retimed_s},
            "after": {"schedule": "latency-aware", "pipeline_time_s": self.after.pipeline_time_s,
                      "iteration_time_s": self.after.iteration_time_s, "method": self.method,
                      "memory_cap": list(self.memory_cap),
                      "whole_backward_stages": list(self.whole_backward_stages)},
            "greedy": {"pipeline_time_s": self.greedy_s, "rule": self.greedy_rule},
            "exact": None if e is None else {"pipeline_time_s": e.makespan_s, "bound_s": e.bound_s,
                                             "status": e.status, "wall_s": e.wall_s},
            "gap": self.gap,
        }


def _baseline(plan):
    """The input plan's order as F / I / W lists (B as I then W), one chunk per rank."""
    from planner.simulate.actions import generate
    from planner.simulate.latency_greedy import one_f_one_b_split
    from planner.simulate.latency_plan import plan_schedule

    p, m = len(plan.stages), plan.num_micro_batches
    if plan.schedule == "latency-aware":
        return plan_schedule(plan)
    if plan.schedule == "1f1b":
        return one_f_one_b_split(p, m)
    return generate(plan.schedule, p, m)


def check_memory_cap(memory_cap) -> None:
    """``memory_cap`` is None (the plan's own peaks) or a whole number of micro-batches >= 1."""
    if memory_cap is None:
        return
    if not isinstance(memory_cap, int) or isinstance(memory_cap, bool):
        raise InputError(f"memory_cap (--memory-cap) must be a whole number of micro-batches >= 1 a rank may "
                         f"hold from F until W, or None for the plan's own peaks; got {memory_cap!r}")
    if memory_cap < 1:
        raise InputError(f"--memory-cap must be at least 1 micro-batch, got {memory_cap}")


def over_memory_stages(plan, evaluation) -> set[int]:
    """The stages with a replica whose predicted peak is over its GPU's memory."""
    peak, capacity = evaluation.peak_memory_bytes, evaluation.memory_capacity_bytes
    return {i for i, st in enumerate(plan.stages) for r in st.replicas
            if any(peak.get(d, 0.0) > capacity.get(d, float("inf")) for d in r.devices)}


def rewrite(cluster, plan, profiles=None, exact: bool = False, memory_cap: int | None = None,
            time_limit_s: float = 30.0, file: str = "<plan>") -> Rewrite:
    from planner.cost import evaluate
    from planner.cost.evaluate import topology_for
    from planner.plan.check import check_plan
    from planner.simulate.latency import peak_in_flight, retime
    from planner.simulate.latency_milp import MAX_ACTIONS
    from planner.simulate.latency_plan import boundary_latencies_s, problem_for_stages

    check_memory_cap(memory_cap)
    check_plan(cluster, plan, file=file)
    if plan.virtual_stages > 1 or plan.schedule == "bitpipe":
        # every schedule with chunks (interleaved-1f1b, zb-v, dualpipev, ...): zb-v passed the
        # check that named interleaved-1f1b only and crashed the retiming (found by
        # scripts/fuzz_plans.py); bitpipe's plan keeps virtual_stages 1 but its ranks run
        # four chunks each (two V pipelines), and crashed the same way (a review's find)
        chunks = 4 if plan.schedule == "bitpipe" else plan.virtual_stages
        raise InputError(f"{file}: schedule {plan.schedule} runs {chunks} chunks per rank; the "
                         "latency-aware scheduler orders one stage per rank (use a 1f1b, gpipe or zb-h1 plan)")
    p, m = len(plan.stages), plan.num_micro_batches
    if p == 1:
        # one rank, no boundary: nothing to hide (it ended in a memory error that named no cause)
        raise InputError(f"{file}: a one-stage plan has no pipeline sends to hide; the latency-aware "
                         "scheduler orders the work of a pipeline of two or more stages")
    if exact and 3 * p * m > MAX_ACTIONS:
        raise InputError(f"--exact solves at most {MAX_ACTIONS} actions (3 x stages x micro-batches); this "
                         f"plan has {p} stages x {m} micro-batches = {3 * p * m}: drop --exact for the greedy")
    before = evaluate(cluster, plan, profiles=profiles, check=False)
    # the same stages priced with the backward split into I and W (the split is zb-h1's)
    split = evaluate(cluster, plan.model_copy(update={"schedule": "zb-h1", "pipeline_actions": None}),
                     profiles=profiles, check=False)
    if memory_cap is None:
        # per rank, the plan's own peak in flight, at most 1F1B's min(m, p): one cap of min(m, p)
        # for every rank let the last stages of a 1F1B plan (peak p - s) hold up to p micro-batches,
        # and the rewritten plan of a plan that fit ran out of memory (scripts/fuzz_plans.py:
        # 18 of 247 rewrites); --memory-cap N still trades memory for hidden latency
        memory_cap = [min(m, p, peak) for peak in peak_in_flight(_baseline(plan))]
    problem = problem_for_stages(split.stages, m, boundary_latencies_s(topology_for(cluster), plan), memory_cap)
    base_s = retime(problem, _baseline(plan), check=False).makespan_s   # the evaluator ignores the cap
    whole: set[int] = set()
    while True:
        res = _schedule(cluster, plan, profiles, problem, whole, exact, time_limit_s, file)
        # a rank the split order overflows keeps whole backwards (module docstring); one that
        # overflows with them too is over on its in-flight activations, which the cap governs
        grow = over_memory_stages(plan, res.after) - whole
        if res.after.fits or not grow:
            break
        whole |= grow
    return Rewrite(res.plan, before, res.after, base_s, res.greedy_s, res.greedy_rule, res.exact, res.method,
                   problem.memory_cap, problem, tuple(sorted(whole)))


@dataclass
class _Scheduled:
    plan: object
    after: object
    greedy_s: float
    greedy_rule: str
    exact: object | None
    method: str


def _schedule(cluster, plan, profiles, problem, whole: set[int], exact: bool, time_limit_s: float,
              file: str) -> _Scheduled:
    """The greedy's (or the MILP's, where better) order for ``problem`` with ``whole`` ranks
    running B, written into a copy of ``plan`` and evaluated."""
    from dataclasses import replace

    from planner.cost import evaluate
    from planner.plan.check import check_plan
    from planner.simulate.latency import whole_backwards, with_whole_backwards
    from planner.simulate.latency_greedy import greedy
    from planner.simulate.latency_milp import exact as solve_exact
    from planner.simulate.latency_plan import actions_to_json

    solved = with_whole_backwards(problem, whole)
    g = greedy(solved)
    sched, method, ex = g.schedule, "greedy", None
    if exact:
        ex = solve_exact(solved, g.makespan_s, time_limit_s)
        if ex.schedule is not None and ex.makespan_s < g.makespan_s - 1e-12:
            sched, method = ex.schedule, "exact"
        if ex.schedule is not None:
            ex = replace(ex, schedule=whole_backwards(ex.schedule, whole))
    sched = whole_backwards(sched, whole)
    new = plan.model_copy(update={"schedule": "latency-aware", "virtual_stages": 1,
                                  "pipeline_actions": actions_to_json(sched), "predicted": None})
    check_plan(cluster, new, file=file)
    after = evaluate(cluster, new, profiles=profiles, check=False)
    new = new.model_copy(update={"predicted": after.predicted()})
    return _Scheduled(new, after, g.makespan_s, g.rule, ex, method)
