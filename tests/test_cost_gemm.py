"""The per-GEMM compute model: shapes, FLOPs, the curve's anchor at the published benchmark."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner import catalog
from planner.catalog.benchmarks import matmul_ceiling
from planner.cost.calibration import default_calibration
from planner.cost.context import CostContext
from planner.cost.flops import block_forward_flops, head_forward_flops
from planner.cost.gemm import Gemm, gemm_curve
from planner.cost.roofline import FLASH_BACKWARD_CORE_FACTOR, block_gemms, block_work, head_gemm
from planner.spec import load_model


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-175b", "opt-350m"])
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_block_gemms_add_up_to_the_block_flops(name, tp):
    """The GEMM table is the same model as flops.py's closed form (Narayanan et al., GQA, SwiGLU)."""
    m = load_model(name)
    b, s = 2, 2048
    gemms = block_gemms(m, b, s, tp)
    assert sum(g.flops for g in gemms) * tp == pytest.approx(block_forward_flops(m, b, s).total_flops)
    core = [g for g in gemms if g.name.startswith("attn.") and g.name != "attn.out"]
    assert sum(g.flops for g in core) * tp == pytest.approx(block_forward_flops(m, b, s).attention_flops)
    assert head_gemm(m, b, s, tp).flops * tp == pytest.approx(head_forward_flops(m, b, s))


def test_backward_gemms_have_their_own_shapes_and_twice_the_flops():
    g = Gemm("x", 4096, 1024, 8192)
    d, w = g.dgrad(), g.wgrad()
    assert (d.m, d.n, d.k) == (4096, 8192, 1024)      # dA = dC B^T: M x K, reduce over N
    assert (w.m, w.n, w.k) == (8192, 1024, 4096)      # dB = A^T dC: K x N, reduce over M
    assert d.flops + w.flops == pytest.approx(2 * g.flops)


def test_curve_passes_through_the_published_benchmark_and_never_above():
    """In bf16 through the MAMF times the training-shape factor (0.90, benchmarks.yaml), never
    above it; in tf32 through the MAMF itself (the factor is measured in 2-byte precisions)."""
    a100 = catalog.gpu("A100-SXM4-80GB")
    cal = default_calibration().for_gpu(a100)
    curve = gemm_curve(a100, "bf16", cal, 2)
    bench = matmul_ceiling(a100.name)
    assert bench.measured and bench.fraction == pytest.approx(267.9 / 312, abs=1e-3)
    assert bench.typical == 0.90 and bench.training_fraction("bf16") == pytest.approx(0.90 * bench.fraction)
    assert bench.training_fraction("tf32") == bench.fraction == bench.training_fraction("fp32")
    top = bench.training_fraction("bf16")
    assert curve.efficiency(Gemm("best", *bench.shape)) == pytest.approx(top)
    assert curve.efficiency(Gemm("huge", 32768, 32768, 32768)) == pytest.approx(top)
    tf32 = gemm_curve(a100, "tf32", cal, 4)
    assert tf32.efficiency(Gemm("huge", 32768, 32768, 32768)) == pytest.approx(bench.fraction)
    small = [curve.efficiency(Gemm("g", 2048, n, 1024)) for n in (128, 512, 2048, 8192)]
    assert small == sorted(small) and small[0] < 0.5 * top
    shallow = [curve.efficiency(Gemm("g", 8192, 8192, k)) for k in (32, 128, 512, 4096)]
    assert shallow == sorted(shallow)


def test_skinny_gemm_is_memory_bound():
    a100 = catalog.gpu("A100-SXM4-80GB")
    curve = gemm_curve(a100, "bf16", default_calibration().for_gpu(a100), 2)
    g = Gemm("gemv", 1, 16384, 16384)            # a matrix-vector product: bytes, not FLOPs
    assert curve.time_s(g) == pytest.approx(2 * g.operand_elements() / curve.memory_Bps)


def test_precision_sets_the_peak_but_not_the_fill_size():
    a100 = catalog.gpu("A100-SXM4-80GB")
    cal = default_calibration().for_gpu(a100)
    half, fp32, tf32 = (gemm_curve(a100, p, cal, 2 if p == "bf16" else 4) for p in ("bf16", "fp32", "tf32"))
    assert half.peak_flops == pytest.approx(312e12) and fp32.peak_flops == pytest.approx(19.5e12)
    assert tf32.peak_flops == pytest.approx(156e12)
    # the wave fill counts output tiles: the same in every precision (gemm.py), so one shape
    # reaches the same fraction of each precision's own ceiling (bf16's is the training shape's,
    # 0.90 of tf32's: benchmarks.yaml)
    assert fp32.outputs_half == tf32.outputs_half == half.outputs_half
    assert half.ceiling == pytest.approx(0.90 * tf32.ceiling)
    g = Gemm("g", 2048, 768, 1024)
    assert tf32.efficiency(g) / tf32.ceiling == pytest.approx(half.efficiency(g) / half.ceiling)
    big = Gemm("g", 8192, 8192, 8192)
    assert fp32.time_s(big) > tf32.time_s(big) > half.time_s(big)


