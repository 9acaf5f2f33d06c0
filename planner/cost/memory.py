"""Memory per device: weights, gradients, optimizer state, activations, workspace.

Sources:
- Bytes per parameter, Megatron distributed optimizer docs
  (Megatron-LM docs/source/api-guide/dist_optimizer.md, table "bytes per parameter"):
  bf16 params + fp32 grads: 2 + 4 + 12 (fp32 master, Adam m, v) = 18, or 6 + 12/d with the
  distributed optimizer (ZeRO-1) over d data-parallel ranks; fp16 params + fp16 grads:
  2 + 2 + 16 = 20, or 4 + 16/d.  fp32 and tf32 (no mixed precision: the weights are the
  master copy): fp32 params + fp32 grads + Adam m, v = 4 + 4 + 8 = 16, or 8 + 8/d with ZeRO-1
  (the "fp32 param, fp32 grads" row of the same table).
- Activations per block and micro-batch, Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", Table 2: ``s b h (34 + 5 a s / h)`` bytes
  without parallelism; ``s b h (10 + 24/t + 5 a s/(h t))`` with tensor parallel t;
  ``s b h (34/t + 5 a s/(h t))`` with sequence parallel too; selective recompute drops the
  ``5 a s / h`` term; full recompute keeps only the block input, ``2 s b h`` (``/t`` with
  sequence parallel), plus one block's full activations while it is recomputed.  torchtitan's
  op policy (recompute ``op``, planner.cost.roofline) keeps the block input and the outputs of
  the matmuls it saves: q, v, SDPA's output and w1 (fc1), and w2's whole-width output with
  SwiGLU; plus, like full recompute, one block's activations while it is recomputed.
  The paper's bytes are 2-byte (16-bit) tensors and 1-byte dropout masks; in fp32 / tf32 the
  tensors take 4 bytes (``CostContext.activation_bytes``) and the masks still 1, so each
  tensor term is scaled by ``activation_bytes / 2`` and the mask terms are not.
  Generalised here term by term to GQA (K, V of width h_kv) and any MLP width / SwiGLU; for a
  GPT (h_kv = h, f = 4h, GeLU) it is exactly the paper's formula (tests check it).
  Eager elementwise ops (``elementwise: eager``) keep 4 more bytes per element in each of the
  two norms (``EAGER_NORM_EXTRA_BYTES``: the fp32 input and the normalized output an unfused
  RMSNorm saves, against the fused norm's input), without recompute or with selective; full and
  op recompute redo the norms, so they keep nothing more.
- Micro-batches in flight (activations held at once) per schedule: GPipe ``m``; 1F1B
  ``min(p - s, m)`` for stage s (Narayanan et al. SC21 §2.2); interleaved 1F1B, Megatron's
  ``schedules.py`` warm-up count ``(p - s - 1) * 2 + (v - 1) * p`` plus the one in steady
  state, in model chunks of 1/v of the stage; ZB-H1 ``min(m, p)`` on every stage: a
  micro-batch's activations stay until its W (the weight gradient needs the layer inputs and
  W is deferred), and stage s defers s W's behind its p - s in flight before I, so each stage
  peaks at min(m, p) (planner.simulate.actions' executor counts this per rank,
  tests/test_simulate_actions.py).  Qi et al. 2024's "same peak memory as 1F1B" is the peak
  over ranks (1F1B's stage 0); per stage ZB-H1 holds more on all but stage 0.  Counted as
  full activations: the W-inputs kept from I to W are smaller, so this is an upper bound.
  The V schedules hold two chunks of half a stage each (planner.simulate.zero_bubble), counted
  in chunk micro-batches (F done, W not yet) and halved into whole-stage units: ZB-V
  ``min(2p, m + s + 1, 2m)`` chunks on rank s (at most p whole-stage micro-batches, 1F1B's
  stage-0 peak, as Qi et al. 2024 design it); DualPipeV ``2p + 1`` chunks on every rank
  (DualPipe's "PP + 1" of DeepSeek-V3 Table 2 with PP = 2p chunks).  Both are what the
  action-list executor counts, for every p and m tested (tests/test_simulate_zero_bubble.py);
  the count depends only on each rank's order, not on the times.
- ZeRO stages (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", Fig. 1 and §5): with mixed precision and Adam, 2 bytes of fp16 weights,
  2 of fp16 grads and K = 12 of optimizer state per parameter: stage 0 ``2 + 2 + K``, stage 1
  (optimizer state partitioned over N data-parallel ranks) ``2 + 2 + K/N``, stage 2 (grads
  too) ``2 + (2 + K)/N``, stage 3 (weights too) ``(2 + 2 + K)/N`` (``zero_state_bytes``; the
  paper's 7.5B model at N = 64: 120, 31.4, 16.6, 1.9 GB, tests/test_zero.py).  Here the three
  terms are ``bytes_per_param``'s, not the paper's 2 + 2 + 12: with bf16 the grads are fp32
  main grads (4 bytes, ``CostContext.grad_bytes_per_param``), so stage 3 is 18/N; fp16 keeps
  an fp32 grad copy in its optimizer term (2 + 2 + 16); fp32 / tf32 4 + 4 + 8.
  ZeRO-3 also holds the parameters it gathers for compute (``gathered_param_bytes``): with
  FSDP2's reshard_after_forward, one block's (the largest unit it wraps: block, embedding or
  head) full working-precision weights, twice (the next unit is prefetched while one
  computes); without it, the whole stage's, kept from the first forward to the last backward.
- Context parallelism over cp GPUs (ring attention): each GPU keeps the activations of its s/cp
  tokens of every sequence (the score term's queries s/cp against all s keys), so every
  activation term above is divided by cp; weights, grads and optimizer state are replicated
  over the cp ranks, which join the data-parallel ranks in ZeRO's sharding (N = replicas x cp:
  Megatron's distributed optimizer shards over its data-parallel-with-CP group, torchtitan's
  FSDP over dp_shard x cp).
- HSDP (``zero_shard_degree`` d): the ZeRO shards span only a group of d replicas x cp, the
  n/d groups each holding a whole copy (FSDP2 on a 2-D (replicate, shard) mesh, torchtitan's
  data_parallel_shard_degree; Megatron's --num-distributed-optimizer-instances n/d): every
  divisor N above becomes d x cp.
- Mixture of Experts (planner.cost.moe): each GPU holds its E/ep share of the routed experts
  (split by tp too) and the rest of the stage's weights whole / tp; the experts' ZeRO shards
  are over the n/ep replicas holding the same experts, the rest over all n.  A MoE block's
  MLP activations are those of its active width top_k f_e + f_sh (each token's top_k expert
  inputs and outputs) plus the permuted copies of its input, top_k x 2 bytes per h.
- Logits: the last stage holds fp32 logits of the vocabulary, ``4 s b V / t`` bytes, per
  micro-batch in flight (Korthikanti et al. §4.3, output layer) at its head.  With interleaved
  1F1B that is one, not the stage's count: the head is the last rank's last model chunk, and
  Megatron's interleaved order (``schedules.py``: warm-up forwards on the first chunks, then
  each forward of the last chunk followed by its backward) runs every micro-batch's forward and
  backward there back to back (``logits_in_flight``).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.context import FULL_PRECISIONS, CostContext
from planner.cost.flops import (
    block_expert_params,
    block_params,
    embedding_params,
    head_params,
    kv_width,
    mlp_matrices,
    moe_active_ffn,
    moe_fraction,
)
from planner.cost.softmax import fallback_saved_extra_bytes, fused_softmax_runs
from planner.spec.gpu import GpuType

GiB = 2**30
# Fixed per-GPU workspace: CUDA context and kernels (~0.5 GiB), NCCL buffers (~0.5 GiB),
# cuBLAS workspace and caching-allocator fragmentation (~0.5 GiB).  A rounded figure from
# common PyTorch/Megatron experience, not a measurement.
WORKSPACE_BYTES = 1.5 * GiB


@dataclass(frozen=True)
class MemoryBreakdown:
    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    workspace_bytes: float
    gathered_bytes: float = 0.0    # ZeRO-3: the parameters gathered for compute (module docstring)

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activations_bytes + self.workspace_bytes + self.gathered_bytes)

    def as_dict(self) -> dict[str, float]:
        out = {"weights": self.weights_bytes, "grads": self.grads_bytes,
               "optimizer": self.optimizer_bytes, "activations": self.activations_bytes,
               "workspace": self.workspace_bytes}
        if self.gathered_bytes:    # only ZeRO-3: other plans' outputs keep their keys
            out["gathered"] = self.gathered_bytes
        return out


def bytes_per_param(precision: str) -> tuple[float, float, float]:
    """(weights, grads, optimizer state) bytes per parameter, Megatron dist-optimizer docs:
    bf16 2 + 4 + 12 (fp32 master, m, v); fp16 2 + 2 + 16 (fp32 master, m, v, fp32 grad copy);
    fp32 / tf32 4 + 4 + 8 (the weights are the master copy; Adam m, v)."""
    if precision == "bf16":
        return 2.0, 4.0, 12.0
    if precision in FULL_PRECISIONS:
        return 4.0, 4.0, 8.0
    return 2.0, 2.0, 16.0


def zero_state_bytes(weights: float, grads: float, optimizer: float, zero_stage: int,
                     n: int) -> tuple[float, float, float]:
    """(weights, grads, optimizer state) bytes per parameter on each of ``n`` data-parallel ranks
    at ``zero_stage``, from the unsharded per-parameter bytes (Rajbhandari et al. 2020, Fig. 1:
    stage 1 shards the optimizer state, stage 2 the grads too, stage 3 the weights too)."""
    n = max(1, n)
    return (weights / n if zero_stage >= 3 else weights,
            grads / n if zero_stage >= 2 else grads,
            optimizer / n if zero_stage >= 1 else optimizer)


def gathered_param_bytes(ctx: CostContext, tp: int, blocks: int, embedding: bool, head: bool) -> float:
    """ZeRO-3's gathered working weights on each GPU of a replica (module docstring): with
    reshard_after_forward, two of the largest unit FSDP wraps on the stage (prefetch); without,
    the whole stage.  In the working precision (``CostContext.activation_bytes``)."""
    if ctx.zero_stage < 3:
        return 0.0
    if not ctx.reshard_after_forward:
        return stage_params(ctx, blocks, embedding, head) / tp * ctx.activation_bytes
    units = [float(block_params(ctx.model))] if blocks else []
    if embedding:
        units.append(float(embedding_params(ctx.model)))
    if head:
        units.append(float(head_params(ctx.model, with_embedding_on_same_stage=embedding)))
    return 2 * max(units, default=0.0) / tp * ctx.activation_bytes


# torch.nn.functional.cross_entropy(logits.float(), labels) (torchtitan's loss, components/loss.py
# at b5bcd76): the log-softmax it saves is the 4 bytes per logit counted for every loss; its
# backward then holds the dense fp32 gradient of the log-probabilities (nll_loss's backward) and
# the fp32 gradient of the logits it computes from them, beside the saved log-probabilities:
# 8 more bytes per logit of the micro-batch being differentiated (its forward's bf16 logits and
# fp32 copy, 6 more, peak lower).  Megatron's vocab-parallel kernel reuses one fp32 buffer in
# place for the softmax and its gradient, so "fused" adds nothing.
PLAIN_CROSS_ENTROPY_TRANSIENT_BYTES = 8.0


EAGER_NORM_EXTRA_BYTES = 4.0   # per b s h element and norm, beyond a fused norm's saved input


def block_activation_bytes(ctx: CostContext, tp: int, b: float, recompute: str | None = None) -> float:
    """Activations one block keeps for one micro-batch of ``b`` sequences (Korthikanti Table 2).
    Memoised in ``ctx.cache``: the search's memory models read it for every option, five
    times each (space.Pricer.memory_model)."""
    key = ("block_activation_bytes", tp, b, recompute or ctx.recompute)
    hit = ctx.cache.get(key)
    if hit is None:
        hit = ctx.cache[key] = _block_activation_bytes(ctx, tp, b, key[3])
    return hit


def _block_activation_bytes(ctx: CostContext, tp: int, b: float, recompute: str) -> float:
    m, s = ctx.model, ctx.seq_len
    h, a = m.hidden_size, m.num_attention_heads
    sbh = ctx.local_seq_len * b * h   # s / cp tokens per GPU with context parallelism
    sp = ctx.sequence_parallel and tp > 1
    k = ctx.activation_bytes / 2   # 1 in bf16/fp16 (the paper's 2-byte tensors), 2 in fp32/tf32
    if recompute == "full":
        return 2 * k * sbh / (tp if sp else 1)
    if recompute == "op":  # module docstring: input, q, v, SDPA out, w1 (fc1), and w2's output
        swiglu = m.mlp == "swiglu"
        sharded = 2.0 + kv_width(m) / h + m.ffn_size / h
        return 2 * k * sbh * (1 / (tp if sp else 1) + sharded / tp + (1.0 if swiglu else 0.0))
    # Replicated without SP: 2 LayerNorm inputs (4), QKV input (2), MLP input (2), 2 dropout masks (2).
    replicated = 8.0 * k + 2.0
    if ctx.elementwise == "eager":
        # an eager RMSNorm (torchtitan's norms.py: _norm(x.float()).type_as(x) * weight) saves its
        # fp32 input for pow and mul and its normalized output for the weight's mul: 4 + eb bytes
        # where a fused norm keeps its eb-byte input, 4 more per element, twice a block (in fp32
        # the input is not copied, and the output is the 4 more)
        replicated += 2 * EAGER_NORM_EXTRA_BYTES
    # Sharded by TP: Q (2) and K, V (2 h_kv/h each), out-projection input (2), MLP: GeLU input
    # and output 2 x 2 f/h (SwiGLU: gate and up inputs, product: 3 x 2 f/h).
    mlp = 2.0 * (mlp_matrices(m)) * m.ffn_size / h
    frac = moe_fraction(m)
    if frac:   # the average block (flops.py): active expert width, permuted input copies
        moe = 2.0 * mlp_matrices(m) * moe_active_ffn(m) / h + 2.0 * m.moe_top_k
        mlp = (1 - frac) * mlp + frac * moe
    sharded = k * (4.0 * m.q_width / h + 4.0 * kv_width(m) / h + mlp)
    per = replicated / (tp if sp else 1) + sharded / tp
    if recompute == "none" and not ctx.flash_attention:
        # softmax output (2), dropout mask (1) and output (2); on the PyTorch path the softmax
        # keeps an fp32 output (planner.cost.softmax)
        saved = 4.0 * k + 1.0
        if not fused_softmax_runs(ctx.activation_bytes, b, a / tp, ctx.local_seq_len, s):
            saved += fallback_saved_extra_bytes(ctx.activation_bytes)
        per += saved * a * s / (h * tp)
    return sbh * per


def in_flight_micro_batches(schedule: str, num_stages: int, stage: int, num_micro_batches: int,
                            virtual_stages: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in whole-stage units."""
    p, m, v = num_stages, num_micro_batches, virtual_stages
    if schedule == "gpipe":
        return float(m)
    if schedule == "interleaved-1f1b" and v > 1:
        chunks = min(m * v, (p - stage - 1) * 2 + (v - 1) * p + 1)
        return chunks / v
    if schedule in ("zb-h1", "latency-aware"):
        # ZB-H1: a micro-batch's saved tensors stay until its W, not its I: torch's
        # stage_backward_input (and the runner's SplitBackward) runs the input gradient with
        # retain_graph=True and keeps the weight ops' nodes for W, and every node below them.
        # Measured on the runner's block (tests/test_zb_memory.py).  So p on every rank; the
        # gradients kept for W come on top (deferred_w_micro_batches).
        # latency-aware: the default cap of its scheduler (planner.simulate.latency); a plan's
        # own lists give the exact peak (planner.cost.latency_aware), which evaluate uses
        return float(min(p, m))
    if schedule == "zb-v":
        return min(2 * p, m + stage + 1, 2 * m) / 2
    if schedule == "dualpipev":
        return (2 * p + 1) / 2
    return float(min(p - stage, m))


