"""Devices are named only at the end: class counts per stage -> concrete device ids.

Stages take their class's nodes in stage order (whole nodes in a class of several nodes,
consecutive GPU slices of the one node otherwise) and pack their replicas node by node, each
replica's ``tp`` GPUs inside one node.  Every pure stage lives in one class, hence one zone; the
replicas of a stage sit on as few nodes as their TP allows.  A mixed stage (mixed.py) takes
its kind a replicas from kind a's class, then kind b's from kind b's, both in one zone.  This
is the packing that ``classes.ClassInfo.replica_devices`` assumes when the search prices a
stage.
"""

from __future__ import annotations

from planner.plan import Plan
from planner.plan.model import Objective, PlanInputs, Replica, Stage
from planner.search.classes import ClassInfo
from planner.search.knobs import Knobs, OptionKey
from planner.search.mixed import MixedKey, key_of
from planner.search.space import shares


def name_stages(classes: list[ClassInfo], knobs: Knobs,
                layout: list[tuple[OptionKey, int]]) -> list[Stage]:
    """``layout``: per stage (option, blocks).  Returns plan stages with devices named."""
    next_node = {c.index: 0 for c in classes}
    next_gpu = {c.index: 0 for c in classes}
    stages, first = [], 0
    p = len(layout)

    def take(cls: int, tp: int, count: int) -> list[tuple[str, ...]]:
        info = classes[cls]
        if info.shared_node:
            devs = info.replica_devices(tp, count, first_gpu=next_gpu[cls])
            next_gpu[cls] += tp * count
        else:
            devs = info.replica_devices(tp, count, first_node=next_node[cls])
            next_node[cls] += info.units(tp, count)
        return devs

    for s, (key, nb) in enumerate(layout):
        key = key_of(key)
        if isinstance(key, MixedKey):
            reps = tuple(Replica(gpu_type=classes[k.cls].gpu.name, tp=k.tp, micro_batch_share=k.share, devices=d)
                         for k in key.kinds for d in take(k.cls, k.tp, k.replicas))
        else:
            info = classes[key.cls]
            devs = take(key.cls, key.width, key.replicas)      # tp x cp GPUs each
            reps = tuple(Replica(gpu_type=info.gpu.name, tp=key.tp, micro_batch_share=q, devices=d)
                         for q, d in zip(shares(knobs.micro_batch_size, key.replicas), devs))
        stages.append(Stage(index=s, blocks=(first, first + nb), embedding=s == 0, head=s == p - 1,
                            replicas=reps))
        first += nb
    return stages


def build_plan(cluster, model, training, classes, knobs: Knobs, layout, objective: Objective) -> Plan:
    return Plan(
        inputs=PlanInputs(cluster=cluster.name, cluster_sha256=cluster.sha256(), model=model.to_mapping(),
                          training=training.io_mapping()),
        objective=objective, micro_batch_size=knobs.micro_batch_size,
        num_micro_batches=knobs.num_micro_batches, schedule=knobs.schedule,
        virtual_stages=knobs.virtual_stages, recompute=knobs.recompute, zero_stage=knobs.zero_stage,
        reshard_after_forward=knobs.reshard_after_forward if knobs.zero_stage == 3 else None,
        zero_shard_degree=knobs.zero_shard_degree if knobs.zero_stage >= 1 else None,
        sequence_parallel=bool(training.sequence_parallel), context_parallel=knobs.context_parallel,
        expert_parallel=knobs.expert_parallel,
        stages=tuple(name_stages(classes, knobs, layout)))
