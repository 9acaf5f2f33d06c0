"""Bytes a block's unfused (eager PyTorch) elementwise ops move (``Training.elementwise: eager``).

Megatron-Core / Transformer Engine, Apex and ``torch.compile`` fuse a block's memory-bound ops
into a few kernels: roofline.py prices that (``BLOCK_ACTIVATION_PASSES``, the MLP's 2-3 passes).
torchtitan and Hugging Face without ``torch.compile`` run every op of the model's Python code as
a kernel of its own, forward and (through autograd) backward, each a full read and write of its
tensor in HBM (b s h is 64 MB per micro-batch for Llama 3 8B at b 2, s 8192: far over L2).

What runs: torchtitan at the December 2024 benchmark (pytorch/torchtitan, torchtitan/models/
llama/model.py at 4d88a8a4 and torchtitan/models/norms.py at 85f68532, both the files as of
ba246978, 2024-12-19; the benchmark's default ``norm_type = "rmsnorm"``, train_configs/
llama3_8b.toml):

    RMSNorm.forward: output = self._norm(x.float()).type_as(x); return output * self.weight
                     _norm(x) = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
    apply_rotary_emb: xq_ = view_as_complex(xq.float().reshape(..., -1, 2)) (and xk);
                     view_as_real(xq_ * freqs_cis).flatten(3).type_as(xq)
    repeat_kv:       x[:, :, :, None].expand(...).reshape(...)  (a copy when n_rep > 1: the
                     expanded tensor has a zero stride, so reshape cannot view it)
    Attention:       wq, wk, wv (three Linears on the normed x), SDPA, output.transpose(1, 2)
                     .contiguous() (no copy: the flash kernel writes its output as b s a d),
                     wo
    FeedForward:     w2(F.silu(w1(x)) * w3(x))
    TransformerBlock: h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h))

Backward formulas: PyTorch's tools/autograd/derivatives.yaml and torch/csrc/autograd/
FunctionsManual.cpp (entries named below; the same in substance through PyTorch 2.x, read from
stored copies, not pinned to one commit): ``mul.Tensor``: grad * other (and grad * self for a
weight, reduced to its shape by the engine's sum_to); ``pow.Tensor_Scalar``: pow_backward =
grad * (2 * self.pow(1)), where ``pow(x, 1)`` is a copy (aten Pow.cpp pow_Tensor_Scalar_out:
``out.copy_(base)``); ``mean.dim``: sum_backward (an expand) / n, one written tensor;
``_to_copy``: the gradient cast back; ``silu``: silu_backward (one kernel; GradMode is off in
backward); ``expand``: sum_to (a reduction over n_rep); views (view_as_complex / view_as_real,
reshape of a contiguous tensor, transpose) move nothing.  A tensor used by two ops gets two
gradients, which the engine adds (InputBuffer::add): x and h (norm and residual), the normed x
(wq, wk, wv: two adds), the normed h (w1, w3: one add), and the fp32 copy inside RMSNorm
(pow and the multiply).

Per element of its tensor, ``eb`` the activation element size (casts to fp32 cost nothing when
``eb`` is 4: ``x.float()`` and ``type_as`` return the tensor itself), 4 = fp32:

    forward                          width   read        write
    RMSNorm x.float()                h       eb          4       (eb < 4)
            pow(2)                   h       4           4
            mean(-1)                 h       4           ~0      (one value per row)
            x * rsqrt(...)           h       4           4       (rsqrt, + eps: per row)
            type_as(x)               h       4           eb      (eb < 4)
            * weight                 h       eb          eb
    RoPE    .float()                 q, kv   eb          4       (eb < 4)
            complex multiply         q, kv   4           4       (freqs_cis: s d / 2, ~0)
            type_as                  q, kv   4           eb      (eb < 4)
    repeat_kv (k and v, GQA only)    kv -> q eb          eb      (read kv, write q)
    residual add (2)                 h       2 eb        eb
    SwiGLU  silu                     f       eb          eb
            silu * w3(x)             f       2 eb        eb
    GeLU    gelu                     f       eb          eb
    LayerNorm (nn.LayerNorm, one native_layer_norm kernel)  h   eb   eb

    backward
    RMSNorm * weight: grad * weight  h       eb          eb
            grad * input, sum_to     h       2 eb + eb   eb      (the weight's gradient)
            type_as backward         h       eb          4       (eb < 4)
            * rsqrt: grad * r        h       4           4
            grad * x, sum(-1)        h       8 + 4       4       (rsqrt's gradient)
            mean backward            h       ~0          4
            pow backward             h       4+4+8       4+4+4   (x.pow(1) copy, * 2, * grad)
            add the two fp32 grads   h       8           4
            .float() backward        h       4           eb      (eb < 4)
    RoPE    type_as backward         q, kv   eb          4       (eb < 4)
            grad * conj(freqs)       q, kv   4           4
            .float() backward        q, kv   4           eb      (eb < 4)
    repeat_kv sum over n_rep (k, v)  q -> kv eb          eb
    gradient adds: x, h              h       2 eb        eb
    gradient adds: normed x (2), normed h (1: SwiGLU's w1, w3)   h_gathered   2 eb   eb
    SwiGLU  grad * w3(x), grad * silu(w1 x), silu_backward   f   3 x 2 eb   3 x eb
    GeLU    gelu_backward            f       2 eb        eb
    LayerNorm backward (dx, then gamma: reads dy and x twice)   h   4 eb   eb

    bf16: per h element 84 B forward, 214 backward (norms 2 x 36 and 2 x 92; 18 of the 214 are
    the gathered inputs' adds, h_gathered below); per q and per
    kv element 24 / 24 (RoPE 20, repeat_kv 4 with GQA); per f element 10 / 18 (SwiGLU).
    The fused price: 22 B per h and 6 per f forward (11 and 3 passes), twice that backward.

Tensor widths per GPU are those the fused pricing uses: ``b s h`` divided by tp only with
sequence parallelism (torchtitan's TP plan runs the norms sequence-parallel), ``q``, ``kv`` and
``f`` by tp, each over the GPU's ``s / cp`` tokens; except the gradient adds of the normed x and
h (``h_gathered``): that plan all-gathers them over the sequence before wq / wk / wv and w1 / w3
(``PrepareModuleInput``, Shard(1) -> Replicate, parallelize_llama.py apply_tp), so the linears'
input gradients are added on the whole ``b s h`` on every GPU, and only then reduce-scattered.  Not counted: Dropout (torchtitan's
models and Hugging Face's Llama have none; the fused price keeps Megatron's bias-dropout-add
with its 1-byte mask, so for a LayerNorm / GeLU model eager comes out about even with fused,
and a Hugging Face GPT-2 / OPT at its default dropout 0.1 pays two dropout passes per block
more than priced here), the biases of models with ``linear_bias`` (in the GEMM), MoE routing ops
beyond the token permutation roofline.py prices either way (the expert MLP takes the table on its
active width: an assumption).  Hugging Face's Llama computes RoPE with rotate_half (cos, sin,
cat): more passes than torchtitan's complex multiply; priced as torchtitan's.
"""