def deferred_w_micro_batches(schedule: str, num_stages: int, stage: int, num_micro_batches: int) -> float:
    """Micro-batches between their I and their W on stage ``stage``, each holding the gradients
    flowing into its weight ops (``w_input_grad_bytes``) beside its saved tensors: the most at
    any moment, charged with the activations' peak (``in_flight_micro_batches``) although the
    two may fall apart, so their sum bounds the rank's memory at every moment for any ratio
    of gradient to activation bytes.  ZB-H1's rank r runs the W of micro-batch j after the I of
    micro-batch j + r (planner.simulate.actions.zb_h1): just after that I it holds p
    micro-batches' activations and r + 1 micro-batches' gradients (rank 0 too: its W follows
    its I, and the gradients wait through it); both peaks fall there.  The V schedules defer
    their W's in the cool-down, so their most waiting comes after the activations' peak:
    ZB-V (``ScheduleZBVZeroBubble``) rank r holds up to 2r + 1 chunks' I without their W once
    m >= 2p - 1, one chunk for m <= p, and at most ``1 + 2 (m - p)`` chunks between;
    DualPipeV rank r up to r + 1 chunks (m >= 2p, which it needs); in stages, half that (read
    off the action lists in tests/test_zb_memory.py).  0 where the backward runs whole.  A
    latency-aware plan's count comes from its own lists (planner.cost.latency_aware,
    ``peak_waiting_w``), not from here."""
    if schedule == "zb-h1":
        return float(min(stage + 1, num_micro_batches))
    if schedule == "zb-v":
        return min(2 * stage + 1, 1 + 2 * max(0, num_micro_batches - num_stages)) / 2
    if schedule == "dualpipev":
        return (stage + 1) / 2
    return 0.0


