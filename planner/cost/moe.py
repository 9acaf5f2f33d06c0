"""Expert parallelism (Mixture-of-Experts models): the token all-to-all and the expert
gradients' reduction, over the real links between a group's devices.

Groups: ``ep = ctx.expert_parallel`` consecutive replicas of a stage form one expert-parallel
group (replicas ``[g ep, (g+1) ep)``); each member holds ``E / ep`` of every MoE layer's experts
(``planner.cost.roofline`` prices their GEMMs).  Megatron's layout (``--expert-model-parallel-
size`` ranks inside the data-parallel group, Megatron-Core MoE docs) with a stage's replicas as
its data-parallel ranks.

All-to-all (Lepikhin et al. 2021, GShard §2.2; Megatron-Core's alltoall token dispatcher): per
MoE layer and micro-batch, a *dispatch* sends each token to the members holding its top_k
experts and a *combine* brings the outputs back; the backward does both again on the
gradients.  With tokens spread evenly over the experts, each GPU sends
``tokens x top_k x h x bytes x (ep - 1)/ep``, ``1/ep`` of it to each peer (its own part stays),
where ``tokens`` are the GPU's ``share x s / tp`` (Megatron requires sequence parallelism with
TP and EP, so each TP rank dispatches its slice of the sequence) and each GPU exchanges with
the same TP rank of every peer.  A GPU's sends inside its node share its NVLink bandwidth (the
catalog's per-GPU figure); those to other nodes share its share of the NICs; the two run at
once.  Each send is priced at its path's
bandwidth and NCCL's bus-bandwidth fraction for that kind of link (comm.py); transfers
crossing a capped zone link share its aggregate bandwidth.  The busiest GPU of the slowest
group sets the pace: every member waits for its tokens.

Gradients: the non-expert weights of a stage are reduced over all its ``n`` replicas as before;
the expert weights over the ``n / ep`` replicas holding the same experts (replicas ``j, j + ep,
...``), a second ring per EP rank, the slowest of them counted after the first.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.cost.comm import _eff, shared_link_time_s
from planner.cost.context import CostContext
from planner.cost.flops import block_expert_params, moe_fraction


@dataclass(frozen=True)
class AllToAll:
    """One dispatch (or combine) of one MoE layer for one micro-batch, on one stage."""

    time_s: float                   # the slowest group's busiest GPU
    bytes_per_gpu: float            # what that GPU sends
    zone_bytes: dict                # (zone, zone) -> bytes crossing, all groups together
    group: int                      # the slowest group's index


def expert_groups(num_replicas: int, ep: int) -> list[list[int]]:
    """Replica indices of each expert-parallel group (module docstring)."""
    return [list(range(g, g + ep)) for g in range(0, num_replicas, ep)]


def moe_blocks(ctx: CostContext, blocks: int) -> float:
    """MoE layers among ``blocks`` blocks, as the cost model counts them (the average block of
    flops.py: a model mixing dense and MoE layers spreads its MoE layers evenly)."""
    return blocks * moe_fraction(ctx.model)


def all_to_all_bytes_per_gpu(ctx: CostContext, share: int, tp: int, ep: int) -> float:
    """Bytes one GPU sends in one dispatch: tokens x top_k x h x bytes x (ep - 1)/ep."""
    m = ctx.model
    tokens = share * ctx.seq_len / tp
    return tokens * m.moe_top_k * m.hidden_size * ctx.activation_bytes * (ep - 1) / ep


def all_to_all(ctx: CostContext, topo, stage, gpu_of) -> AllToAll:
    """One dispatch of one MoE layer over every expert-parallel group of ``stage``."""
    ep = ctx.expert_parallel
    worst = AllToAll(0.0, 0.0, {}, 0)
    zone_bytes: dict = {}
    over_links: dict = {}
    for g, members in enumerate(expert_groups(len(stage.replicas), ep)):
        for i in members:
            ra = stage.replicas[i]
            total = all_to_all_bytes_per_gpu(ctx, ra.micro_batch_share, ra.tp, ep)
            per_peer = total / (ep - 1)
            intra_s, remote_s, latency = 0.0, 0.0, 0.0
            for j in members:
                if j == i:
                    continue
                rb = stage.replicas[j]
                for t in range(ra.tp):    # each TP rank to the same TP rank of the peer
                    path = topo.p2p(ra.devices[t], rb.devices[t % rb.tp])
                    eff, lat = _eff(ctx, path.kind, gpu_of(ra))
                    latency = max(latency, path.latency_s + lat)
                    if t:
                        continue          # the replica's TP ranks run alike: time rank 0's
                    seconds = per_peer / (path.bandwidth_Bps * eff)
                    if path.kind == "nvlink":
                        intra_s += seconds      # the GPU's NVLink bandwidth, shared by its peers
                    else:
                        remote_s += seconds     # its share of the node's NICs, likewise
                za, zb = topo.node_of(ra.devices[0]).zone, topo.node_of(rb.devices[0]).zone
                if za != zb:
                    key = tuple(sorted((za, zb)))
                    zone_bytes[key] = zone_bytes.get(key, 0.0) + per_peer * ra.tp
                    over_links.setdefault((za, zb), [0.0, topo.p2p(ra.devices[0], rb.devices[0]),
                                                     gpu_of(ra)])[0] += per_peer * ra.tp
            seconds = latency + max(intra_s, remote_s)
            if seconds > worst.time_s:
                worst = AllToAll(seconds, total, zone_bytes, g)
    shared = [shared_link_time_s(nbytes, path, topo.zone_path(*zones)[1], ctx, gpu)
              for zones, (nbytes, path, gpu) in over_links.items()]
    time_s = max([worst.time_s, *shared])
    return dataclasses.replace(worst, time_s=time_s, zone_bytes=zone_bytes)


def ep_comm_per_micro_batch(ctx: CostContext, topo, stage, gpu_of) -> tuple[float, float, dict]:
    """(forward, backward) seconds of a stage's all-to-alls for one micro-batch, and the bytes
    they move across zones: 2 per MoE layer each way (dispatch, combine); full recompute redoes
    the forward's two inside the backward."""
    if ctx.expert_parallel <= 1 or not ctx.model.is_moe or not stage.num_blocks:
        return 0.0, 0.0, {}
    a2a = all_to_all(ctx, topo, stage, gpu_of)
    layers = moe_blocks(ctx, stage.num_blocks)
    forward = 2 * layers * a2a.time_s
    backward = forward * (2 if ctx.recompute == "full" else 1)
    passes = 2 * layers * (3 if ctx.recompute == "full" else 2)   # all-to-alls per micro-batch
    return forward, backward, {k: passes * v for k, v in a2a.zone_bytes.items()}