from __future__ import annotations

from planner.cost.passes import FP32_BYTES, Pass, casts, total_bytes

# h_gathered: a b s h tensor all-gathered over the sequence before column-parallel linears (the
# normed x of wq / wk / wv, the normed h of w1 / w3), whole on every GPU whatever sequence
# parallelism shards (module docstring, "Tensor widths")
WIDTHS = ("h", "h_gathered", "q", "kv", "f")


def rmsnorm_passes(eb: int, label: str) -> tuple[list[Pass], list[Pass]]:
    """torchtitan's RMSNorm (norms.py) on a ``b s h`` tensor of ``eb``-byte elements."""
    c, f4 = casts(eb), FP32_BYTES
    fwd = ([Pass(f"{label} x.float()", "h", eb, f4)] if c else []) + [
        Pass(f"{label} pow(2)", "h", f4, f4), Pass(f"{label} mean", "h", f4, 0),
        Pass(f"{label} x * rsqrt", "h", f4, f4)] + (
        [Pass(f"{label} type_as", "h", f4, eb)] if c else []) + [
        Pass(f"{label} * weight", "h", eb, eb)]
    bwd = [Pass(f"{label} grad * weight", "h", eb, eb),
           Pass(f"{label} weight grad (grad * input, sum_to)", "h", 3 * eb, eb)] + (
        [Pass(f"{label} type_as backward", "h", eb, f4)] if c else []) + [
        Pass(f"{label} grad * rsqrt", "h", f4, f4),
        Pass(f"{label} rsqrt grad (grad * x, sum)", "h", 3 * f4, f4),
        Pass(f"{label} mean backward", "h", 0, f4),
        Pass(f"{label} pow backward (x.pow(1), * 2, * grad)", "h", 4 * f4, 3 * f4),
        Pass(f"{label} add the fp32 grads", "h", 2 * f4, f4)] + (
        [Pass(f"{label} x.float() backward", "h", f4, eb)] if c else [])
    return fwd, bwd


