"""Pipeline time of the V-shaped schedules (ZB-V, DualPipeV) from the action-list executor.

They have no closed form for stages of unequal speed: the pipeline time is the makespan of
planner.simulate.zero_bubble's lists (torch's own orders) run by planner.simulate.actions'
executor on the plan's chunk times, so the cost model and ``planner simulate`` agree exactly.
One run walks 6 p m actions (p = 32, m = 64: about 0.7 s of executor time on one core, after a
one-off 0.5 s to build and validate the lists, which are memoised per (schedule, p, m));
makespans are memoised by the stage timings, since a table or a search prices the same stages
many times.
"""

from __future__ import annotations

from functools import lru_cache

from planner.plan.model import V_SCHEDULES

__all__ = ["V_SCHEDULES", "v_schedule_time_s"]


def _key(st) -> tuple[float, ...]:
    return (float(st.forward_s), float(st.backward_s), float(getattr(st, "backward_weight_s", 0.0) or 0.0),
            float(st.send_forward_s), float(st.send_backward_s))


@lru_cache(maxsize=64)
def _lists(schedule: str, num_ranks: int, num_micro_batches: int):
    """The generated, validated lists: the same for every timing of one (schedule, p, m)."""
    from planner.simulate.actions import generate

    return generate(schedule, num_ranks, num_micro_batches, 2)


@lru_cache(maxsize=4096)
def _makespan_s(schedule: str, num_micro_batches: int, stages: tuple[tuple[float, ...], ...]) -> float:
    from types import SimpleNamespace

    from planner.simulate.actions import execute
    from planner.simulate.zero_bubble import v_stage_times

    timings = [SimpleNamespace(forward_s=f, backward_s=b, backward_weight_s=w, send_forward_s=sf,
                               send_backward_s=sb) for f, b, w, sf, sb in stages]
    return execute(_lists(schedule, len(stages), num_micro_batches), v_stage_times(timings),
                   check=False).makespan_s


def v_schedule_time_s(stages, num_micro_batches: int, schedule: str) -> float:
    """Makespan of ``schedule`` (zb-v or dualpipev) on per-rank timings (cost StageTiming)."""
    return _makespan_s(schedule, num_micro_batches, tuple(_key(st) for st in stages))