def stage_holds(schedule: str, num_stages: int, stage: int, num_micro_batches: int,
                virtual_stages: int = 1) -> tuple[float, float]:
    """(micro-batches in flight, those of them waiting for their W) at stage ``stage``'s peak:
    the pair ``replica_memory`` takes, from the schedule's rules above."""
    return (in_flight_micro_batches(schedule, num_stages, stage, num_micro_batches, virtual_stages),
            deferred_w_micro_batches(schedule, num_stages, stage, num_micro_batches))


def w_input_grad_bytes(ctx: CostContext, tp: int, b: float) -> float:
    """What one block keeps from a micro-batch's I for its W: the gradient flowing into each
    op with weights (two norms, Q, K, V, the attention projection, the MLP's input matmuls and
    its output matmul), in the activation dtype.  The two residual-stream gradients (the
    projection's and the output matmul's) are counted whole though one of them may be the very
    tensor the next block down receives, so this errs high by at most 2 h per token."""
    m = ctx.model
    h = m.hidden_size
    sbh = ctx.local_seq_len * b * h
    sp = ctx.sequence_parallel and tp > 1
    ffn = moe_active_ffn(m) if moe_fraction(m) else m.ffn_size
    replicated = 4.0 * h             # two norms' outputs and the two residual-stream gradients
    sharded = m.q_width + 2.0 * kv_width(m) + (mlp_matrices(m) - 1) * ffn
    return ctx.activation_bytes * sbh * (replicated / (tp if sp else 1) + sharded / tp) / h


