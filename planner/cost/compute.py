"""Compute time of one replica of a stage for one micro-batch: profile first, roofline else.

Roofline (per layer, per TP shard):
    time = max(matmul FLOPs / tp / (peak * efficiency) + elementwise bytes / (mem_bw * mem_eff),
               layer_overhead)
    efficiency = eff_max * n/(n + tokens_half) * w/(w + width_half)
The max: the host launches a block's kernels asynchronously, so its launch cost (a fixed
``layer_overhead`` per block and pass, fitted) only shows when the GPU work is shorter (small
models, thin TP shards); backward: both sides x2.
n = b*s is the number of matmul rows (tokens of the replica's share) and w = h/tp the
columns of one shard: a saturating curve in both matmul dimensions with three fitted numbers
per GPU type (calibration.py).  Small matmuls (few tokens, thin shards) run far below peak
(cf. NVIDIA "Matrix multiplication background" guide on tile quantisation and wave
quantisation); large ones approach eff_max.

Memory-bound work (counted in elements of 2 bytes, forward; backward = 2x), with Megatron's
fused kernels (fused bias-GeLU, bias-dropout-add, scale-mask-softmax), which both Megatron-LM
and Megatron-DeepSpeed use by default:
- per block, on the b s h activation: 2 LayerNorms (read + write: 4), 2 fused
  bias-dropout-adds (read input and residual, write, 1-byte mask: 3.5 each) -> 11 b s h,
  divided by tp only with sequence parallel (Korthikanti et al. 2022 §4.2.2: these regions are
  replicated without it);
- on the b s f MLP activation: fused bias + GeLU (read + write: 2 b s f / tp; SwiGLU reads
  two inputs: 3 b s f / tp);
- attention: fused scale-mask-softmax (read + write: 2) and dropout (read, write, mask: 2.5)
  -> 4.5 a s^2 b / tp, unless flash attention (fused into the attention kernel: 0).
Embedding: a gather (2 b s h) forward, a dense fp32 gradient of the table backward
(V h / tp * 4 bytes, read+write).  Head: the fp32 logits through the cross-entropy
(~3 x 4 b s V / tp bytes forward and backward).

TP communication per block (comm.py): 2 collectives forward, 2 backward, on b s h.
Embedding: 1 forward; head: 1 backward.  With full recompute the forward collectives are
repeated in the backward.  Recompute (Korthikanti et al. 2022): ``selective`` recomputes the
attention core (the s^2 matmuls and softmax); ``full`` the whole block forward.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

from planner.cost.comm import tp_collective_s
from planner.cost.context import CostContext
from planner.cost.flops import BACKWARD_FLOPS_FACTOR, block_forward_flops, head_forward_flops
from planner.spec.gpu import GpuType


@dataclass(frozen=True)
class ReplicaTiming:
    """One micro-batch (the replica's share of it) through one replica's layers."""

    forward_s: float            # compute of the forward (matmuls + elementwise)
    backward_s: float           # compute of the backward
    recompute_s: float          # forward recomputation inside the backward
    tp_comm_forward_s: float    # TP collectives in the forward
    tp_comm_backward_s: float   # TP collectives in the backward (incl. recomputed forward's)

    @property
    def tp_comm_s(self) -> float:
        return self.tp_comm_forward_s + self.tp_comm_backward_s

    @property
    def total_forward_s(self) -> float:
        return self.forward_s + self.tp_comm_forward_s

    @property
    def total_backward_s(self) -> float:
        return self.backward_s + self.recompute_s + self.tp_comm_backward_s

    @property
    def total_s(self) -> float:
        return self.total_forward_s + self.total_backward_s

    def scaled(self, k: float) -> ReplicaTiming:
        return ReplicaTiming(self.forward_s * k, self.backward_s * k, self.recompute_s * k,
                             self.tp_comm_forward_s * k, self.tp_comm_backward_s * k)

    def __add__(self, other: ReplicaTiming) -> ReplicaTiming:
        return ReplicaTiming(self.forward_s + other.forward_s, self.backward_s + other.backward_s,
                             self.recompute_s + other.recompute_s,
                             self.tp_comm_forward_s + other.tp_comm_forward_s,
                             self.tp_comm_backward_s + other.tp_comm_backward_s)


ZERO = ReplicaTiming(0.0, 0.0, 0.0, 0.0, 0.0)


def matmul_efficiency(ctx: CostContext, gpu: GpuType, tokens: float, width: float) -> float:
    """eff_max * n/(n + n_half) * w/(w + w_half) (see the module docstring)."""
    c = ctx.calibration.for_gpu(gpu)
    return c.eff_max * tokens / (tokens + c.tokens_half) * width / (width + c.width_half)


def _mem_time_s(ctx: CostContext, gpu: GpuType, num_bytes: float) -> float:
    c = ctx.calibration.for_gpu(gpu)
    return num_bytes / (gpu.memory_bandwidth_Bps * c.mem_eff)


def _block_roofline(ctx: CostContext, gpu: GpuType, tp: int, share: int) -> tuple[float, float, float, float]:
    """(forward, backward, selective-recompute, dense-GEMM forward) of one block, seconds."""
    m, s = ctx.model, ctx.seq_len
    h, f, a = m.hidden_size, m.ffn_size, m.num_attention_heads
    fl = block_forward_flops(m, share, s)
    eff = matmul_efficiency(ctx, gpu, share * s, h / tp)
    peak = gpu.peak_flops
    t_dense = fl.dense_flops / tp / (peak * eff)
    # The s^2 attention matmuls are batched per head (K dimension = head_dim): same curve.
    t_attn = fl.attention_flops / tp / (peak * eff)
    sbh = share * s * h
    act_elems = 11 * sbh / (tp if ctx.sequence_parallel else 1)
    act_elems += (3 if m.mlp == "swiglu" else 2) * share * s * f / tp
    softmax_elems = 0.0 if ctx.flash_attention else 4.5 * a * s * s * share / tp
    eb = ctx.activation_bytes
    t_elem = _mem_time_s(ctx, gpu, act_elems * eb)
    t_soft = _mem_time_s(ctx, gpu, softmax_elems * eb)
    overhead = ctx.calibration.for_gpu(gpu).layer_overhead_s
    gpu_fwd = t_dense + t_attn + t_elem + t_soft
    fwd = max(gpu_fwd, overhead)  # launches overlap GPU work (module docstring)
    bwd = BACKWARD_FLOPS_FACTOR * fwd
    core = t_attn + t_soft  # what selective recompute redoes (Korthikanti et al. 2022 §5)
    return fwd, bwd, core, t_dense


def _lookup(ctx: CostContext, gpu: GpuType, kind: str, share: int, tp: int):
    """Measured (forward_s, backward_s) or None; records in ``ctx.sources`` whether the layer
    cost was measured, interpolated between measured micro-batches, or estimated (roofline).
    Profiles that know their dtype get the plan's precision, so a layer timed in another
    precision prices nothing (the roofline does, and the profiles' usage says why)."""
    found, source = None, "estimated"
    if ctx.profiles is not None:
        extra = {"precision": ctx.precision} if getattr(ctx.profiles, "matches_precision", False) else {}
        try:
            found = ctx.profiles.lookup(gpu.name, kind, share, tp, ctx.seq_len, ctx.model, **extra)
        except (KeyError, LookupError):
            found = None
        if found is not None:
            source_of = getattr(ctx.profiles, "source_of", None)
            source = source_of(gpu.name, kind, share, tp, ctx.seq_len) if source_of else "measured"
    ctx.sources[f"{gpu.name}/{kind}/mb{share}/tp{tp}"] = source
    return found


def _cached_per_context(kind: str):
    """Memoise a layer-timing function in ``ctx.cache`` under (kind, GPU name, arguments):
    the functions are pure given the context, and the search prices the same layer for
    thousands of options."""
    def wrap(fn):
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())[2:]

        @functools.wraps(fn)
        def cached(ctx: CostContext, gpu: GpuType, *args, **kwargs):
            if kwargs:      # rare (tests, callers naming flags): the key of the positional call
                bound = signature.bind(ctx, gpu, *args, **kwargs)
                bound.apply_defaults()
                args = tuple(bound.arguments.values())[2:]
            elif len(args) < len(params) and all(p.default is not p.empty for p in params[len(args):]):
                args = (*args, *(p.default for p in params[len(args):]))   # one key per call
            key = (kind, gpu.name, *args)
            hit = ctx.cache.get(key)
            if hit is None:
                hit = ctx.cache[key] = fn(ctx, gpu, *args)
            return hit
        return cached
    return wrap


@_cached_per_context("block")
def block_timing(ctx: CostContext, gpu: GpuType, intra_Bps: float, tp: int, share: int) -> ReplicaTiming:
    """One transformer block, one micro-batch share: profile if measured, else roofline."""
    fwd, bwd, core, gemm = _block_roofline(ctx, gpu, tp, share)
    measured = _lookup(ctx, gpu, "block", share, tp)
    if measured is not None:
        fwd, bwd = measured
    recompute = {"none": 0.0, "selective": core, "full": fwd}[ctx.recompute]
    act = share * ctx.seq_len * ctx.model.hidden_size * ctx.activation_bytes
    coll = tp_collective_s(ctx, act, tp, intra_Bps, gpu)
    tp_fwd, tp_bwd = 2 * coll, 2 * coll
    if ctx.tp_comm_overlap:  # hidden behind the block's dense GEMMs (backward: 2x of them)
        tp_fwd, tp_bwd = max(0.0, tp_fwd - gemm), max(0.0, tp_bwd - 2 * gemm)
    extra = tp_fwd if ctx.recompute == "full" else 0.0
    out = ReplicaTiming(fwd, bwd, recompute, tp_fwd, tp_bwd + extra)
    return out


@_cached_per_context("embedding")
def embedding_timing(ctx: CostContext, gpu: GpuType, intra_Bps: float, tp: int, share: int) -> ReplicaTiming:
    m, s = ctx.model, ctx.seq_len
    sbh = share * s * m.hidden_size
    fwd = _mem_time_s(ctx, gpu, 2 * sbh * ctx.activation_bytes)
    bwd = _mem_time_s(ctx, gpu, 2 * sbh * ctx.activation_bytes + 2 * m.vocab_size * m.hidden_size / tp * 4)
    measured = _lookup(ctx, gpu, "embedding", share, tp)
    if measured is not None:
        fwd, bwd = measured
    coll = tp_collective_s(ctx, sbh * ctx.activation_bytes, tp, intra_Bps, gpu)
    out = ReplicaTiming(fwd, bwd, fwd if ctx.recompute == "full" else 0.0, coll, 0.0)
    return out


@_cached_per_context("head")
def head_timing(ctx: CostContext, gpu: GpuType, intra_Bps: float, tp: int, share: int) -> ReplicaTiming:
    m, s = ctx.model, ctx.seq_len
    eff = matmul_efficiency(ctx, gpu, share * s, m.hidden_size)
    t_mm = head_forward_flops(m, share, s) / tp / (gpu.peak_flops * eff)
    logits_bytes = 3 * 4 * share * s * m.vocab_size / tp
    norm_bytes = 4 * share * s * m.hidden_size * ctx.activation_bytes
    fwd = t_mm + _mem_time_s(ctx, gpu, logits_bytes + norm_bytes)
    bwd = BACKWARD_FLOPS_FACTOR * t_mm + _mem_time_s(ctx, gpu, logits_bytes + 2 * norm_bytes)
    measured = _lookup(ctx, gpu, "head", share, tp)
    if measured is not None:
        fwd, bwd = measured
    coll = tp_collective_s(ctx, share * s * m.hidden_size * ctx.activation_bytes, tp, intra_Bps, gpu)
    out = ReplicaTiming(fwd, bwd, 0.0, 0.0, coll)
    return out


@_cached_per_context("replica")
def replica_compute(ctx: CostContext, gpu: GpuType, intra_Bps: float, tp: int, share: int,
                    blocks: int, embedding: bool = False, head: bool = False) -> ReplicaTiming:
    """One replica (``tp`` GPUs of type ``gpu``) running ``blocks`` blocks (+ embedding / head)
    on ``share`` sequences of one micro-batch.  Pure given ``ctx``, cached in it."""
    out = block_timing(ctx, gpu, intra_Bps, tp, share).scaled(blocks) if blocks else ZERO
    overhead = ctx.calibration.for_gpu(gpu).microbatch_overhead_s
    if overhead:
        out = out + ReplicaTiming(overhead, 0.0, 0.0, 0.0, 0.0)
    if embedding:
        out = out + embedding_timing(ctx, gpu, intra_Bps, tp, share)
    if head:
        out = out + head_timing(ctx, gpu, intra_Bps, tp, share)
    return out


def optimizer_time_s(ctx: CostContext, gpu: GpuType, local_params: float) -> float:
    """Adam step over the GPU's local parameters: memory-bound.

    Per parameter: read fp32 grad (4), read+write fp32 master, m and v (24), write the
    bf16/fp16 weight (2), plus one more read of the grad for the norm / clipping (4): 34 bytes
    (the state layout of Megatron's distributed-optimizer docs).
    """
    return _mem_time_s(ctx, gpu, 34 * local_params)