def test_the_fitted_gpus_keep_their_half_sizes():
    cal = default_calibration()
    for name, arch in (("A100-SXM4-80GB", "ampere"), ("H200-SXM-141GB", "hopper")):   # hopper: its GEMM sweep
        gpu = catalog.gpu(name)
        entry = cal.architectures[arch]
        assert entry.fitted_on == name
        for precision, nbytes in (("bf16", 2), ("fp16", 2), ("tf32", 4)):   # tf32: half the peak, twice the bytes
            curve = gemm_curve(gpu, precision, cal.for_gpu(gpu), nbytes)
            assert (curve.outputs_half, curve.depth_half) == pytest.approx((entry.gemm_outputs_half, entry.gemm_depth_half))


def test_a_slower_gpu_of_the_architecture_fills_sooner():
    """The RTX 3090 is ampere but has 71 of the A100's 312 TFLOP/s: it fills with a quarter of
    the output tiles in flight (Little's law), not with the A100's fitted size."""
    cal = default_calibration()
    rtx = catalog.gpu("RTX3090-24GB")
    a100 = cal.architectures["ampere"]
    curve = gemm_curve(rtx, "tf32", cal.for_gpu(rtx), 4)
    assert curve.outputs_half == pytest.approx(a100.gemm_outputs_half * 71 / 312)
    # its TF32 rate is (about) half its FP16 one, on operands twice as wide
    assert curve.depth_half == pytest.approx(a100.gemm_depth_half * 35.6 * 4 / (71 * 2))
    g = Gemm("qkv", 2048, 3072, 1024)
    assert curve.efficiency(g) > gemm_curve(rtx, "tf32", replace(a100, fitted_on=rtx.name), 4).efficiency(g)


def test_cuda_core_matmuls_amortise_their_k_loop_sooner():
    """FP32 on CUDA cores computes a K step 8-16x slower on operands twice as wide: the per-tile
    memory work is worth 4-8x fewer K steps (gemm.py)."""
    cal = default_calibration()
    k_half = cal.architectures["ampere"].gemm_depth_half
    a100, v100 = catalog.gpu("A100-SXM4-80GB"), catalog.gpu("V100-SXM2-16GB")
    assert gemm_curve(a100, "fp32", cal.for_gpu(a100), 4).depth_half == pytest.approx(k_half * 19.5 * 4 / (312 * 2))
    # the V100 has no TF32 tensor cores: tf32 runs at its FP32 rate
    assert gemm_curve(v100, "tf32", cal.for_gpu(v100), 4).depth_half == pytest.approx(k_half * 15.7 * 4 / (125 * 2))
    assert gemm_curve(v100, "fp16", cal.for_gpu(v100), 2).depth_half == pytest.approx(k_half)


def test_the_h200_sweep_backs_a_precision_independent_fill():
    """On the H200's own sweep, tf32 reaches about the fraction of its peak that bf16 reaches
    on the same shape (the measurement the fill size's precision independence rests on)."""
    import json
    import statistics
    from pathlib import Path
    folder = Path(__file__).parents[1] / "reference" / "device" / "h200-2026-12-04"
    by_shape: dict = {}
    for f in folder.glob("gemms-*.json"):
        d = json.loads(f.read_text())
        peak = 989.4 if d["dtype"] == "bf16" else 494.7
        for r in d["rows"]:
            if r["measured_s"] >= 50e-6:
                by_shape.setdefault((d["model"], r["name"]), {})[d["dtype"]] = r["measured_tflops"] / peak
    ratios = [v["tf32"] / v["bf16"] for v in by_shape.values() if len(v) == 2]
    assert len(ratios) > 100
    assert 0.9 < statistics.median(ratios) < 1.05


def test_fp32_activations_take_the_unfused_softmax():
    """Megatron fuses scale, mask and softmax only for 16-bit inputs (softmax.py): 16 more bytes
    per score each way in fp32 / tf32 and four more launches, none with flash attention."""
    m = load_model("opt-350m")
    gh = catalog.gpu("GH200-96GB")
    cal = default_calibration().for_gpu(gh)
    tp, share, s = 4, 8, 2048
    works = {}
    for precision in ("bf16", "tf32"):
        ctx = CostContext(model=m, seq_len=s, precision=precision)
        works[precision] = block_work(ctx, gemm_curve(gh, precision, cal, ctx.activation_bytes), tp, share)
    assert works["bf16"].softmax_fallback_forward_s == works["bf16"].softmax_fallback_backward_s == 0
    assert works["bf16"].extra_kernels == 0
    scores = m.num_attention_heads * s * s * share / tp
    expected = 16 * scores / (gh.memory_bandwidth_Bps * cal.mem_eff)
    w = works["tf32"]
    assert w.softmax_fallback_forward_s == pytest.approx(expected)
    assert w.softmax_fallback_backward_s == pytest.approx(expected)
    assert w.extra_kernels == 4
    # in the forward, the backward (once, not doubled like the fused core) and what selective recompute redoes
    base_fwd = sum(w.gemm_forward_s.values()) + w.elementwise_forward_s + w.attention_core_traffic_forward_s
    assert w.forward_s == pytest.approx(base_fwd + expected)
    base_bwd = sum(w.gemm_backward_s.values()) + 2 * (w.elementwise_forward_s + w.attention_core_traffic_forward_s)
    assert w.backward_s == pytest.approx(base_bwd + expected)
    assert w.core_forward_s > expected
    flash = CostContext(model=m, seq_len=s, precision="tf32", flash_attention=True)
    flash_work = block_work(flash, gemm_curve(gh, "tf32", cal, 4), tp, share)
    assert flash_work.softmax_fallback_forward_s == 0 and flash_work.extra_kernels == 0


