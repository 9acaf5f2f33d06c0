"""HSDP (hybrid sharded data parallelism): ZeRO inside groups of replicas, replication across.

A stage's n replicas form n/d groups of ``zero_shard_degree`` = d consecutive replicas; the
ZeRO-1/2/3 shards span one group's d x cp GPUs (per TP rank) and every group holds a whole
copy.  Per gradient reduction each group reduce-scatters its gradients over its own ring (the
ZeRO collectives of ``comm.dp_sync_time_s``, with its all-gathers, over d x cp ranks), then the
d x cp holders of the same shard, one in each group, all-reduce that 1/(d cp) shard across the
n/d groups.  Sources:
- FSDP2 on a 2-D (replicate, shard) device mesh: the post-backward reduce-scatters over the
  shard dimension then all-reduces over the replicate dimension, each time gradients are
  reduced, so once per micro-batch under gradient accumulation unless the user turns the
  all-reduce off (PyTorch PR #126166, "[FSDP2] Supported set_all_reduce_gradients=False for
  HSDP": "For HSDP, since we reduce-scatter and then all-reduce ... (1) reduce-scatter and
  all-reduce" is the default).  ``CostContext.gradient_reductions`` counts them: one per
  micro-batch with ZeRO-2/3, one per iteration with ZeRO-1.
- Megatron's distributed optimizer with ``--num-distributed-optimizer-instances`` k
  ("Number of Distributed Optimizer copies across Data Parallel domain", arguments.py):
  reduce-scatter inside each instance of dp/k ranks, all-reduce across the k instances, once
  per iteration (ZeRO-1); Megatron FSDP's HSDP (``--outer-dp-sharding-strategy no_shard``) the
  same per reduction.
The all-reduce rides the ring through the same shard position of each group (links across
nodes or zones, usually); the d x cp positions x min_tp TP ranks run their rings at once and
share the zone links (``Topology.ring``'s ``concurrent_rings``).  It follows each reduce-scatter,
so it is backward-side traffic (``comm.exposed_sync_parts``' ``replicate_s``).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.comm import _eff, ring_allreduce_s
from planner.cost.context import CostContext


@dataclass(frozen=True)
class HsdpSync:
    """One stage's data-parallel traffic per iteration under HSDP."""

    shard_s: float       # the ZeRO collectives inside the slowest shard group
    replicate_s: float   # the all-reduces of the gradient shard across the groups

    @property
    def total_s(self) -> float:
        return self.shard_s + self.replicate_s


def is_hsdp(ctx: CostContext, num_replicas: int) -> bool:
    """Whether a stage of ``num_replicas`` splits into more than one ZeRO shard group."""
    return ctx.zero_stage >= 1 and ctx.shard_group(num_replicas) < num_replicas


def replicate_allreduce_s(ctx: CostContext, stage_params: float, shard_ranks: int, num_groups: int,
                          min_tp: int, ring_bandwidth_Bps: float, ring_latency_s: float,
                          kind: str = "network", gpu=None) -> float:
    """The all-reduces across ``num_groups`` shard groups per iteration: each of the
    ``ctx.gradient_reductions`` reductions all-reduces one rank's gradient shard, the stage's
    gradients / min_tp / ``shard_ranks`` (d x cp), on a ring of ``num_groups`` members."""
    if num_groups <= 1 or stage_params <= 0:
        return 0.0
    eff, lat = _eff(ctx, kind, gpu)
    shard_bytes = stage_params / max(1, min_tp) / max(1, shard_ranks) * ctx.grad_bytes_per_param
    return ctx.gradient_reductions * ring_allreduce_s(shard_bytes, num_groups, ring_bandwidth_Bps * eff,
                                                      ring_latency_s + lat)


