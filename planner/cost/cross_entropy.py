"""Bytes the loss kernel moves per logit, forward and backward (``Training.cross_entropy``).

The head's output projection writes the logits (``b s V / tp`` of them per GPU) in the
activation dtype; the loss then streams them through HBM several times.  A vocabulary row is
32k-256k elements (128 KB-1 MB in fp32): larger than a thread block's 48 KB of shared memory,
so no pass keeps a row on chip, and every pass below is a full read or write of the tensor
(PyTorch's softmax re-reads a row within one thread block, but with one 1024-thread block per
row, two per SM, the 264 fp32 rows in flight on an H100 / H200 are 53 MB for a 50k vocabulary
and 135 MB for 128k, over their 50 MB L2).
``eb`` is the activation element size (2 in bf16/fp16, 4 in fp32/tf32): ``x.float()`` on an fp32
tensor returns the tensor itself, so the casts cost nothing there.  Gathers of one logit per
token (the target's) and per-row scalars (max, sum, loss) are ~1/V of a pass: left out.  The
logits' GEMM write and the bf16 gradient the dgrad / wgrad GEMMs read are the GEMMs' own
operands (gemm.py), not counted here.

plain: ``F.cross_entropy(logits.float(), targets)`` (torchtitan components/loss.py, Hugging
Face, planner/profile/measure.py ``Head``) = ``log_softmax`` then ``nll_loss``, eager PyTorch
(pytorch/pytorch aten/src/ATen/native/cuda/SoftMax.cu at 000cace, Loss.cu at 00e3254):

    forward                                           read      write
    logits.float()          (_to_copy)                eb        4       (only when eb < 4)
    log_softmax: max        cunn_SoftMaxForward:      4                 (the row is too long
    log_softmax: sum exp      two ilpReduce passes    4                 for its Smem variant,
    log_softmax: output       then the epilogue       4         4       sharedMemPerBlock)
    nll_loss                (one logit per row)       ~0
    backward
    nll_loss backward       (grad_input.zero_())                4       then scatters 1/row
    log_softmax backward: sum of grad  cunn_SoftMaxBackward  4
    log_softmax backward: grad in      (WriteBpropResults)   8  4       reads output and grad
    .float() backward       (cast to eb)              4         eb      (only when eb < 4)

    bf16: 22 forward, 26 backward; fp32: 16 and 20.

fused: Megatron's vocab-parallel cross-entropy (megatron/core/tensor_parallel/cross_entropy.py,
NVIDIA/Megatron-LM at d98e8a6, the path without ``--cross-entropy-loss-fusion``; Megatron-LM's
older mpu/cross_entropy.py and Megatron-DeepSpeed run the same torch ops), reusing one fp32
buffer in place:

    forward                                           read      write
    vocab_parallel_logits.float()                     eb        4       (only when eb < 4)
    torch.max(dim=-1)                                 4
    logits -= max (in place)                          4         4
    torch.exp(out=logits)                             4         4
    exp_logits.sum(dim=-1)                            4
    exp_logits.div_(sum) (the softmax, saved)         4         4
    backward
    grad_2d[rows, target] -= 1                        ~0
    grad_input.mul_(grad_output)                      4         4
    cast to the logits' dtype (the autograd engine casts a gradient to its input's dtype;
      the older GPT model's ``output.float()`` backward does the same)   4   eb   (eb < 4)

    bf16: 38 forward, 14 backward; fp32: 32 and 8.

So in bf16 the plain loss moves 16 fewer bytes per logit forward (one fused log-softmax kernel
where Megatron runs five elementwise passes) and 12 more backward (the dense nll gradient and
a softmax backward that re-reads its output), 4 fewer in all.

What the head is charged (``priced_bytes_per_logit``): plain, its derived bytes (the H200 device
check's heads, reference/device/h200-2026-12-04, were 18-47% too fast at the old price and are
-17..-26% forward, +5..-8% backward at these, predicted, not fitted).  Fused keeps the ~3 x 4
bytes each way that the shipped calibration was fitted with (vtrain-single and
megatron-core-h100 are Megatron runs): pricing the derived 38 / 14 takes megatron-core-h100 from
7.4% to 7.7% MAPE (its 1.7B row, h 2048 with a 131k vocabulary, from 0.0% to +4.2%), past its
bound in tests/test_fidelity.py, and vtrain-single from 6.6% to 6.7% (vtrain-multi 8.9% -> 8.7%,
sailor/GH200 17.4% -> 17.2%); the fit has absorbed the under-priced loss, so the derived price
waits for a refit of those two sets.
"""

