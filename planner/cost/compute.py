"""Compute time of one replica of a stage for one micro-batch: profile first, roofline else.

Roofline (per layer, per TP shard; roofline.py lists every term):
    GPU work = sum over the layer's GEMMs of max(FLOPs / (peak * eff(M, N, K)), operand bytes /
               memory bandwidth) + elementwise bytes / (memory bandwidth * mem_eff)
    forward  = max(GPU work, layer_overhead)        backward = max(GPU work, 2 layer_overhead)
Each GEMM has its own shape and so its own efficiency (gemm.py: a saturating curve in output
size and reduction depth through the GPU's published maximum achievable matmul), and the
backward prices each GEMM's dgrad and wgrad by their own shapes.  The max: the host launches a
block's kernels asynchronously, so the software stack's launch cost (``layer_overhead``,
fitted) shows only when the GPU work is shorter (small models, thin TP shards).  It is fitted
on Megatron's fused block, ``FUSED_BLOCK_FORWARD_KERNELS`` launches forward; a block that
launches more (roofline.BlockWork.extra_kernels: Megatron's softmax on its PyTorch path,
softmax.py) pays each at the fitted cost of one.  The TP collectives add to the floor, not
under it: letting them run in the GPU's wait for the host (max(GPU work + collectives, floor))
fits vtrain-single worse (MAPE 6.8% -> 7.2% after a refit, the tp 8 rows 17-21% too fast).

Recompute (Korthikanti et al. 2022): ``selective`` redoes the attention core, ``full`` the whole
block forward (and its TP collectives); the recomputed work runs inside the backward, so it
shares the backward's launch floor (plus, for full recompute, the forward's own launches).

TP communication per block (comm.py): 2 collectives forward, 2 backward, on b s h.
Context parallelism (``ctx.context_parallel`` = cp): every term above on s/cp tokens and 1/cp
of the attention core (roofline.py); per block the K/V ring's exposed part, forward
(cp-1) max(0, send - core/cp) and backward (cp-1) max(0, 2 send - core backward/cp), plus the
forward's again inside the backward when recompute redoes the attention (comm.cp_ring_exposed_s).
Embedding: 1 forward; head: 1 backward.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

from planner.cost.comm import cp_ring_bytes, cp_ring_exposed_s, cp_ring_send_s, tp_collective_s
from planner.cost.context import CostContext
from planner.cost.gemm import Gemm, GemmCurve, gemm_curve
from planner.cost.roofline import block_work, head_work
from planner.spec.gpu import GpuType

# Kernels one forward of Megatron's GPT block launches with its fused kernels (Megatron-LM /
# Megatron-DeepSpeed ParallelTransformerLayer, fp16, no flash attention): input LayerNorm (1);
# QKV GEMM and its bias add (2); scores baddbmm (1); fused scale-mask-softmax (1); dropout (1);
# context bmm (1); its permute's contiguous copy (1); output GEMM (1) and its all-reduce (1);
# fused bias-dropout-add (1); LayerNorm (1); fc1 GEMM (1), fused bias-GeLU (1), fc2 GEMM (1),
# all-reduce (1); bias-dropout-add (1).  The backward launches about twice as many (its floor is
# twice the forward's).
FUSED_BLOCK_FORWARD_KERNELS = 17


@dataclass(frozen=True)
class ReplicaTiming:
    """One micro-batch (the replica's share of it) through one replica's layers."""

    forward_s: float            # compute of the forward (matmuls + elementwise)
    backward_s: float           # compute of the backward
    recompute_s: float          # forward recomputation inside the backward
    tp_comm_forward_s: float    # TP collectives in the forward
    tp_comm_backward_s: float   # TP collectives in the backward (incl. recomputed forward's)
    cp_comm_forward_s: float = 0.0   # exposed K/V ring sends (context parallelism), forward
    cp_comm_backward_s: float = 0.0  # the same in the backward (K/V and their gradients)

    @property
    def tp_comm_s(self) -> float:
        return self.tp_comm_forward_s + self.tp_comm_backward_s

    @property
    def cp_comm_s(self) -> float:
        return self.cp_comm_forward_s + self.cp_comm_backward_s

    @property
    def total_forward_s(self) -> float:
        return self.forward_s + self.tp_comm_forward_s + self.cp_comm_forward_s

    @property
    def total_backward_s(self) -> float:
        return self.backward_s + self.recompute_s + self.tp_comm_backward_s + self.cp_comm_backward_s

    @property
    def total_s(self) -> float:
        return self.total_forward_s + self.total_backward_s

    def scaled(self, k: float) -> ReplicaTiming:
        return ReplicaTiming(self.forward_s * k, self.backward_s * k, self.recompute_s * k,
                             self.tp_comm_forward_s * k, self.tp_comm_backward_s * k,
                             self.cp_comm_forward_s * k, self.cp_comm_backward_s * k)

    def __add__(self, other: ReplicaTiming) -> ReplicaTiming:
        return ReplicaTiming(self.forward_s + other.forward_s, self.backward_s + other.backward_s,
                             self.recompute_s + other.recompute_s,
                             self.tp_comm_forward_s + other.tp_comm_forward_s,
                             self.tp_comm_backward_s + other.tp_comm_backward_s,
                             self.cp_comm_forward_s + other.cp_comm_forward_s,
                             self.cp_comm_backward_s + other.cp_comm_backward_s)


ZERO = ReplicaTiming(0.0, 0.0, 0.0, 0.0, 0.0)


def gemm_curve_for(ctx: CostContext, gpu: GpuType) -> GemmCurve:
    """The GPU's GEMM efficiency curve in the context's precision (cached per context)."""
    key = ("gemm-curve", gpu.name, gpu.peak_tflops, ctx.precision)
    hit = ctx.cache.get(key)
    if hit is None:
        hit = ctx.cache[key] = gemm_curve(gpu, ctx.precision, ctx.calibration.for_gpu(gpu),
                                          ctx.activation_bytes)
    return hit


def matmul_efficiency(ctx: CostContext, gpu: GpuType, gemm: Gemm) -> float:
    """Fraction of the precision's peak one GEMM reaches (gemm.py)."""
    return gemm_curve_for(ctx, gpu).efficiency(gemm)


def _mem_time_s(ctx: CostContext, gpu: GpuType, num_bytes: float) -> float:
    """Memory-bound work at the achieved bandwidth (peak x mem_eff), as the GEMMs' floor."""
    return num_bytes / gemm_curve_for(ctx, gpu).memory_Bps


def _block_work_for(ctx: CostContext, gpu: GpuType, tp: int, share: int):
    """roofline.block_work on the GPU's curve, cached per context: the block's timing and its
    backward's weight share both read it (twice the GEMM pricing for every zero-bubble option
    the search priced before: bench a with zb-h1)."""
    key = ("block-work", gpu.name, gpu.peak_tflops, tp, share)
    hit = ctx.cache.get(key)
    if hit is None:
        hit = ctx.cache[key] = block_work(ctx, gemm_curve_for(ctx, gpu), tp, share)
    return hit


def _block_roofline(ctx: CostContext, gpu: GpuType, tp: int, share: int) -> tuple[float, float, float, float]:
    """(forward, backward, recompute, dense-GEMM forward) of one block, seconds (docstring)."""
    return roofline_phases(ctx, gpu, _block_work_for(ctx, gpu, tp, share))


def roofline_phases(ctx: CostContext, gpu: GpuType, work) -> tuple[float, float, float, float]:
    """``_block_roofline`` of a given roofline.BlockWork: its GPU work against the launch floor."""
    per_launch = ctx.calibration.for_gpu(gpu).layer_overhead_s / FUSED_BLOCK_FORWARD_KERNELS
    extra = work.extra_kernels * per_launch
    overhead = FUSED_BLOCK_FORWARD_KERNELS * per_launch + extra
    fwd = max(work.forward_s, overhead)  # launches overlap GPU work (module docstring)
    bwd = max(work.backward_s, 2 * overhead - extra)   # the extra kernels' backward: once each
    if ctx.recompute == "none":
        return fwd, bwd, 0.0, work.dense_forward_s
    # full and op redo most of the forward's kernels, so their launches; selective a few
    redo_gpu, redo_floor = {"full": (work.forward_s, overhead),
                            "op": (work.op_recompute_forward_s, overhead)}.get(
                                ctx.recompute, (work.core_forward_s, extra))
    recompute = max(work.backward_s + redo_gpu, 2 * overhead - extra + redo_floor) - bwd
    return fwd, bwd, recompute, work.dense_forward_s


def _profile_keys(ctx: CostContext) -> dict:
    """What a profile set that knows them matches against the plan: its training precision and
    its attention kernel (profile/store.py; older or minimal sets take neither)."""
    keys = {}
    if getattr(ctx.profiles, "matches_precision", False):
        keys["precision"] = ctx.precision
    if getattr(ctx.profiles, "matches_attention", False):
        keys["attention"] = attention_kernel(ctx)
    return keys


def attention_kernel(ctx: CostContext) -> str:
    """The plan's attention kernel in a profile's words (ProfileFile.attention)."""
    return "fused" if ctx.flash_attention else "unfused"


def _other_kernel_ratio(ctx: CostContext, gpu: GpuType, tp: int, share: int) -> tuple[float, float] | None:
    """(forward, backward) factors that carry a block timed with the other attention kernel to
    the plan's: the roofline's block under the plan's kernel over the same under the file's.
    None when the last lookup was answered by a file of the plan's own kernel.  A ratio, not a
    difference: it keeps whatever the measurement says about the roofline's other terms (a CPU
    profile runs 2-3x the roofline) and can never turn a time negative."""
    other = getattr(ctx.profiles, "attention_of", None)
    timed_with = other(gpu.name, "block", share, tp, ctx.seq_len) if other else None
    if timed_with is None or timed_with == attention_kernel(ctx):
        return None
    mine = _block_work_for(ctx, gpu, tp, share)
    theirs_ctx = ctx.variant(flash_attention=timed_with == "fused")   # the file's kernel
    theirs = block_work(theirs_ctx, gemm_curve_for(theirs_ctx, gpu), tp, share)
    return _ratios((mine.forward_s, mine.backward_s), (theirs.forward_s, theirs.backward_s))


def _plain_loss_ratio(ctx: CostContext, gpu: GpuType, tp: int, share: int) -> tuple[float, float] | None:
    """(forward, backward) factors that carry a measured head to the plan's loss kernel: every
    profile times the head with ``F.cross_entropy`` on fp32 logits (measure.py, and the runner
    that ``--from-run`` reads), the plain loss; a plan with the fused one takes the roofline's
    head under its kernel over the same under the plain one.  None for a plain-loss plan."""
    if ctx.cross_entropy == "plain":
        return None
    plain = ctx.variant(cross_entropy="plain")
    return _ratios(head_work(ctx, gemm_curve_for(ctx, gpu), tp, share),
                   head_work(plain, gemm_curve_for(plain, gpu), tp, share))


def _ratios(mine: tuple[float, float], theirs: tuple[float, float]) -> tuple[float, float] | None:
    if theirs[0] <= 0 or theirs[1] <= 0:
        return None
    return mine[0] / theirs[0], mine[1] / theirs[1]


def _lookup(ctx: CostContext, gpu: GpuType, kind: str, share: int, tp: int):
    """Measured (forward_s, backward_s) or None; records in ``ctx.sources`` whether the layer
    cost was measured, interpolated between measured micro-batches, or estimated (roofline).
    Profiles that know their dtype get the plan's precision, so a layer timed in another
    precision prices nothing (the roofline does, and the profiles' usage says why)."""
    found, source = None, "estimated"
    # a profile times a layer on whole sequences; a context-parallel GPU runs s/cp of each
    # against the ring's K/V, which no profile measured: the roofline prices it
    if ctx.profiles is not None and ctx.context_parallel == 1:
        extra = _profile_keys(ctx)
        try:
            found = ctx.profiles.lookup(gpu.name, kind, share, tp, ctx.seq_len, ctx.model, **extra)
        except (KeyError, LookupError):
            found = None
        if found is not None:
            source_of = getattr(ctx.profiles, "source_of", None)
            source = source_of(gpu.name, kind, share, tp, ctx.seq_len) if source_of else "measured"
    ctx.sources[_entry(gpu, kind, share, tp)] = source
    return found


def _entry(gpu: GpuType, kind: str, share: int, tp: int) -> str:
    """A layer cost's name in ``ctx.sources`` / ``ctx.repriced`` and the plan's ``inputs.profiles``."""
    return f"{gpu.name}/{kind}/mb{share}/tp{tp}"


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
    fwd, bwd, recompute, gemm = _block_roofline(ctx, gpu, tp, share)
    measured = _lookup(ctx, gpu, "block", share, tp)
    if measured is not None:
        ratio = _other_kernel_ratio(ctx, gpu, tp, share)
        if ratio is not None:   # timed with the other attention kernel: re-priced for the plan's
            measured = (measured[0] * ratio[0], measured[1] * ratio[1])
            other = "unfused" if ctx.flash_attention else "fused"
            ctx.repriced[_entry(gpu, "block", share, tp)] = (
                f"timed with {other} attention; priced for the plan's by the roofline's ratio")
        if ctx.recompute == "full":  # a measured forward is what full recompute redoes
            recompute = measured[0]
        elif fwd > 0:
            recompute *= measured[0] / fwd
        fwd, bwd = measured
    act = share * ctx.local_seq_len * ctx.model.hidden_size * ctx.activation_bytes
    coll = tp_collective_s(ctx, act, tp, intra_Bps, gpu)
    tp_fwd, tp_bwd = 2 * coll, 2 * coll
    if ctx.tp_comm_overlap:  # hidden behind the block's dense GEMMs (backward: 2x of them)
        tp_fwd, tp_bwd = max(0.0, tp_fwd - gemm), max(0.0, tp_bwd - 2 * gemm)
    extra = tp_fwd if ctx.recompute == "full" else 0.0
    cp_fwd, cp_bwd = cp_ring_timing(ctx, gpu, intra_Bps, tp, share)
    out = ReplicaTiming(fwd, bwd, recompute, tp_fwd, tp_bwd + extra, cp_fwd, cp_bwd)
    return out


def cp_ring_timing(ctx: CostContext, gpu: GpuType, intra_Bps: float, tp: int, share: int) -> tuple[float, float]:
    """(forward, backward) exposed K/V ring time of one block (module docstring): each step's
    send against the attention core of one chunk pair, 1/cp of the GPU's core (its s/cp
    queries against one of the cp K/V chunks).  0 without context parallelism."""
    cp = ctx.context_parallel
    if cp <= 1:
        return 0.0, 0.0
    work = block_work(ctx, gemm_curve_for(ctx, gpu), tp, share)
    send = cp_ring_send_s(ctx, cp_ring_bytes(ctx, share, tp), intra_Bps, gpu)
    fwd = cp_ring_exposed_s(cp, send, work.core_forward_s / cp)
    bwd = cp_ring_exposed_s(cp, 2 * send, work.core_backward_s / cp)
    if ctx.recompute != "none":   # recomputing the attention core runs its ring again
        bwd += fwd
    return fwd, bwd


@_cached_per_context("embedding")
def embedding_timing(ctx: CostContext, gpu: GpuType, intra_Bps: float, tp: int, share: int) -> ReplicaTiming:
    m, s = ctx.model, ctx.local_seq_len
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
    m, s = ctx.model, ctx.local_seq_len
    fwd, bwd = head_work(ctx, gemm_curve_for(ctx, gpu), tp, share)
    measured = _lookup(ctx, gpu, "head", share, tp)
    if measured is not None:
        ratio = _plain_loss_ratio(ctx, gpu, tp, share)
        fwd, bwd = measured if ratio is None else (measured[0] * ratio[0], measured[1] * ratio[1])
        if ratio is not None:
            ctx.repriced[_entry(gpu, "head", share, tp)] = (
                "timed with the plain loss; priced for the fused one by the roofline's ratio")
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


@_cached_per_context("weight-fraction")   # the search asks it per option (bench d: 50,000 times)
def backward_weight_fraction(ctx: CostContext, gpu: GpuType, tp: int, share: int,
                             kind: str = "block") -> float:
    """The share of one layer's backward compute that is weight gradients (the W of zero-bubble
    schedules; the rest is I, the input gradients).  Measured where the profile that prices the
    layer timed the backward split (``planner profile``: W / (I + W)); else from the per-GEMM
    roofline (roofline.py): each weight GEMM's wgrad over the block backward's GPU work, which
    stands in for the head too (its dgrad and wgrad are one GEMM each of the same size)."""
    measured = _measured_weight_fraction(ctx, gpu, kind, share, tp)
    if measured is not None:
        return measured
    work = _block_work_for(ctx, gpu, tp, share)
    return work.backward_weight_s / work.backward_s if work.backward_s > 0 else 0.0


def _measured_weight_fraction(ctx: CostContext, gpu: GpuType, kind: str, share: int, tp: int):
    fraction_of = getattr(ctx.profiles, "weight_fraction", None)  # older profile sets have none
    if fraction_of is None or ctx.context_parallel > 1:   # as _lookup: profiles time whole sequences
        return None
    try:
        return fraction_of(gpu.name, kind, share, tp, ctx.seq_len, ctx.model, **_profile_keys(ctx))
    except (KeyError, LookupError):
        return None


def backward_weight_s(ctx: CostContext, gpu: GpuType, intra_Bps: float, tp: int, share: int,
                      blocks: int, embedding: bool = False, head: bool = False) -> float:
    """The W part (weight gradients) of one replica's backward on ``blocks`` blocks: each
    block's backward compute times ``backward_weight_fraction``; the embedding's backward is
    all weight gradient (the token ids need none); the head's by the head's measured fraction where the profile
    has one, else the blocks' (its dgrad and wgrad are one GEMM each of the same size; a
    stand-in, docs/internals.md).
    Recompute and TP collectives stay with I (the recompute runs before the input gradient;
    the backward all-reduces are the dgrad's).  Affine in ``blocks`` (the search's lines)."""
    frac = backward_weight_fraction(ctx, gpu, tp, share)
    w = frac * blocks * block_timing(ctx, gpu, intra_Bps, tp, share).backward_s if blocks else 0.0
    if embedding:
        w += embedding_timing(ctx, gpu, intra_Bps, tp, share).backward_s
    if head:
        w += backward_weight_fraction(ctx, gpu, tp, share, "head") * head_timing(ctx, gpu, intra_Bps, tp, share).backward_s
    return w


# Bytes touched per local parameter by the optimizer-side passes of one iteration, from the
# state layout of Megatron's distributed-optimizer docs (fp32 main grads and params, Adam m, v):
#   Adam step: read grad 4, read+write main param, m, v 3 x 8                        = 28
#   write the bf16/fp16 model weight from the main param                              =  2
#   grad-norm for clipping: read grad                                                 =  4
#   zero the grad buffer for the next iteration: write                                =  4
#   fp16 only: unscale + inf/nan check of the grads (read + write)                    =  8
# fp32 / tf32 training keeps one fp32 copy (no model-weight write, no loss scaling).
OPTIMIZER_BYTES_PER_PARAM = {"bf16": 38, "fp16": 46, "fp32": 36, "tf32": 36}


def optimizer_time_s(ctx: CostContext, gpu: GpuType, local_params: float) -> float:
    """The optimizer-side passes of one iteration over the GPU's local parameters: memory-bound,
    priced by the bytes they touch (``OPTIMIZER_BYTES_PER_PARAM``)."""
    per_param = OPTIMIZER_BYTES_PER_PARAM.get(ctx.precision, 38)
    return _mem_time_s(ctx, gpu, per_param * local_params)
