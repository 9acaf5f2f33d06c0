"""Collective and point-to-point communication times.

Sources:
- Ring all-reduce of S bytes over n ranks: ``2 (n-1)/n * S / B + 2 (n-1) * alpha``
  (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of workstations",
  JPDC 2009; NCCL docs "Performance: algorithm bandwidth vs bus bandwidth" use the same
  2(n-1)/n factor).  Reduce-scatter and all-gather are each half of it: ``(n-1)/n * S / B``.
- Tensor parallelism: per block, 2 all-reduces of the b s h activation forward and 2 backward
  (Shoeybi et al. 2019, Megatron-LM §3; Narayanan et al. SC21 §3.2); with sequence parallel
  each becomes reduce-scatter + all-gather of the same bytes (Korthikanti et al. 2022 §4.2.2).
- Context parallelism (ring attention; Liu et al. 2023, "Ring Attention with Blockwise
  Transformers"; Megatron-Core / Transformer Engine's CP with p2p K/V exchange): per attention
  layer the ``cp`` GPUs holding one replica's sequence chunks pass their K and V chunks round a
  ring, ``cp - 1`` steps forward, each overlapped with the blockwise attention of the chunk in
  hand; the backward passes K/V and their gradients (twice the bytes).
- Pipeline: one b s h activation per micro-batch forward and its gradient backward between
  adjacent stages (Narayanan et al. SC21 §4.1); Megatron's scatter/gather optimisation splits
  it over the tp GPUs of the sending replica, which send their slices in parallel.

Every bandwidth is scaled by the bus-bandwidth fraction NCCL reaches on that kind of link
(published nccl-tests figures, catalog ``benchmarks.yaml``: e.g. ~0.69 of NVLink 3's line
rate on A100, ~0.82 of NVLink 4's on H100) and every ring step or send pays NCCL's latency on
top of the path's wire latency.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from planner.catalog.benchmarks import collective_figures
from planner.cost.context import CostContext
from planner.cost.flops import kv_width
from planner.topology.paths import INTRA_NODE_LATENCY_S, Path


def ring_allreduce_s(num_bytes: float, n: int, bandwidth_Bps: float, latency_s: float = 0.0) -> float:
    """Patarasuk & Yuan: 2 (n-1)/n * S / B + 2 (n-1) * alpha."""
    if n <= 1 or num_bytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * num_bytes / bandwidth_Bps + 2 * (n - 1) * latency_s


def ring_reduce_scatter_s(num_bytes: float, n: int, bandwidth_Bps: float, latency_s: float = 0.0) -> float:
    """Reduce-scatter (or all-gather) of an S-byte buffer: (n-1)/n * S / B + (n-1) * alpha."""
    return ring_allreduce_s(num_bytes, n, bandwidth_Bps, latency_s) / 2


def _eff(ctx: CostContext, kind: str, gpu=None) -> tuple[float, float]:
    """(bus bandwidth fraction, latency per ring step or send) of a path kind: inside a node
    the GPU architecture's published nccl-tests figure, between nodes the network's
    (catalog benchmarks.yaml; a calibration file may override the network's)."""
    figures = collective_figures(getattr(gpu, "architecture", None))
    if kind in ("nvlink", "same-device"):
        return figures.busbw_fraction, figures.intra_step_latency_s
    c = ctx.calibration.comm
    eff = c.inter_eff if c.inter_eff is not None else figures.network_busbw_fraction
    lat = c.inter_latency_s if c.inter_latency_s is not None else figures.inter_step_latency_s
    return eff, lat


def tp_collective_s(ctx: CostContext, num_bytes: float, tp: int, intra_Bps: float, gpu=None) -> float:
    """One TP all-reduce (or RS + AG with sequence parallel: same bytes, same time) of
    ``num_bytes`` over the replica's ``tp`` GPUs on the intra-node link."""
    if tp <= 1:
        return 0.0
    eff, lat = _eff(ctx, "nvlink", gpu)
    # A collective is a barrier: besides NCCL's ring steps it waits for the slowest rank's host
    # to launch it (the software stack's fixed cost, calibrated per GPU type).
    sync = ctx.calibration.for_gpu(gpu).collective_overhead_s if gpu is not None else 0.0
    return ring_allreduce_s(num_bytes, tp, intra_Bps * eff, lat) + sync


def p2p_time_s(num_bytes: float, path, ctx: CostContext | None = None, parallel_flows: int = 1,
               cap_Bps: float | None = None, gpu=None) -> float:
    """One point-to-point message over ``path`` (a topology ``Path``): latency + S / B.

    ``parallel_flows``: the message is split over that many GPU flows on the same path (the
    scatter/gather of a TP replica's activation), up to ``cap_Bps`` (e.g. the node's NICs).
    """
    if num_bytes <= 0 or path.kind == "same-device":
        return 0.0
    eff, lat = _eff(ctx, path.kind, gpu) if ctx is not None else (1.0, 0.0)
    bw = path.bandwidth_Bps * max(1, parallel_flows)
    if cap_Bps is not None:
        bw = min(bw, cap_Bps)
    return path.latency_s + lat + num_bytes / (bw * eff)


def cp_ring_bytes(ctx: CostContext, share: int, tp: int) -> float:
    """Bytes one GPU sends per forward ring step of one attention layer: its K and V chunk,
    ``2 x kv_heads/tp x head_dim x s/cp x b`` elements (grouped-query attention sends only the
    K/V heads)."""
    return 2 * kv_width(ctx.model) / tp * ctx.local_seq_len * share * ctx.activation_bytes


def cp_ring_send_s(ctx: CostContext, num_bytes: float, intra_Bps: float, gpu=None) -> float:
    """One ring step's send between context-parallel neighbours: a replica lives inside one
    node (planner.plan.check), so the neighbours of a ring share the node's GPU-to-GPU link,
    the path the topology gives two GPUs of one node (``Topology.p2p``)."""
    return p2p_time_s(num_bytes, Path(intra_Bps, INTRA_NODE_LATENCY_S, "nvlink"), ctx, 1, None, gpu)


def cp_ring_exposed_s(cp: int, send_s: float, step_compute_s: float) -> float:
    """The ring time not hidden: each of the ``cp - 1`` sends overlaps the attention of the
    chunk in hand (``step_compute_s``), exposed = sum over steps of max(0, send - compute)."""
    return (cp - 1) * max(0.0, send_s - step_compute_s) if cp > 1 else 0.0


def shared_link_time_s(num_bytes: float, path, aggregate_Bps: float, ctx: CostContext | None = None,
                       gpu=None) -> float:
    """Transfers of one stage boundary that cross the same zone link run at once and share its
    ``aggregate_bandwidth`` (DESIGN: it caps all flows across the link together): together they
    take at least the path's latency plus their total bytes over the aggregate.  0 when the
    link has no cap.  ``path``: the path one of them takes."""
    if num_bytes <= 0 or not math.isfinite(aggregate_Bps):
        return 0.0
    return p2p_time_s(num_bytes, dataclasses.replace(path, bandwidth_Bps=aggregate_Bps), ctx, 1, None, gpu)


def boundary_bytes(shares_a: list[int], shares_b: list[int], bytes_per_sequence: float) -> list[tuple[int, int, float]]:
    """Which replica of stage A sends how many bytes to which replica of stage B.

    The sequences of a micro-batch are laid out in replica order on both sides
    (replica i of A holds sequences [sum(shares_a[:i]), sum(shares_a[:i+1]))); each sequence's
    activation goes to the replica of B that holds it.  Returns (i, j, bytes) with bytes > 0.
    """
    out = []
    i = j = 0
    a_end, b_end = (shares_a[0] if shares_a else 0), (shares_b[0] if shares_b else 0)
    pos = 0
    while i < len(shares_a) and j < len(shares_b):  # merge the two interval lists: O(n_a + n_b)
        end = min(a_end, b_end)
        if end > pos:
            out.append((i, j, (end - pos) * bytes_per_sequence))
            pos = end
        if a_end == end:
            i += 1
            a_end += shares_a[i] if i < len(shares_a) else 0
        if b_end == end:
            j += 1
            b_end += shares_b[j] if j < len(shares_b) else 0
    return out


def boundary_time_s(transfer_times: list[tuple[int, int, float]]) -> float:
    """Bottleneck of a stage boundary: each replica sends (and receives) its transfers one
    after the other on its own links; different replicas proceed in parallel.

    ``transfer_times``: (sender, receiver, seconds).  Result: the busiest sender or receiver.
    """
    send: dict[int, float] = {}
    recv: dict[int, float] = {}
    for i, j, t in transfer_times:
        send[i] = send.get(i, 0.0) + t
        recv[j] = recv.get(j, 0.0) + t
    return max([0.0, *send.values(), *recv.values()])


@dataclass(frozen=True)
class DpSync:
    """A stage's gradient synchronisation over its replicas, per iteration."""

    time_s: float
    grad_bytes: float      # per ring (each of the concurrent rings carries this)
    rings: int             # concurrent rings (one per TP rank of the smallest TP in the stage)
    ring_size: int         # replicas
    bandwidth_Bps: float   # bottleneck ring bandwidth before efficiency
    kind: str              # kind of the slowest hop


def zero_gathers(ctx: CostContext) -> tuple[int, int]:
    """(forward-side, backward-side) all-gathers of a stage's working parameters per iteration.

    ZeRO-1 and ZeRO-2 keep whole weights: one all-gather of the updated parameters after the
    optimizer step (Megatron distributed optimizer), counted on the forward side because it
    hides behind the next iteration's first forward (``--overlap-param-gather``).  ZeRO-3 /
    FSDP2 keeps only shards: with reshard_after_forward each micro-batch gathers them in its
    forward and again in its backward, so with gradient accumulation or a pipeline the gathers
    repeat per micro-batch; without resharding they are gathered once, at the first forward,
    and kept to the last backward (torch.distributed.pipelining keeps an FSDP stage unsharded
    between its micro-batches' backwards the same way).  Stage 0: none (the all-reduce)."""
    if ctx.zero_stage <= 0:
        return 0, 0
    if ctx.zero_stage >= 3 and ctx.reshard_after_forward:
        m = max(1, ctx.num_micro_batches)
        return m, m
    return 1, 0


def dp_sync_time_s(ctx: CostContext, stage_params: float, num_replicas: int, min_tp: int,
                   ring_bandwidth_Bps: float, ring_latency_s: float, kind: str = "network",
                   gpu=None) -> float:
    """Data-parallel traffic of one stage, per iteration.

    The stage's gradients (``stage_params`` elements, whole stage) are split over ``min_tp``
    concurrent rings (one per TP rank; replicas with a larger TP are treated as resharding
    their gradients to ``min_tp`` slices before the exchange, the gather being local over
    NVLink and not charged), each a ring over the ``num_replicas`` replicas bound by its
    slowest hop.  Without ZeRO: all-reduce of the grads.  With ZeRO-1 (Megatron distributed
    optimizer) and ZeRO-2: reduce-scatter of the grads, then all-gather of the updated
    bf16/fp16 params (docs/source/api-guide/dist_optimizer.md) -- with fp32 grads that is
    4 + 2 bytes per parameter against 2 x 4 for the all-reduce.  ZeRO-2 and ZeRO-3 keep only
    a shard of the gradients (planner.cost.memory), so they cannot accumulate whole gradients
    over the micro-batches: they reduce-scatter after every micro-batch's backward (DeepSpeed
    stages 2 and 3, FSDP2 unless told not to sync), ``ctx.gradient_reductions`` times per
    iteration.  ZeRO-3 also all-gathers the working parameters (``zero_gathers``).
    """
    if num_replicas <= 1 or stage_params <= 0:
        return 0.0
    eff, lat = _eff(ctx, kind, gpu)
    bw = ring_bandwidth_Bps * eff
    latency = ring_latency_s + lat
    per_ring = stage_params / max(1, min_tp)
    grad_bytes = per_ring * ctx.grad_bytes_per_param
    if ctx.zero_stage >= 1:
        param_bytes = per_ring * ctx.activation_bytes
        gathers = sum(zero_gathers(ctx))
        return (ctx.gradient_reductions * ring_reduce_scatter_s(grad_bytes, num_replicas, bw, latency)
                + gathers * ring_reduce_scatter_s(param_bytes, num_replicas, bw, latency))
    return ring_allreduce_s(grad_bytes, num_replicas, bw, latency)


def dp_wire_bytes_per_param(ctx: CostContext) -> float:
    """Bytes per parameter a data-parallel ring moves per iteration, in units of a buffer that
    a reduce-scatter or all-gather moves once (an all-reduce is two): the reduce-scatter /
    all-gather pairs of ``dp_sync_time_s``."""
    if ctx.zero_stage >= 1:
        return (ctx.gradient_reductions * ctx.grad_bytes_per_param
                + sum(zero_gathers(ctx)) * ctx.activation_bytes)
    return 2 * ctx.grad_bytes_per_param


def dp_sync_split(ctx: CostContext) -> tuple[float, float, int, int]:
    """(backward-side fraction, forward-side fraction, forwards it hides behind, backwards it
    hides behind) of ``dp_sync_time_s`` by bytes: the gradient reduce-scatters and backward
    re-gathers on the backward side, the other gathers on the forward side (``zero_gathers``);
    each hides behind the forward or backward of its own micro-batch."""
    f, b = zero_gathers(ctx)
    k = ctx.gradient_reductions
    g, p = k * ctx.grad_bytes_per_param, ctx.activation_bytes
    total = g + (f + b) * p
    return (g + b * p) / total, f * p / total, f, max(1, b, k)


def exposed_sync_parts(ctx: CostContext, dp_s, forward_s, backward_s, replicate_s=0.0) -> tuple:
    """The two hinge arguments of the exposed data-parallel sync, exposed = max(0, first) +
    max(0, second) (``dp_exposed_s``): the backward-side traffic less the backwards it hides
    behind, the forward-side traffic less the forwards (``dp_sync_split``).  Linear in the
    three times, so the search's slopes and intercepts (floats or arrays) go through it as
    the evaluator's seconds do: one definition for both.  ``replicate_s``: the part of
    ``dp_s`` that is HSDP's all-reduce across the shard groups (planner.cost.hsdp), which
    follows each gradient reduce-scatter and so is backward-side whole."""
    if not ctx.grad_reduce_overlap:
        return dp_s, 0.0 * dp_s
    if ctx.zero_stage >= 1:
        back, fwd, forwards, backwards = dp_sync_split(ctx)
        shard_s = dp_s - replicate_s
        return (shard_s * back + replicate_s - backwards * backward_s,
                shard_s * fwd - forwards * forward_s)
    return dp_s - backward_s, -forward_s


def dp_exposed_s(ctx: CostContext, dp_sync_s: float, last_backward_s: float,
                 first_forward_s: float = 0.0, replicate_s: float = 0.0) -> float:
    """The part of the data-parallel traffic not hidden behind compute.

    Without ZeRO (Megatron ``--overlap-grad-reduce``): bucketed all-reduces start during the
    backward of the last micro-batch and hide behind at most that backward.  ZeRO-1: the
    reduce-scatter (4 of 6 bytes per parameter with fp32 grads and bf16 params) behind the last
    backward, the all-gather behind the next iteration's first forward
    (``--overlap-param-gather``).  ZeRO-2 and ZeRO-3 reduce-scatter after every micro-batch, each
    behind its own backward; ZeRO-3 (FSDP2 prefetches the next unit's gather while one
    computes) gathers each micro-batch's weights behind its forward, and with resharding again
    behind its backward.  What does not hide is added to the iteration once
    (``dp_sync_exposed_s``): on the pipeline's slowest stage that is what stretching each of
    its micro-batches costs, elsewhere an overestimate.  Without overlap all is exposed.
    HSDP's all-reduce across the shard groups (``replicate_s``, part of ``dp_sync_s``) follows
    each reduce-scatter and hides behind the same backwards.
    """
    first, second = exposed_sync_parts(ctx, dp_sync_s, first_forward_s, last_backward_s, replicate_s)
    return max(0.0, first) + max(0.0, second)
