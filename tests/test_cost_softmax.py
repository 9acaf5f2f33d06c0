"""Megatron's fused scale-mask-softmax rule and what its PyTorch fallback costs (softmax.py)."""

from __future__ import annotations

import pytest

from planner import catalog
from planner.cost.compute import FUSED_BLOCK_FORWARD_KERNELS, _block_roofline
from planner.cost.context import CostContext
from planner.cost.gemm import gemm_curve
from planner.cost.memory import block_activation_bytes
from planner.cost.roofline import block_work
from planner.cost.softmax import (
    FALLBACK_EXTRA_KERNELS,
    batches_per_block,
    fallback_extra_bytes,
    fused_softmax_runs,
)
from planner.spec import ModelSpec


def test_batches_per_block_follow_the_kernels_warp_layout():
    # one row per 32-thread warp above 128 keys, two up to 128, narrower warps below 32
    assert [batches_per_block(k) for k in (2048, 1024, 129)] == [4, 4, 4]
    assert [batches_per_block(k) for k in (128, 64, 33, 32)] == [8, 8, 8, 8]
    assert batches_per_block(16) == 16


@pytest.mark.parametrize("eb, b, heads, s, fused", [
    (2, 1, 2, 1024, False),    # vtrain-single at tp 8: 16 heads / 8 = 2 per rank, b * np = 2
    (2, 2, 2, 1024, True),
    (2, 1, 4, 1024, True),
    (2, 3, 2, 1024, False),    # 6 is not a multiple of 4
    (2, 1, 4, 8192, False),    # more keys than the kernel takes
    (2, 1, 4, 4096, True),
    (2, 1, 4, 16, False),
    (2, 1, 4, 1022, False),    # not a multiple of 4
    (2, 1, 4, 64, False),      # 4 rows, but 8 a block at 64 keys
    (2, 2, 4, 64, True),
    (4, 4, 8, 1024, False),    # fp32 / tf32 inputs never
])
def test_fused_softmax_rule(eb, b, heads, s, fused):
    assert fused_softmax_runs(eb, b, heads, s, s) is fused


def test_fallback_bytes_count_the_five_kernels_each_way():
    # 16-bit: casts (2+4, 4+2), scale, mask, softmax at 8 each = 36 forward against 4;
    # backward 6 + 12 + 8 + 8 + 6 = 40 against 6
    assert fallback_extra_bytes(2) == (32.0, 34.0)
    # fp32: no casts, 24 and 28 against 8 and 12
    assert fallback_extra_bytes(4) == (16.0, 16.0)


def _tiny_megatron_block(share: int):
    """A vtrain-single shape at tp 8: launch-bound, 16 heads, so b * np = 2 at micro-batch 1."""
    model = ModelSpec(name="tiny", num_layers=4, hidden_size=1024, num_attention_heads=16,
                      vocab_size=50257, max_seq_len=1024)
    ctx = CostContext(model=model, seq_len=1024, precision="fp16", recompute="full")
    gpu = catalog.gpu("A100-SXM4-80GB")
    return ctx, gpu, block_work(ctx, gemm_curve(gpu, "fp16", ctx.calibration.for_gpu(gpu), 2), 8, share)


def test_unfused_softmax_prices_its_bytes_and_launches():
    ctx, gpu, work = _tiny_megatron_block(1)
    scores = 16 * 1024 * 1024 / 8
    bw = ctx.calibration.for_gpu(gpu).mem_eff * gpu.memory_bandwidth_Bps
    assert work.softmax_fallback_forward_s == pytest.approx(32 * scores / bw)
    assert work.softmax_fallback_backward_s == pytest.approx(34 * scores / bw)
    assert work.extra_kernels == FALLBACK_EXTRA_KERNELS
    _, _, fused = _tiny_megatron_block(2)
    assert fused.extra_kernels == 0 and fused.softmax_fallback_forward_s == 0

    # launch-bound: the forward is the floor, four launches more at the fitted cost of one
    roof = _block_roofline(ctx, gpu, 8, 1)
    overhead = ctx.calibration.for_gpu(gpu).layer_overhead_s
    assert work.forward_s < overhead
    forward_s = roof[0]
    assert forward_s == pytest.approx(overhead * (1 + FALLBACK_EXTRA_KERNELS / FUSED_BLOCK_FORWARD_KERNELS))


def test_unfused_softmax_keeps_an_fp32_output_without_recompute():
    ctx, _, _ = _tiny_megatron_block(1)
    none = ctx.variant(recompute="none")
    one, two = block_activation_bytes(none, 8, 1), block_activation_bytes(none, 8, 2)
    # the fused micro-batch 2 keeps 5 bytes per score, the fallback's micro-batch 1 7 (an fp32
    # softmax output): the difference is all in the scores, 16 * 1024^2 / 8 of them a sequence
    scores = 16 * 1024 * 1024 / 8
    assert 2 * one - two == pytest.approx(2 * 2.0 * scores)


def test_explain_rows_say_why_and_what_the_fallback_costs():
    from planner.cost.explain_rows import softmax_details
    ctx, gpu, _ = _tiny_megatron_block(1)
    [(name, extra_s, text)] = softmax_details(ctx, gpu, 8, 1)
    assert name == "attention_softmax_fallback_s"
    assert "micro-batch 1 x 2 heads per TP rank = 2" in text and "multiple of 4" in text
    # launch-bound: at least the four extra launches forward, twice (full recompute), and backward
    per_launch = ctx.calibration.for_gpu(gpu).layer_overhead_s / FUSED_BLOCK_FORWARD_KERNELS
    assert extra_s >= 3 * FALLBACK_EXTRA_KERNELS * per_launch
    [(name, _, text)] = softmax_details(ctx, gpu, 8, 2)
    assert name == "attention_softmax_fused"
    assert softmax_details(ctx.variant(flash_attention=True), gpu, 8, 1) == []