from __future__ import annotations

from planner.cost.passes import FP32_BYTES, Pass, casts, total_bytes

LOGIT = "logit"     # every pass of the loss runs over the logits


def _loss_pass(name: str, read_bytes: float, write_bytes: float) -> Pass:
    return Pass(name, LOGIT, read_bytes, write_bytes)


def _cast_in(eb: int) -> list[Pass]:
    return [_loss_pass("logits.float()", eb, FP32_BYTES)] if casts(eb) else []


def _cast_out(eb: int) -> list[Pass]:
    return [_loss_pass("gradient cast to the logits' dtype", FP32_BYTES, eb)] if casts(eb) else []


def loss_passes(kernel: str, activation_bytes: int) -> tuple[list[Pass], list[Pass]]:
    """(forward, backward) passes of ``kernel`` ("plain" or "fused") over the logits of one
    micro-batch, for logits of ``activation_bytes`` per element (module docstring's tables)."""
    eb = activation_bytes
    if kernel == "plain":
        forward = [*_cast_in(eb), _loss_pass("log_softmax max", 4, 0), _loss_pass("log_softmax sum exp", 4, 0),
                   _loss_pass("log_softmax output", 4, 4)]
        backward = [_loss_pass("nll_loss backward zero_", 0, 4), _loss_pass("log_softmax backward sum", 4, 0),
                    _loss_pass("log_softmax backward grad", 8, 4), *_cast_out(eb)]
        return forward, backward
    if kernel == "fused":
        forward = [*_cast_in(eb), _loss_pass("max", 4, 0), _loss_pass("sub_ max", 4, 4), _loss_pass("exp_", 4, 4),
                   _loss_pass("sum", 4, 0), _loss_pass("div_ sum", 4, 4)]
        backward = [_loss_pass("mul_ grad_output", 4, 4), *_cast_out(eb)]
        return forward, backward
    raise ValueError(f"unknown cross_entropy kernel {kernel!r} (fused | plain)")


def loss_bytes_per_logit(kernel: str, activation_bytes: int) -> tuple[float, float]:
    """(forward, backward) bytes ``kernel`` moves per logit (module docstring)."""
    forward, backward = loss_passes(kernel, activation_bytes)
    return total_bytes(forward), total_bytes(backward)


# The fused kernel's price until the calibration is refitted with its derived passes (docstring).
FUSED_PRICED_BYTES_PER_LOGIT = (12.0, 12.0)


def priced_bytes_per_logit(kernel: str, activation_bytes: int) -> tuple[float, float]:
    """(forward, backward) bytes per logit roofline.head_work charges ``kernel`` (docstring)."""
    if kernel == "fused":
        return FUSED_PRICED_BYTES_PER_LOGIT
    return loss_bytes_per_logit(kernel, activation_bytes)


def loss_details(ctx, gpu, tp: int, share: int) -> list[tuple[str, float, str]]:
    """Explain rows (term, seconds, formula) of the loss on a replica of ``tp`` GPUs of ``gpu``
    holding the head for ``share`` sequences: what roofline.head_work adds to the GEMMs."""
    from planner.cost.compute import gemm_curve_for
    memory_Bps = gemm_curve_for(ctx, gpu).memory_Bps
    logits = share * ctx.local_seq_len * ctx.model.vocab_size / tp
    rows = []
    priced = priced_bytes_per_logit(ctx.cross_entropy, ctx.activation_bytes)
    derived = loss_passes(ctx.cross_entropy, ctx.activation_bytes)
    for way, per_logit, passes in zip(("forward", "backward"), priced, derived):
        passed = total_bytes(passes)
        how = (f"passes: {', '.join(p.name for p in passes)}" if passed == per_logit else
               f"the calibration's price; its passes ({', '.join(p.name for p in passes)}) move {passed:g} B")
        formula = (f"{ctx.cross_entropy} loss: {per_logit:g} B/logit x {logits:.4g} logits (b s V / tp) / "
                   f"{memory_Bps / 1e12:.3g} TB/s; {how} (planner.cost.cross_entropy)")
        rows.append((f"cross_entropy_{way}_s", per_logit * logits / memory_Bps, formula))
    return rows