def stage_params(ctx: CostContext, blocks: int, embedding: bool, head: bool) -> float:
    """Parameters of a stage (whole, before TP sharding)."""
    m = ctx.model
    per_block = ctx.cache.get("block_params")   # memoised: read for every option the search prices
    if per_block is None:
        per_block = ctx.cache["block_params"] = block_params(m)
    n = blocks * per_block
    if embedding:
        n += embedding_params(m)
    if head:
        n += head_params(m, with_embedding_on_same_stage=embedding)
    return float(n)


def logits_in_flight(schedule: str) -> float | None:
    """Micro-batches whose logits the head's stage holds at its peak where that is not the
    stage's own in-flight count (module docstring): one under interleaved 1F1B; two under the
    V schedules, whose head chunk (rank 0's second) runs each micro-batch's F, I and W before
    the next one's F (the generated lists, as torch's), so at most one micro-batch's fp32
    logits and then the logits' gradient its W reads are held; None else."""
    if schedule == "interleaved-1f1b":
        return 1.0
    return 2.0 if schedule in ("zb-v", "dualpipev") else None


def replica_memory(ctx: CostContext, gpu: GpuType, tp: int, share: int, blocks: int,
                   embedding: bool, head: bool, num_replicas_in_stage: int,
                   in_flight_micro_batches: float, logits_in_flight: float | None = None,
                   deferred_w: float = 0.0) -> MemoryBreakdown:
    """Peak memory of each GPU of a replica (all its tp GPUs hold the same amount);
    ``logits_in_flight``: the head's count where it is not the stage's (``logits_in_flight``);
    ``deferred_w``: micro-batches waiting for their W (``deferred_w_micro_batches``)."""
    experts = blocks * block_expert_params(ctx.model)       # 0 for dense models
    params = (stage_params(ctx, blocks, embedding, head) - experts) / tp
    # ZeRO shards over dp x cp (docstring); with HSDP over the shard group's d replicas x cp
    ranks = ctx.shard_group(num_replicas_in_stage) * ctx.context_parallel
    w, g, o = zero_state_bytes(*bytes_per_param(ctx.precision), ctx.zero_stage, ranks)
    weights, grads, optimizer = params * w, params * g, params * o
    if experts:   # E/ep experts per GPU, their ZeRO shards over the n/ep replicas (x cp) holding them
        local = experts / (tp * ctx.expert_parallel)
        we, ge, oe = zero_state_bytes(*bytes_per_param(ctx.precision), ctx.zero_stage,
                                      ranks // ctx.expert_parallel)
        weights, grads, optimizer = weights + local * we, grads + local * ge, optimizer + local * oe
    act = blocks * block_activation_bytes(ctx, tp, share) * in_flight_micro_batches
    if ctx.recompute in ("full", "op") and blocks:
        act += block_activation_bytes(ctx, tp, share, recompute="none")  # the block being recomputed
    if deferred_w and blocks:
        # with recompute too: a checkpointed block's recomputed tensors are freed as its I uses
        # them, only these gradients wait (tests/test_zb_memory.py).  The head's are not added:
        # its logits count in flight at 4 bytes (above; ZB-H1 p times, the V schedules twice),
        # at least the fp32 log-probabilities until I and the logits' gradient until W that
        # the head's rank holds.
        act += blocks * w_input_grad_bytes(ctx, tp, share) * deferred_w
    s, h = ctx.local_seq_len, ctx.model.hidden_size
    if embedding:  # embedding dropout mask (Korthikanti: s b h p / t, 1 byte per element)
        act += s * share * h / (tp if ctx.sequence_parallel and tp > 1 else 1) * in_flight_micro_batches
    if head:  # fp32 logits for the cross-entropy
        logits = s * share * ctx.model.vocab_size / tp
        act += 4 * logits * (in_flight_micro_batches if logits_in_flight is None
                             else min(logits_in_flight, in_flight_micro_batches))
        if ctx.cross_entropy == "plain":
            act += PLAIN_CROSS_ENTROPY_TRANSIENT_BYTES * logits
    # one replica shards nothing, so it gathers nothing (FSDP over one rank keeps whole weights)
    gathered = gathered_param_bytes(ctx, tp, blocks, embedding, head) if ranks > 1 else 0.0
    return MemoryBreakdown(weights, grads, optimizer, act, WORKSPACE_BYTES, gathered)


def replica_memory_bytes(ctx: CostContext, gpu: GpuType, tp: int, share: int, blocks: int,
                         embedding: bool, head: bool, num_replicas_in_stage: int,
                         in_flight_micro_batches: float, logits_in_flight: float | None = None,
                         deferred_w: float = 0.0) -> float:
    """Total of ``replica_memory``: peak bytes on each GPU of the replica."""
    return replica_memory(ctx, gpu, tp, share, blocks, embedding, head, num_replicas_in_stage,
                          in_flight_micro_batches, logits_in_flight, deferred_w).total_bytes
