"""Turning a plan into launcher inputs (DESIGN §1: launch): torchrun commands, Megatron-LM
arguments, a DeepSpeed config with stage boundaries, a torch.distributed.pipelining layout, or a
torchtitan job-config fragment.

    from planner.launch import render, write
    files = render(plan, "megatron", master_addr="10.0.0.1")   # {file name: text}
    write(files, "launch/", replace_launch=True)                # all files or none

``replace_launch`` also removes an earlier launch's files in the folder that this one does not
overwrite, as long as they are what the planner wrote (planner.launch.output).

A format that cannot express a plan refuses it with an ``InputError`` naming the stage and the
feature; a launch never changes the plan.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.errors import InputError, InputErrors
from planner.launch import deepspeed, megatron, pipelining, torchrun, torchtitan
from planner.launch.common import DEFAULT_MASTER_PORT, LaunchOptions
from planner.launch.output import record_files, write
from planner.plan import Plan

# format name -> writer(plan, options, cluster) -> {file name: text}
FORMATS: dict[str, Callable[..., dict[str, str]]] = {
    "torchrun": torchrun.render,
    "megatron": megatron.render,
    "deepspeed": deepspeed.render,
    "pipelining": pipelining.render,
    "torchtitan": torchtitan.render,
}

CSV_FORMATS = ("pipelining", "torchtitan")  # formats that can run a schedule from its action CSV

__all__ = ["DEFAULT_MASTER_PORT", "FORMATS", "LaunchOptions", "render", "write"]


def render(plan: Plan, fmt: str, master_addr: str | None = None,
           master_port: int = DEFAULT_MASTER_PORT, script: str | None = None,
           cluster=None, schedule_csv: bool = False, file: str | None = None) -> dict[str, str]:
    """The files that launch ``plan`` with ``fmt``, by name; nothing is written.

    ``cluster`` (optional) tells how many GPUs each node has, so CUDA_VISIBLE_DEVICES is set
    exactly when a node's GPUs are used only in part, and lets the shared rank map be used;
    the plan is then checked against it as ``planner evaluate`` checks it
    (``planner.plan.check.check_plan``: devices, each replica's GPU type against its node,
    bf16 support), errors naming ``file`` (or ``<plan>``) and the field.
    ``schedule_csv`` runs the schedule from its per-rank action CSV even where torch has a class
    (formats that run torch's pipelining: pipelining, torchtitan).  ``file``: the plan's file,
    so that a plan edited into a broken layout is refused naming it (the writers' own layout
    check names ``<plan>``: a hand-edited plan's errors did not say which file was wrong).
    The rank map lists the other files with their SHA-256 (``output.record_files``)."""
    writer = FORMATS.get(fmt)
    if writer is None:
        raise InputError(f"launch: unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if schedule_csv and fmt not in CSV_FORMATS:
        raise InputError(f"launch: --schedule-csv applies to {' and '.join(CSV_FORMATS)}, not {fmt} "
                         "(which does not run torch's pipeline schedules)")
    gpus = None
    if cluster is not None:
        from planner.plan.check import check_plan

        gpus = {n.name: n.gpus_per_node for n in cluster.node_list}
        _check_devices_exist(plan, gpus)
        # what `planner evaluate` checks: check_layout's checks, and each replica's GPU type
        # against its node (an H100 replica on an A100 node was launched, rc 0)
        check_plan(cluster, plan, file=file or "<plan>")
    elif file is not None:
        from planner.plan.check import check_layout

        check_layout(plan, file=file)
    opts = LaunchOptions(master_addr=master_addr, master_port=master_port, script=script,
                         gpus_per_node=gpus, schedule_csv=schedule_csv)
    return record_files(writer(plan, opts, cluster=cluster))


def _check_devices_exist(plan: Plan, gpus_per_node: dict[str, int]) -> None:
    """Every device of the plan on a node of the cluster, every problem listed at once (a plan
    for another cluster misses several nodes: naming one at a time took as many runs)."""
    problems = [InputError(p) for p in _missing_devices(plan, gpus_per_node)]
    if problems:
        raise problems[0] if len(problems) == 1 else InputErrors(problems)


def _missing_devices(plan: Plan, gpus_per_node: dict[str, int]) -> list[str]:
    out = []
    for s in plan.stages:
        for j, r in enumerate(s.replicas):
            for d in r.devices:
                node, _, idx = d.rpartition(":")
                if node not in gpus_per_node:
                    out.append(f"launch: stage {s.index} replica {j} uses {d}, but the cluster "
                               f"has no node {node!r} (nodes: {', '.join(sorted(gpus_per_node))})")
                elif int(idx) >= gpus_per_node[node]:
                    out.append(f"launch: stage {s.index} replica {j} uses {d}, but {node} has "
                               f"{gpus_per_node[node]} GPUs (indices 0..{gpus_per_node[node] - 1})")
    return out