def expert_params(ctx: CostContext, blocks: int) -> float:
    """Routed-expert weights of ``blocks`` blocks, whole (before EP or TP): what EP divides."""
    return blocks * block_expert_params(ctx.model)


def expert_rings(num_replicas: int, ep: int) -> list[list[int]]:
    """Replicas reducing the same experts' gradients: one ring per EP rank (module docstring)."""
    return [list(range(j, num_replicas, ep)) for j in range(ep)]


def optimizer_params(ctx: CostContext, params: float, experts: float, tp: int, shard: int) -> float:
    """Parameters one GPU steps: the stage's ``params`` over tp and the ZeRO ``shard``, its
    ``experts`` (0 without EP) only E/ep of them, sharded over the shard/ep replicas holding them."""
    if not experts:
        return params / tp / shard
    ep = ctx.expert_parallel
    return ((params - experts) / shard + experts / ep / max(1, shard // ep)) / tp


def ep_sync_s(ctx: CostContext, topo, first_devices: list[str], tp: int, params: float,
              experts: float, gpu) -> float:
    """A stage's gradient sync with EP (module docstring), for the search: the non-expert
    weights over all replicas (``first_devices``: each replica's first GPU), then each EP
    rank's E/ep experts over its n/ep replicas, the slowest such ring."""
    from planner.cost.comm import dp_sync_time_s

    def over(devs, nparams) -> float:
        if len(devs) <= 1:
            return 0.0
        ring = topo.ring(tuple(devs), concurrent_rings=tp)
        return dp_sync_time_s(ctx, nparams, len(devs), tp, ring.bandwidth_Bps, ring.latency_s,
                              ring.kind, gpu)

    ep = ctx.expert_parallel
    rings = expert_rings(len(first_devices), ep)
    return over(first_devices, params - experts) + max(
        over([first_devices[j] for j in ring], experts / ep) for ring in rings)


@dataclass(frozen=True)
class _Replica:
    micro_batch_share: int
    tp: int
    devices: tuple[str, ...]


@dataclass(frozen=True)
class _Stage:
    replicas: tuple[_Replica, ...]
    num_blocks: int


def option_ep_comm(ctx: CostContext, topo, devices: list[tuple[str, ...]], shares: list[int],
                   tp: int, blocks: int, gpu) -> tuple[float, float]:
    """(forward, backward) all-to-all seconds per micro-batch of a stage of these replicas
    (``ep_comm_per_micro_batch``), for the search's options."""
    stage = _Stage(tuple(_Replica(q, tp, d) for q, d in zip(shares, devices, strict=True)), blocks)
    fwd, bwd, _ = ep_comm_per_micro_batch(ctx, topo, stage, lambda _r: gpu)
    return fwd, bwd
