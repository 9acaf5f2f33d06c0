"""The estimated (not measured) work of one transformer block and of the head, term by term.

Every matmul of a block is priced by its own shape (gemm.py), per TP shard, for the
replica's share of a micro-batch (``T = b s`` tokens):

    forward GEMM      M      N               K        batch
    qkv               T      (h + 2 h_kv)/tp h
    attn.scores       s      s               d        b a/tp      (Q K^T per head, d = h/a)
    attn.context      s      d               s        b a/tp      (probabilities x V)
    attn.out          T      h               q/tp        (q = a d, = h unless head_dim is given)
    mlp.up            T      f/tp (2f/tp SwiGLU) h
    mlp.down          T      h               f/tp
    head              T      V/tp            h

With context parallelism over ``cp`` GPUs (ring attention) each GPU holds ``s/cp`` tokens of
every sequence: ``T = b s / cp``, and the core's GEMMs take its ``s/cp`` queries against all
``s`` keys and values (the scores ``M = s/cp``, the context ``M = s/cp``), 1/cp of the s^2
work; its K/V chunks arrive over the ring (planner.cost.comm.cp_ring_exposed_s).

A MoE block (Mixture of Experts, ``ctx.expert_parallel`` = ep) replaces the MLP by
    moe.router        T      E               h
    moe.experts.up    T_e    f_e/tp (2f_e/tp) h          E/ep   (T_e = T top_k ep / E)
    moe.experts.down  T_e    h               f_e/tp      E/ep
    moe.shared.up     T      f_sh/tp (2x)    h                  (shared experts, if any)
    moe.shared.down   T      h               f_sh/tp
Each GPU holds E/ep experts; on average each expert gets ``T_e`` tokens: the group's ep
replicas' tokens times top_k spread over E experts (exact when the group's shares are equal,
as in Megatron-style plans; a replica in an uneven group is priced as if its peers took its
share).  Experts are tensor-parallel over the replica's tp GPUs (Megatron's default
expert_tensor_parallel_size = tp).  A model mixing dense and MoE layers is priced as the
average of the two blocks (flops.py).

The backward of each is its ``dgrad`` and ``wgrad`` (gemm.py).  With flash attention the two
attention-core GEMMs run inside one fused kernel that recomputes the scores in its backward:
2.5x the forward's core FLOPs instead of 2x (Dao et al. 2022, FlashAttention §3.1 and App. B:
the backward does five matmuls to the forward's two).

Memory-bound work, elements of ``ctx.activation_bytes`` (forward; the backward reads and
writes each twice as much), with Megatron's fused kernels:
- per block on the ``b s h`` activation: 2 LayerNorms (read + write: 4), 2 fused
  bias-dropout-adds (read input and residual, write, 1-byte mask: 3.5 each) -> 11 ``b s h``,
  divided by tp only with sequence parallel (Korthikanti et al. 2022 §4.2.2);
- on the MLP activation: fused bias + GeLU (read + write: 2 ``b s f``/tp; SwiGLU reads two
  inputs: 3); MoE: f is the active width ``top_k f_e + f_sh``, and the token permutation to and
  from the experts reads and writes ``top_k b s h`` twice (4 passes);
- the attention core without flash attention, per ``a s^2 b / tp`` element: the scores written
  by the Q K^T GEMM (1), read and the probabilities written by the fused scale-mask-softmax
  (2), dropout's read, write and 1-byte mask (2.5), and the probabilities read by the
  context GEMM (1): 6.5.  (The GEMMs' own operand traffic is in their memory-bound floor;
  these s^2 tensors are what makes the core memory-bound.)  Flash attention: 0.
- where Megatron's fused scale-mask-softmax kernel does not run (4-byte activations, or a
  shape its rule refuses: ``b * a / tp`` not a multiple of 4, more than 4,096 keys), its
  PyTorch fallback's extra bytes per score element (planner.cost.softmax: 32 more forward and
  34 backward in 16 bits, 16 and 16 in fp32 / tf32).
Eager PyTorch (``ctx.elementwise == "eager"``: torchtitan, Hugging Face without torch.compile)
runs each op of the norms, rotary embedding, activation and residual adds as a kernel of its
own, forward and through autograd backward: planner.cost.elementwise's table (bf16 Llama: 84 B
per ``b s h`` element forward and 214 backward against the fused 22 and 44), in place of the
two fused terms above (the MoE permutation stays).
Head: the final norm (read + write ``b s h``, twice that backward; eager: its RMSNorm passes) and the loss kernel's passes
over the ``b s V``/tp logits (``ctx.cross_entropy``: planner.cost.cross_entropy's tables, e.g. in
bf16 22 bytes per logit forward and 26 backward for PyTorch's ``F.cross_entropy`` on an fp32
copy; Megatron's vocab-parallel kernel keeps the ~12 each way the calibration was fitted with,
its derived 38 and 14 waiting for a refit).

Recompute ``op`` (torchtitan's per-op selective checkpointing, ``selective_ac_option = "op"``,
torchtitan parallelize_llama.py at 9dec370): inside a block it saves the outputs of the matmuls,
of SDPA and of a few collectives, except every second matmul in forward order, and recomputes
the rest.  A Llama block runs q, k, v, o, w1, w3, w2 (a GeLU MLP: q, k, v, o, fc1, fc2), so k, o
and w3 (fc2) are redone: the k part of the fused qkv GEMM, all of ``attn.out``, half of the fused
SwiGLU ``mlp.up`` (all of ``mlp.down`` with GeLU), and every elementwise op (the eager ops'
forward passes when they run eager); the attention core
too unless it is fused (SDPA's output is saved).  In a MoE block only k, o and the elementwise
ops are counted (the experts' grouped GEMMs are not plain matmuls; an assumption).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from planner.cost.cross_entropy import priced_bytes_per_logit
from planner.cost.elementwise import eager_block_bytes, final_norm_bytes
from planner.cost.flops import kv_width, mlp_matrices, moe_active_ffn, moe_fraction
from planner.cost.gemm import Gemm, GemmCurve
from planner.cost.softmax import FALLBACK_EXTRA_KERNELS, fallback_extra_bytes, fused_softmax_runs

# Dao et al. 2022: the fused attention backward does 5 matmuls of the forward's size, not 4.
FLASH_BACKWARD_CORE_FACTOR = 2.5
ATTENTION_CORE_PASSES = 6.5     # elements of a s^2 b / tp moved by the unfused core (docstring)
BLOCK_ACTIVATION_PASSES = 11.0  # elements of b s h moved by norms and bias-dropout-adds
CORE_GEMMS = ("attn.scores", "attn.context")
MOE_PERMUTE_PASSES = 4.0        # elements of top_k b s h moved by the token (un)permutation


def block_gemms(model, share: int, seq_len: int, tp: int, cp: int = 1, ep: int = 1,
                moe: bool | None = None) -> list[Gemm]:
    """The forward GEMMs of one block on one TP shard, ``cp``-way context parallel (module
    docstring's tables); ``moe``: the MoE block (default: whether the model has experts)."""
    h, f, a = model.hidden_size, model.ffn_size, model.num_attention_heads
    d, q = model.head_dim, model.q_width
    queries = seq_len / cp
    tokens = share * queries
    gemms = [
        Gemm("qkv", tokens, (q + 2 * kv_width(model)) / tp, h),
        Gemm("attn.scores", queries, seq_len, d, share * a / tp),
        Gemm("attn.context", queries, d, seq_len, share * a / tp),
        Gemm("attn.out", tokens, h, q / tp),
    ]
    if not (model.is_moe if moe is None else moe):
        up = (mlp_matrices(model) - 1) * f / tp
        return [*gemms, Gemm("mlp.up", tokens, up, h), Gemm("mlp.down", tokens, h, f / tp)]
    e, fe, fsh = model.num_experts, model.moe_ffn_size, model.shared_ffn_size
    per_expert = tokens * model.moe_top_k * ep / e
    gemms += [
        Gemm("moe.router", tokens, e, h),
        Gemm("moe.experts.up", per_expert, (mlp_matrices(model) - 1) * fe / tp, h, e / ep),
        Gemm("moe.experts.down", per_expert, h, fe / tp, e / ep),
    ]
    if fsh:
        gemms += [Gemm("moe.shared.up", tokens, (mlp_matrices(model) - 1) * fsh / tp, h),
                  Gemm("moe.shared.down", tokens, h, fsh / tp)]
    return gemms


def head_gemm(model, share: int, seq_len: int, tp: int, cp: int = 1) -> Gemm:
    return Gemm("head", share * seq_len / cp, model.vocab_size / tp, model.hidden_size)


@dataclass(frozen=True)
class BlockWork:
    """One block's estimated times in seconds, by term (forward and backward apart)."""

    gemm_forward_s: dict[str, float] = field(default_factory=dict)
    gemm_backward_s: dict[str, float] = field(default_factory=dict)   # dgrad + wgrad
    gemm_wgrad_s: dict[str, float] = field(default_factory=dict)      # the weight-gradient part
    elementwise_forward_s: float = 0.0
    attention_core_traffic_forward_s: float = 0.0
    # Megatron's softmax on its PyTorch path (planner.cost.softmax): the bytes it moves beyond
    # the fused kernel's, forward and backward
    softmax_fallback_forward_s: float = 0.0
    softmax_fallback_backward_s: float = 0.0
    # kernels launched each way beyond a fused Megatron block's (what its launch floor counts)
    extra_kernels: float = 0.0

    @property
    def core_forward_s(self) -> float:
        """What selective recompute redoes: the attention core (Korthikanti et al. 2022 §5)."""
        return (sum(self.gemm_forward_s[g] for g in CORE_GEMMS) + self.attention_core_traffic_forward_s
                + self.softmax_fallback_forward_s)

    # torchtitan's op policy (docstring): the forward work recomputed inside the backward
    op_recompute_forward_s: float = 0.0
    # the elementwise ops' backward; None: twice the forward, as the fused kernels' backward
    # reads and writes each tensor twice (eager PyTorch's autograd: planner.cost.elementwise)
    elementwise_backward_s: float | None = None

    @property
    def elementwise_backward(self) -> float:
        return 2 * self.elementwise_forward_s if self.elementwise_backward_s is None else self.elementwise_backward_s

    @property
    def core_backward_s(self) -> float:
        """The attention core's backward (its two GEMMs' dgrads, or the fused kernel's, and its
        s^2 traffic twice): what a context-parallel ring's backward sends overlap."""
        return (sum(self.gemm_backward_s[g] for g in CORE_GEMMS)
                + 2 * self.attention_core_traffic_forward_s + self.softmax_fallback_backward_s)

    @property
    def dense_forward_s(self) -> float:
        """The weight GEMMs of the forward (what TP comm overlap can hide behind)."""
        return sum(t for g, t in self.gemm_forward_s.items() if g not in CORE_GEMMS)

    @property
    def forward_s(self) -> float:
        return (sum(self.gemm_forward_s.values()) + self.elementwise_forward_s
                + self.attention_core_traffic_forward_s + self.softmax_fallback_forward_s)

    @property
    def backward_weight_s(self) -> float:
        """The backward's weight-gradient GEMMs (zero-bubble schedules' W); the rest is its
        input-gradient part (I): dgrad GEMMs, the attention core and the elementwise backward."""
        return sum(self.gemm_wgrad_s.values())

    @property
    def backward_s(self) -> float:
        return (sum(self.gemm_backward_s.values()) + self.elementwise_backward
                + 2 * self.attention_core_traffic_forward_s + self.softmax_fallback_backward_s)


def _mixed(dense: BlockWork, moe: BlockWork, frac: float) -> BlockWork:
    """``frac`` of a MoE block and the rest of a dense one, term by term (flops.py)."""
    def mix(a: dict, b: dict) -> dict:
        return {k: (1 - frac) * a.get(k, 0.0) + frac * b.get(k, 0.0) for k in {**a, **b}}
    return BlockWork(mix(dense.gemm_forward_s, moe.gemm_forward_s),
                     mix(dense.gemm_backward_s, moe.gemm_backward_s),
                     mix(dense.gemm_wgrad_s, moe.gemm_wgrad_s),
                     (1 - frac) * dense.elementwise_forward_s + frac * moe.elementwise_forward_s,
                     dense.attention_core_traffic_forward_s, dense.softmax_fallback_forward_s,
                     dense.softmax_fallback_backward_s, dense.extra_kernels,
                     (1 - frac) * dense.op_recompute_forward_s + frac * moe.op_recompute_forward_s,
                     (1 - frac) * dense.elementwise_backward + frac * moe.elementwise_backward)


def block_work(ctx, curve: GemmCurve, tp: int, share: int) -> BlockWork:
    frac = moe_fraction(ctx.model)
    if 0 < frac < 1:
        return _mixed(_block_work(ctx, curve, tp, share, False),
                      _block_work(ctx, curve, tp, share, True), frac)
    return _block_work(ctx, curve, tp, share, None)


def _block_work(ctx, curve: GemmCurve, tp: int, share: int, moe: bool | None) -> BlockWork:
    m, s, cp = ctx.model, ctx.seq_len, ctx.context_parallel
    eb = ctx.activation_bytes
    moe = m.is_moe if moe is None else moe
    ep = getattr(ctx, "expert_parallel", 1)
    fwd, bwd, wgrad = {}, {}, {}
    for g in block_gemms(m, share, s, tp, cp, ep, moe):
        fwd[g.name] = curve.time_s(g)
        if ctx.flash_attention and g.name in CORE_GEMMS:
            bwd[g.name] = FLASH_BACKWARD_CORE_FACTOR * fwd[g.name]
        else:
            # the attention core has no weights: both its backward GEMMs are input gradients
            w = 0.0 if g.name in CORE_GEMMS else curve.time_s(g.wgrad())
            bwd[g.name] = curve.time_s(g.dgrad()) + curve.time_s(g.wgrad())
            if w:
                wgrad[g.name] = w
    local = s / cp      # the GPU's tokens of each sequence (context parallelism)
    tokens_h = share * local * m.hidden_size
    ffn = moe_active_ffn(m) if moe else m.ffn_size
    permute = MOE_PERMUTE_PASSES * m.moe_top_k * tokens_h * eb if moe else 0.0
    if ctx.elementwise == "eager":   # every op's pass (planner.cost.elementwise)
        ew_fwd, ew_bwd = eager_block_bytes(m, eb, share * local, tp, ctx.sequence_parallel, ffn)
        ew_fwd, ew_bwd = ew_fwd + permute, ew_bwd + 2 * permute
    else:
        elems = BLOCK_ACTIVATION_PASSES * tokens_h / (tp if ctx.sequence_parallel else 1)
        elems += (3 if m.mlp == "swiglu" else 2) * share * local * ffn / tp
        ew_fwd = elems * eb + permute
        ew_bwd = 2 * ew_fwd
    scores = 0.0 if ctx.flash_attention else m.num_attention_heads * local * s * share / tp
    fused = ctx.flash_attention or fused_softmax_runs(eb, share, m.num_attention_heads / tp, local, s)
    fallback_fwd, fallback_bwd = (0.0, 0.0) if fused else fallback_extra_bytes(eb)
    work = BlockWork(fwd, bwd, wgrad, ew_fwd / curve.memory_Bps,
                     ATTENTION_CORE_PASSES * scores * eb / curve.memory_Bps,
                     fallback_fwd * scores / curve.memory_Bps, fallback_bwd * scores / curve.memory_Bps,
                     0.0 if fused else FALLBACK_EXTRA_KERNELS,
                     elementwise_backward_s=ew_bwd / curve.memory_Bps)
    if ctx.recompute != "op":
        return work
    redo = work.elementwise_forward_s + sum(f * fwd.get(g, 0.0) for g, f in op_recomputed_fractions(m).items())
    if not ctx.flash_attention:
        redo += work.core_forward_s
    return replace(work, op_recompute_forward_s=redo)


def op_recomputed_fractions(model) -> dict[str, float]:
    """Of each forward GEMM, the part torchtitan's op policy recomputes (module docstring)."""
    kv = kv_width(model)
    swiglu = model.mlp == "swiglu"
    return {"qkv": kv / (model.q_width + 2 * kv), "attn.out": 1.0,
            "mlp.up": 0.5 if swiglu else 0.0, "mlp.down": 0.0 if swiglu else 1.0}


def head_work(ctx, curve: GemmCurve, tp: int, share: int) -> tuple[float, float]:
    """(forward, backward) seconds of the final norm, output projection and cross-entropy."""
    m, s = ctx.model, ctx.local_seq_len
    g = head_gemm(m, share, ctx.seq_len, tp, ctx.context_parallel)
    logits = share * s * m.vocab_size / tp
    loss_fwd, loss_bwd = priced_bytes_per_logit(ctx.cross_entropy, ctx.activation_bytes)
    eb = ctx.activation_bytes
    norm_fwd, norm_bwd = (final_norm_bytes(m, eb) if ctx.elementwise == "eager"
                          else (4 * eb, 8 * eb))   # fused: the calibration's 4 elements, twice backward
    # the final norm runs on the sequence-parallel shard, as the blocks' norms do (Megatron-Core's
    # final_layernorm, torchtitan's TP plan: SequenceParallel)
    h_elems = share * s * m.hidden_size / (tp if ctx.sequence_parallel and tp > 1 else 1)
    fwd = curve.time_s(g) + (loss_fwd * logits + norm_fwd * h_elems) / curve.memory_Bps
    bwd = curve.time_s(g.dgrad()) + curve.time_s(g.wgrad()) + (loss_bwd * logits + norm_bwd * h_elems) / curve.memory_Bps
    return fwd, bwd
