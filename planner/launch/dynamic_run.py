"""What ``run_plan`` needs for measuring and dynamic batching: the checks before any process
starts, and the worker config entries (read by ``planner.launch.measure_worker``). Torch-free."""

from __future__ import annotations

from dataclasses import asdict, replace

from planner.errors import InputError
from planner.launch.dynamic import ControllerSettings


def settings_for(plan, **overrides) -> ControllerSettings:
    """The controller settings of ``plan``: its ``dynamic_shares`` bounds when it has them,
    then ``overrides`` (those not None)."""
    st = ControllerSettings()
    if plan.dynamic_shares is not None:
        d = plan.dynamic_shares
        st = replace(st, min_share=d.min_share, max_step_fraction=d.max_step_fraction, dead_band=d.dead_band)
    return replace(st, **{k: v for k, v in overrides.items() if v is not None})


def check_dynamic(plan, dynamic: ControllerSettings | None, slowdown: dict | None, world: int) -> None:
    problems = []
    if dynamic is not None:
        stages = [s for s in plan.stages if len(s.replicas) > 1]
        if not stages:
            problems.append("--dynamic-batching: no stage of this plan has more than one replica, "
                            "so there are no shares to move")
        for s in stages:
            for p in dynamic.check(plan.micro_batch_size, len(s.replicas)):
                problems.append(f"dynamic batching, stage {s.index}: {p}")
            for j, r in enumerate(s.replicas):
                if r.micro_batch_share < dynamic.min_share:
                    problems.append(f"stages[{s.index}].replicas[{j}].micro_batch_share: "
                                    f"{r.micro_batch_share} is below dynamic_shares.min_share "
                                    f"{dynamic.min_share}")
    for rank, factor in (slowdown or {}).items():
        if not (isinstance(rank, int) and 0 <= rank < world):
            problems.append(f"slowdown: rank {rank!r} is not one of 0..{world - 1}")
        if not factor >= 1.0:
            problems.append(f"slowdown: rank {rank}'s factor must be at least 1, got {factor}")
    if problems:
        raise InputError("cannot run this plan:\n  " + "\n  ".join(problems))


def dynamic_config(measure: bool, dynamic: ControllerSettings | None, slowdown: dict | None) -> dict:
    cfg = {}
    if measure or dynamic is not None:
        cfg["measure"] = True
    if dynamic is not None:
        cfg["dynamic"] = asdict(dynamic)
    if slowdown:
        cfg["slowdown"] = {str(k): float(v) for k, v in slowdown.items()}
    return cfg