def layernorm_passes(eb: int, label: str) -> tuple[list[Pass], list[Pass]]:
    """nn.LayerNorm: one native_layer_norm kernel each way (models with ``normalization: layernorm``)."""
    return [Pass(f"{label} layer_norm", "h", eb, eb)], [Pass(f"{label} layer_norm backward", "h", 4 * eb, eb)]


def rope_passes(eb: int, width: str) -> tuple[list[Pass], list[Pass]]:
    """torchtitan's apply_rotary_emb on q (``width`` "q") or k ("kv")."""
    c, f4 = casts(eb), FP32_BYTES
    fwd = ([Pass(f"rope {width}.float()", width, eb, f4)] if c else []) + [
        Pass(f"rope {width} complex multiply", width, f4, f4)] + (
        [Pass(f"rope {width} type_as", width, f4, eb)] if c else [])
    bwd = ([Pass(f"rope {width} type_as backward", width, eb, f4)] if c else []) + [
        Pass(f"rope {width} grad * conj(freqs)", width, f4, f4)] + (
        [Pass(f"rope {width} .float() backward", width, f4, eb)] if c else [])
    return fwd, bwd


def block_passes(model, eb: int) -> tuple[list[Pass], list[Pass]]:
    """(forward, backward) eager passes of one block of ``model`` (module docstring's table)."""
    norm = rmsnorm_passes if model.normalization == "rmsnorm" else layernorm_passes
    fwd, bwd = [], []
    for label in ("attention_norm", "ffn_norm"):
        f, b = norm(eb, label)
        fwd += f
        bwd += b
    if model.position_embedding == "rope":
        for width in ("q", "kv"):
            f, b = rope_passes(eb, width)
            fwd += f
            bwd += b
    if model.kv_heads < model.num_attention_heads:   # repeat_kv copies k and v to every head
        for t in ("keys", "values"):
            fwd += [Pass(f"repeat_kv {t} read", "kv", eb, 0), Pass(f"repeat_kv {t} write", "q", 0, eb)]
            bwd += [Pass(f"repeat_kv {t} sum read", "q", eb, 0), Pass(f"repeat_kv {t} sum write", "kv", 0, eb)]
    fwd += [Pass(f"residual add {i}", "h", 2 * eb, eb) for i in (1, 2)]
    bwd += [Pass(f"gradient add: {a}", "h", 2 * eb, eb) for a in ("x", "h")]
    adds = ["normed x (wq, wk)", "normed x (wv)"]   # on the all-gathered inputs of the linears
    if model.mlp == "swiglu":
        adds.append("normed h (w1, w3)")
        fwd += [Pass("silu", "f", eb, eb), Pass("silu * w3(x)", "f", 2 * eb, eb)]
        bwd += [Pass("grad * w3(x)", "f", 2 * eb, eb), Pass("grad * silu(w1 x)", "f", 2 * eb, eb),
                Pass("silu_backward", "f", 2 * eb, eb)]
    else:
        fwd += [Pass("gelu", "f", eb, eb)]
        bwd += [Pass("gelu_backward", "f", 2 * eb, eb)]
    bwd += [Pass(f"gradient add: {a}", "h_gathered", 2 * eb, eb) for a in adds]
    return fwd, bwd