def hsdp_sync(ctx: CostContext, paths, replicas, params: float, gpu_of, crossings: dict,
              ring_sync) -> HsdpSync:
    """The stage's HSDP traffic (module docstring): ``ring_sync`` (planner.cost.evaluate's
    ``_ring_sync``) prices each group's ZeRO collectives and records their zone crossings; the
    replicate all-reduces are priced on every shard position's ring, the slowest setting the
    time, and their bytes across zones are added to ``crossings``."""
    n, cp = len(replicas), ctx.context_parallel
    d = ctx.shard_group(n)
    groups = [replicas[g * d:(g + 1) * d] for g in range(n // d)]
    shard_s = max(ring_sync(ctx, paths, list(group), params, gpu_of, crossings) for group in groups)
    num_groups = len(groups)
    min_tp = min(r.tp for r in replicas)
    concurrent = min_tp * d * cp
    replicate_s = 0.0
    # every shard position's ring carries 2 (G-1)/G of its shard per reduction on each hop
    shard_bytes = params / min_tp / (d * cp) * ctx.grad_bytes_per_param
    hop_bytes = (2 * (num_groups - 1) / num_groups * shard_bytes * min_tp * ctx.gradient_reductions)
    for pos in range(d):
        for c in range(cp):
            devs = tuple(g[pos].devices[c * g[pos].tp] for g in groups)
            ring, ring_crossings = paths.ring(devs, concurrent)
            replicate_s = max(replicate_s, replicate_allreduce_s(
                ctx, params, d * cp, num_groups, min_tp, ring.bandwidth_Bps, ring.latency_s, ring.kind,
                gpu_of(groups[0][pos])))
            both_ways = 2 if num_groups == 2 else 1   # a 2-member ring uses its one hop both ways
            for key in ring_crossings:
                crossings[key] = crossings.get(key, 0.0) + hop_bytes * both_ways
    return HsdpSync(shard_s, replicate_s)


def hsdp_details(ctx: CostContext, timings) -> list[tuple[str, float, str]]:
    """Explain rows for HSDP: the stage with the most data-parallel traffic, in its two parts."""
    if not any(t.dp_replicate_s for t in timings):
        return []
    k = max(range(len(timings)), key=lambda i: timings[i].dp_sync_s)
    t = timings[k]
    inside = (f"stage {k}: ZeRO-{ctx.zero_stage} collectives inside each group of "
              f"{ctx.zero_shard_degree} replicas (x cp {ctx.context_parallel}), per iteration")
    across = (f"stage {k}: all-reduce of the gradient shard across the shard groups, "
              f"{ctx.gradient_reductions} per iteration")
    return [("hsdp_shard_sync_s", t.dp_sync_s - t.dp_replicate_s, inside),
            ("hsdp_replicate_sync_s", t.dp_replicate_s, across)]


def hsdp_option_sync(ctx: CostContext, topo, replica_devices: list[tuple[str, ...]], tp: int,
                     params: float, gpu=None) -> HsdpSync:
    """``hsdp_sync`` for the search: a stage of replicas of one ``tp`` on ``replica_devices``
    (each tp x cp devices), priced on the same rings as evaluate prices the plan naming builds
    (every group's and every shard position's; the slowest sets the time)."""
    from planner.cost.comm import dp_sync_time_s
    n, cp = len(replica_devices), ctx.context_parallel
    d = ctx.shard_group(n)
    groups = [replica_devices[g * d:(g + 1) * d] for g in range(n // d)]
    shard_s = 0.0
    if d * cp > 1:
        for group in groups:
            ring = topo.ring(tuple(r[c * tp] for r in group for c in range(cp)), concurrent_rings=tp)
            shard_s = max(shard_s, dp_sync_time_s(ctx, params, d * cp, tp, ring.bandwidth_Bps, ring.latency_s,
                                                  ring.kind, gpu))
    replicate_s = 0.0
    for pos in range(d):
        for c in range(cp):
            ring = topo.ring(tuple(g[pos][c * tp] for g in groups), concurrent_rings=tp * d * cp)
            replicate_s = max(replicate_s, replicate_allreduce_s(
                ctx, params, d * cp, len(groups), tp, ring.bandwidth_Bps, ring.latency_s, ring.kind, gpu))
    return HsdpSync(shard_s, replicate_s)