def test_flash_attention_drops_the_s2_traffic_and_recomputes_scores_in_backward():
    m = load_model("gpt3-175b")
    a100 = catalog.gpu("A100-SXM4-80GB")
    plain = CostContext(model=m, seq_len=2048)
    flash = CostContext(model=m, seq_len=2048, flash_attention=True)
    curve = gemm_curve(a100, "bf16", default_calibration().for_gpu(a100), 2)
    wp, wf = block_work(plain, curve, 8, 1), block_work(flash, curve, 8, 1)
    assert wp.attention_core_traffic_forward_s > 0 and wf.attention_core_traffic_forward_s == 0
    assert wf.gemm_backward_s["attn.scores"] == pytest.approx(
        FLASH_BACKWARD_CORE_FACTOR * wf.gemm_forward_s["attn.scores"])
    assert wf.forward_s < wp.forward_s


def test_backward_splits_into_input_and_weight_gradients():
    """Zero-bubble schedules need the backward's I and W parts apart: W is the wgrad GEMMs of
    the weight matmuls (not of the attention core, which has no weights)."""
    from planner.cost.compute import backward_weight_fraction
    a100 = catalog.gpu("A100-SXM4-80GB")
    curve = gemm_curve(a100, "bf16", default_calibration().for_gpu(a100), 2)
    m = load_model("gpt3-175b")
    ctx = CostContext(model=m, seq_len=2048, flash_attention=True)
    work = block_work(ctx, curve, 8, 4)
    assert set(work.gemm_wgrad_s) == {"qkv", "attn.out", "mlp.up", "mlp.down"}
    assert 0 < work.backward_weight_s < work.backward_s
    frac = backward_weight_fraction(ctx, a100, 8, 4)
    # weight GEMMs dominate a 175B block: wgrad is close to half the backward, a bit under it
    # (the dgrad side also carries the attention core and the elementwise backward)
    assert 0.35 < frac < 0.5
    small = backward_weight_fraction(CostContext(model=load_model("opt-350m"), seq_len=2048), a100, 1, 1)
    assert small < frac  # an unfused s^2 core weighs more in a small model's backward


def test_recompute_op_redoes_torchtitans_unsaved_ops():
    """torchtitan's op policy (roofline.py): k, o and w3 of a Llama block (every second matmul),
    every elementwise op, not the fused attention core; less time than full recompute and less
    memory than selective (which with flash attention keeps all but the core's scores)."""
    from planner.cost.compute import _block_roofline
    from planner.cost.memory import block_activation_bytes
    from planner.cost.roofline import op_recomputed_fractions
    m = load_model("llama3-8b")
    h100 = catalog.gpu("H100-SXM5-80GB")
    fr = op_recomputed_fractions(m)
    assert fr["qkv"] == pytest.approx(1024 / (4096 + 2 * 1024))  # the k projection of fused q, k, v
    assert (fr["attn.out"], fr["mlp.up"], fr["mlp.down"]) == (1.0, 0.5, 0.0)
    gelu = op_recomputed_fractions(load_model("gpt3-175b"))
    assert (gelu["mlp.up"], gelu["mlp.down"]) == (0.0, 1.0)  # q, k, v, o, fc1, fc2: fc2 is second
    by_mode = {}
    for mode in ("selective", "op", "full"):
        ctx = CostContext(model=m, seq_len=8192, flash_attention=True, recompute=mode)
        curve = gemm_curve(h100, "bf16", default_calibration().for_gpu(h100), 2)
        work = block_work(ctx, curve, 1, 2)
        by_mode[mode] = (_block_roofline(ctx, h100, 1, 2)[2], block_activation_bytes(ctx, 1, 2))
        if mode == "op":
            redo = work.elementwise_forward_s + sum(f * work.gemm_forward_s[g] for g, f in fr.items())
            assert work.op_recompute_forward_s == pytest.approx(redo)
    (sel_t, sel_m), (op_t, op_m), (full_t, full_m) = by_mode["selective"], by_mode["op"], by_mode["full"]
    assert 0 < op_t < full_t
    # selective redoes the flash core's forward, op does not: at 8k tokens the core weighs more
    assert op_t < sel_t
    assert full_m < op_m < sel_m
    # saved per sequence token: input, q, v, SDPA out, w1, w2 out = (4 + 1/4) h + f elements of 2 bytes
    s, b, h, f = 8192, 2, 4096, 14336
    assert op_m == pytest.approx(2 * s * b * ((4 + 0.25) * h + f))
