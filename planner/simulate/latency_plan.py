"""The latency-aware schedule in a plan: its action lists (``pipeline_actions``), and the latency
problem of a priced plan (stage times from planner.cost, link latencies from the topology).

``pipeline_actions`` holds, per stage (one stage per rank), the actions as ``Action`` writes
them: ``"F0.3"`` is the forward of chunk 0 on micro-batch 3; ``I`` and ``W`` the backward's
input- and weight-gradient halves, ``B`` a whole backward (a rank where the split's held
weight-op gradients would not fit memory: planner.simulate.latency_rewrite).  The plan carries the lists so that launchers run exactly
what was scheduled and the cost model prices that order, not a regenerated one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from planner.simulate.actions import Action, Schedule
from planner.simulate.latency import SCHEDULE_NAME, LatencyProblem, make_problem

_ACTION = re.compile(r"^(?P<kind>[FBIW])(?P<chunk>0|[1-9][0-9]*)\.(?P<mb>0|[1-9][0-9]*)$")


def parse_action(text: str) -> Action:
    """``"F0.3"`` -> ``Action("F", 0, 3)``; ``ValueError`` saying the form otherwise."""
    m = _ACTION.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{text!r} is not an action '<F|B|I|W><chunk>.<micro-batch>' such as 'F0.3'")
    return Action(m["kind"], int(m["chunk"]), int(m["mb"]))


def schedule_from_actions(lists: Sequence[Sequence[str]], num_micro_batches: int) -> Schedule:
    """A one-chunk ``Schedule`` from per-rank action strings (not validated here)."""
    ranks = tuple(tuple(parse_action(t) for t in acts) for acts in lists)
    return Schedule(SCHEDULE_NAME, len(ranks), 1, num_micro_batches, "loop", ranks)


def actions_to_json(sched: Schedule) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(str(a) for a in acts) for acts in sched.ranks)


def plan_schedule(plan) -> Schedule:
    """The plan's ``pipeline_actions`` as a ``Schedule`` (the plan is checked already)."""
    return schedule_from_actions(plan.pipeline_actions, plan.num_micro_batches)


def boundary_latencies_s(topo, plan) -> list[float]:
    """Per stage boundary, the largest wire latency between a replica of one stage and a replica
    of the next (planner.topology's path latency: the part of a send that does not shrink
    with bandwidth; the rest of the cost model's send time is the transfer)."""
    out = []
    for a, b in zip(plan.stages, plan.stages[1:]):
        out.append(max(topo.p2p(ra.devices[0], rb.devices[0]).latency_s
                       for ra in a.replicas for rb in b.replicas))
    return out


def problem_for_stages(stage_timings, num_micro_batches: int, latencies_s: Sequence[float],
                       memory_cap: int | Sequence[int] | None = None) -> LatencyProblem:
    """The latency problem of priced stages (planner.cost ``StageTiming``: I = backward - W,
    W = ``backward_weight_s``; sends latency + transfer)."""
    from planner.simulate.plan import zb_stage_times

    return make_problem(zb_stage_times(stage_timings), num_micro_batches, latencies_s, memory_cap)


def plan_run(stage_timings, plan, topo):
    """The plan's ``pipeline_actions`` re-timed under the latency model on priced stages (what
    the cost model prices and ``planner simulate`` shows): an ``actions.Execution``."""
    from planner.simulate.latency import peak_in_flight, retime

    sched = plan_schedule(plan)
    problem = problem_for_stages(stage_timings, plan.num_micro_batches, boundary_latencies_s(topo, plan),
                                 memory_cap=peak_in_flight(sched))
    return retime(problem, sched, check=False)
