"""Pricing a latency-aware plan (issue 17, CrossPipe): its pipeline time is the plan's own
action lists (``pipeline_actions``) re-timed under planner.simulate.latency's model on the
priced stage times, with each boundary's send split into the path's wire latency (posted,
not waited on) and the transfer (serialised on the directed link); its activation memory is
each rank's peak of micro-batches held from F until W in those lists.

There is no closed form: the order is whatever the scheduler chose, so the evaluator is the
price.  The breakdown keeps the bottleneck stage's compute, recompute and TP terms; sends run
beside compute, so ``pp_comm`` is 0 and whatever the links leave exposed is ``bubble``.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.schedule import StageTiming, bottleneck_stage, breakdown_keys
from planner.errors import InputError


@dataclass
class LatencyAwarePrice:
    pipeline_time_s: float
    peak_in_flight: list[int]
    # per rank, the most micro-batches waiting for their W; taken with the in-flight peak
    # though the two may fall at different points of the list (memory errs high, never low)
    peak_waiting_w: list[int]


def price_actions(stage_timings: list[StageTiming], plan, topo) -> LatencyAwarePrice:
    from planner.simulate.latency_plan import plan_run

    if plan.pipeline_actions is None:   # evaluate(check=False) skips planner.plan.check's word on it
        raise InputError("schedule latency-aware needs pipeline_actions (per stage, its ordered "
                         "actions); `planner schedule CLUSTER PLAN --latency-aware` writes them")
    from planner.simulate.latency import peak_waiting_w
    run = plan_run(stage_timings, plan, topo)
    return LatencyAwarePrice(run.makespan_s, list(run.peak_in_flight), peak_waiting_w(run.schedule))


def breakdown(stage_timings: list[StageTiming], num_micro_batches: int, pipeline_s: float) -> dict[str, float]:
    """The seven terms (they sum to the iteration time), the pipeline time given."""
    m = num_micro_batches
    s = stage_timings[bottleneck_stage(stage_timings)]
    out = {"compute": m * s.compute_s, "recompute": m * s.recompute_s, "tp_comm": m * s.tp_comm_s,
           "pp_comm": 0.0}
    if any(st.ep_comm_s for st in stage_timings):
        out["ep_comm"] = m * s.ep_comm_s
    out["bubble"] = max(0.0, pipeline_s - sum(out.values()))
    out["dp_sync_exposed"] = max((st.dp_sync_exposed_s for st in stage_timings), default=0.0)
    out["optimizer"] = max((st.optimizer_s for st in stage_timings), default=0.0)
    return {key: out[key] for key in breakdown_keys(out)}
