"""When Megatron's fused scale-mask-softmax runs, and what its PyTorch fallback moves instead.

Without flash attention (``attention: unfused``) Megatron scales, masks and normalises the
attention scores with ``FusedScaleMaskSoftmax``: one CUDA kernel each way, a read and a write
of the 16-bit scores forward, the gradient and the saved output read and the gradient written
backward.  The kernel only runs when its shape rule holds (``is_kernel_available`` in
Megatron-LM ``megatron/core/fusions/fused_softmax.py``; the same rule in Megatron-DeepSpeed
``megatron/model/fused_softmax.py`` and apex):

- 16-bit inputs (fp16 / bf16);
- ``16 < sk <= 4096`` keys (Megatron-DeepSpeed of 2022-23: ``<= 2048``), ``sq % 4 == 0``,
  ``sk % 4 == 0``;
- ``b * np`` (micro-batch sequences x heads on this TP rank) a multiple of 4, and for the causal
  mask a multiple of the kernel's batches per 128-thread block: 4 where ``sk > 128`` (one row
  per 32-thread warp), 8 from 17 to 128 keys (two rows per warp).

Otherwise it takes the PyTorch path.  With query-key layer scaling (Megatron's default before
Megatron-Core; it forces the softmax into fp32) that is five kernels forward, bytes per score:
the cast up to fp32 (read 2, write 4), the scale by the layer number (4 + 4), the in-place
causal ``masked_fill_`` (4 + 4; the mask is one broadcast ``s x s`` tensor that stays in L2),
the softmax (4 + 4) and the cast back (4 + 2): 36 against the fused kernel's 4.  Their autograd
backward: the cast's (2 + 4), the softmax backward (read the gradient and the fp32 output,
write: 12), the mask's (4 + 4), the scale's (4 + 4) and the cast's (4 + 2): 40 against 6.  With
4-byte activations there are no casts: 24 and 28 against 8 and 12 (roofline.py's older "4
passes more each way").  So 16-bit runs pay 32 bytes more forward and 34 backward, on each of
``a s^2 b / tp`` elements, and four more kernel launches each way (five kernels, and five
autograd nodes, where the fused path launches one): in a launch-bound block (small shards,
where the block's floor and not its GPU work sets its time, compute.py) the launches are what
shows.  vtrain-single's tp 8 micro-batch 1 rows (16 heads: ``b * np = 2``) are such runs.
"""

from __future__ import annotations

MAX_KEYS = 4096                 # Megatron-LM / Megatron-Core; Megatron-DeepSpeed of 2023: 2048
FALLBACK_EXTRA_KERNELS = 4      # launches beyond the fused kernel's one, forward and backward alike
THREADS_PER_BLOCK = 128
WARP_SIZE = 32


def batches_per_block(keys: int) -> int:
    """Rows of scores one 128-thread block of the fused causal kernel normalises: a warp per
    row (two rows per warp up to 128 keys), fewer threads per warp below 32 keys."""
    width = 1 << max(0, (keys - 1).bit_length())        # the next power of two
    warp = min(width, WARP_SIZE)
    return (THREADS_PER_BLOCK // warp) * (2 if width <= 128 else 1)


def softmax_refusal(activation_bytes: int, sequences: float, heads_per_rank: float,
                    queries: float, keys: float) -> str | None:
    """Why Megatron's fused scale-mask-softmax kernel does not take these causal scores (module
    docstring), or None when it does."""
    if activation_bytes != 2:
        return f"{activation_bytes}-byte inputs: the kernel takes fp16 / bf16 only"
    attn_batches = sequences * heads_per_rank
    if attn_batches != int(attn_batches) or queries != int(queries) or keys != int(keys):
        return None         # an averaged stand-in, not a launched shape: price the common case
    keys, queries, attn_batches = int(keys), int(queries), int(attn_batches)
    if not 16 < keys <= MAX_KEYS:
        return f"{keys} keys: the kernel takes 17 to {MAX_KEYS}"
    if queries % 4 or keys % 4:
        return f"sequence {queries} x {keys}: the kernel needs multiples of 4"
    per_block = batches_per_block(keys)
    if attn_batches % 4 or attn_batches % per_block:
        return (f"micro-batch {sequences:g} x {heads_per_rank:g} heads per TP rank = {attn_batches}: "
                f"the kernel needs a multiple of {max(4, per_block)}")
    return None


def fused_softmax_runs(activation_bytes: int, sequences: float, heads_per_rank: float,
                       queries: float, keys: float) -> bool:
    """Whether Megatron's fused scale-mask-softmax kernel takes these causal scores; False sends
    them down the PyTorch path."""
    return softmax_refusal(activation_bytes, sequences, heads_per_rank, queries, keys) is None


def fallback_extra_bytes(activation_bytes: int) -> tuple[float, float]:
    """(forward, backward) bytes per score element the PyTorch path moves beyond the fused
    kernel's (module docstring)."""
    casts = 0.0 if activation_bytes >= 4 else 2 * (activation_bytes + 4)   # up and back down
    fused_fwd, fused_bwd = 2.0 * activation_bytes, 3.0 * activation_bytes
    unfused_fwd = casts + 3 * 8.0          # scale, mask, softmax: read and write 4 bytes each
    unfused_bwd = casts + 12.0 + 2 * 8.0   # softmax backward reads two; mask and scale
    return unfused_fwd - fused_fwd, unfused_bwd - fused_bwd


def fallback_saved_extra_bytes(activation_bytes: int) -> float:
    """Bytes per score element the PyTorch path keeps beyond the fused kernel: the softmax
    saves its fp32 output where the kernel saves its 16-bit one."""
    return 4.0 - activation_bytes if activation_bytes < 4 else 0.0
