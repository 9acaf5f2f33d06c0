"""Context parallelism in the reference runner's workers (``planner.launch.worker``): a plan
replica of ``tp x cp`` ranks (tp innermost, then cp, the plan's device order) is run as ``cp``
replicas of its tp ranks over the same samples, each holding ``tiny_model.cp_positions`` of
every sequence; per tp position the replica's cp ranks form the group that gathers K/V."""

from __future__ import annotations

import torch.distributed as dist


def expand_cp(stages: list[dict], cp: int) -> None:
    """Each plan replica becomes ``cp`` replicas of its tp ranks, marked with their cp rank
    (``cp``) and their plan replica (``plan_replica``); shares and sample offsets stay."""
    for s in stages:
        subs = []
        for j, rep in enumerate(s["replicas"]):
            tp = len(rep["ranks"]) // cp
            subs += [dict(rep, ranks=rep["ranks"][c * tp:(c + 1) * tp], cp=c, plan_replica=j)
                     for c in range(cp)]
        s["replicas"] = subs


def cp_groups(stages: list[dict], rank: int):
    """Create every K/V group (per stage, plan replica and tp position: its cp ranks), in the
    same order on every rank as torch.distributed requires; returns ``rank`` 's."""
    mine = None
    for s in stages:
        for j in sorted({rep["plan_replica"] for rep in s["replicas"]}):
            subs = [rep for rep in s["replicas"] if rep["plan_replica"] == j]
            for t in range(len(subs[0]["ranks"])):
                members = [rep["ranks"][t] for rep in subs]
                g = dist.new_group(members)
                if rank in members:
                    mine = g
    return mine


def peers_of(stage: dict, cp_rank: int) -> tuple[list[int], list[dict]]:
    """The stage's replicas holding cp rank ``cp_rank`` 's part of the sequences (all of them
    without context parallelism): their indices and themselves; activations travel only
    between these."""
    reps = stage["replicas"]
    idx = [j for j, r in enumerate(reps) if r.get("cp", 0) == cp_rank]
    return idx, [reps[j] for j in idx]