def bytes_per_token(passes: list[Pass], widths: dict[str, float]) -> float:
    """Bytes ``passes`` move for one token whose tensors have ``widths`` elements."""
    return sum(p.bytes * widths[p.width] for p in passes)


def block_widths(model, tp: int, sequence_parallel: bool, ffn: float) -> dict[str, float]:
    """Elements per token of each tensor on one GPU of a tp group (module docstring)."""
    from planner.cost.flops import kv_width
    return {"h": model.hidden_size / (tp if sequence_parallel else 1), "h_gathered": model.hidden_size,
            "q": model.q_width / tp, "kv": kv_width(model) / tp, "f": ffn / tp}


def eager_block_bytes(model, eb: int, tokens: float, tp: int, sequence_parallel: bool,
                      ffn: float) -> tuple[float, float]:
    """(forward, backward) bytes one GPU's eager elementwise ops move in one block for ``tokens``
    tokens (``b s / cp``); ``ffn`` the MLP width (the active width in a MoE block)."""
    widths = block_widths(model, tp, sequence_parallel, ffn)
    fwd, bwd = block_passes(model, eb)
    return tokens * bytes_per_token(fwd, widths), tokens * bytes_per_token(bwd, widths)


def final_norm_bytes(model, eb: int) -> tuple[float, float]:
    """(forward, backward) bytes per ``h`` element of the model's final norm run eagerly."""
    norm = rmsnorm_passes if model.normalization == "rmsnorm" else layernorm_passes
    fwd, bwd = norm(eb, "norm")
    return total_bytes(fwd), total_bytes(bwd)


def elementwise_details(ctx, gpu, tp: int, share: int) -> list[tuple[str, float, str]]:
    """Explain rows (term, seconds, formula) of one block's elementwise ops on a replica of ``tp``
    GPUs of ``gpu`` holding ``share`` sequences: what roofline.block_work charges."""
    from planner.cost.compute import gemm_curve_for
    from planner.cost.roofline import BLOCK_ACTIVATION_PASSES, block_work
    curve = gemm_curve_for(ctx, gpu)
    work = block_work(ctx, curve, tp, share)
    m, eb = ctx.model, ctx.activation_bytes
    tbw = f"{curve.memory_Bps / 1e12:.3g} TB/s"
    if ctx.elementwise != "eager":
        mlp = 3 if m.mlp == "swiglu" else 2
        how = (f"fused kernels: {BLOCK_ACTIVATION_PASSES:g} passes over b s h (/tp with sequence parallel) "
               f"+ {mlp} over b s f/tp, x {eb} B / {tbw} (planner.cost.roofline)")
        return [("elementwise_forward_s", work.elementwise_forward_s, f"per block, {how}"),
                ("elementwise_backward_s", work.elementwise_backward, "per block, twice the forward")]
    fwd, bwd = block_passes(m, eb)
    rows = []
    for way, passes, seconds in (("forward", fwd, work.elementwise_forward_s),
                                 ("backward", bwd, work.elementwise_backward)):
        per = {w: total_bytes([p for p in passes if p.width == w]) for w in WIDTHS}
        shown = ", ".join(f"{per[w]:g} B per {w} element" for w in WIDTHS if per[w])
        formula = (f"per block, eager PyTorch ops ({len(passes)} passes): {shown}; over the GPU's "
                   f"b s/cp tokens, h /tp with sequence parallel (h_gathered: the all-gathered inputs "
                   f"of the linears, whole), q kv f /tp, / {tbw} "
                   "(planner.cost.elementwise)")
        rows.append((f"elementwise_{way}_s", seconds, formula))
    return rows
