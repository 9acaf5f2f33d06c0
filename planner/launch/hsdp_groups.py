"""Which ranks share ZeRO shards and which replicate them, for the reference runner's HSDP
(``zero_shard_degree`` d; planner/cost/hsdp.py prices the same layout).

A stage's n plan replicas, each ``tp x cp`` ranks (tp innermost, the plan's device order), form
n/d groups of d consecutive replicas. Per tp position, a group's d x cp ranks are one *shard
group*: ZeRO's reduce and gathers run inside it, each member owning one shard of the stage's
flat parameters (the member's place in the group, counted in rank order, as torch.distributed
orders a group's members). The ranks owning the same shard, one in each group, are one
*replicate group*: they all-reduce that shard's gradient, as FSDP2's HSDP all-reduces over the
replicate dimension of its (replicate, shard) mesh after the reduce-scatter over the shard one.
Without ``zero_shard_degree`` (d = n) there is one shard group per tp position, the stage's
whole data-parallel group, and every replicate group is a single rank.

``zero_groups`` is pure membership (tests/test_hsdp_groups.py); ``make_zero_groups`` creates
the process groups from it in a worker, importing torch only there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ZeroGroups:
    """One stage's ZeRO groups: ``shard[i]`` and ``replicate[j]`` are sorted global ranks."""

    shard: tuple[tuple[int, ...], ...]
    replicate: tuple[tuple[int, ...], ...]

    def shard_of(self, rank: int) -> tuple[int, ...] | None:
        return next((g for g in self.shard if rank in g), None)

    def replicate_of(self, rank: int) -> tuple[int, ...] | None:
        return next((g for g in self.replicate if rank in g), None)


def zero_groups(replica_ranks: list[list[int]], cp: int, shard_degree: int | None) -> ZeroGroups:
    """The shard and replicate groups of a stage whose plan replica j runs on the ranks
    ``replica_ranks[j]`` (tp x cp of them, tp innermost); ``shard_degree`` None means all."""
    n = len(replica_ranks)
    d = n if shard_degree is None else shard_degree
    if d < 1 or n % d:
        raise ValueError(f"zero_shard_degree {d} does not divide the stage's {n} replicas")
    widths = {len(r) for r in replica_ranks}
    if len(widths) != 1 or widths.pop() % cp:
        raise ValueError("every replica of the stage needs the same tp x cp ranks")
    tp = len(replica_ranks[0]) // cp
    shard = []
    for t in range(tp):   # the groups of one tp position hold the same slice of the weights
        for g in range(n // d):
            shard.append(tuple(sorted(rep[c * tp + t] for rep in replica_ranks[g * d:(g + 1) * d]
                                      for c in range(cp))))
    groups = n // d
    replicate = [tuple(sorted(shard[t * groups + g][k] for g in range(groups)))
                 for t in range(tp) for k in range(d * cp)]
    return ZeroGroups(tuple(shard), tuple(replicate))


def make_zero_groups(stages_replica_ranks: list[list[list[int]]], cp: int, shard_degree: int,
                     rank: int):
    """Create every stage's shard and replicate process groups of more than one rank, in the
    same order on every rank (torch.distributed requires it); returns ``rank`` 's (shard group
    members, shard group, replicate group), a group None where it would be ``rank`` alone."""
    import torch.distributed as dist

    members = shard = replicate = None
    for replica_ranks in stages_replica_ranks:
        groups = zero_groups(replica_ranks, cp, shard_degree)
        for ranks in groups.shard:
            g = dist.new_group(list(ranks)) if len(ranks) > 1 else None
            if rank in ranks:
                members, shard = ranks, g
        for ranks in groups.replicate:
            g = dist.new_group(list(ranks)) if len(ranks) > 1 else None
            if rank in ranks:
                replicate = g
    return members, shard, replicate
