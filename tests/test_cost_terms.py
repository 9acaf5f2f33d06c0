"""Each cost term against a hand calculation (FLOPs, ring all-reduce, schedules, memory)."""

from __future__ import annotations

import math

import pytest

from planner import catalog
from planner.catalog.benchmarks import matmul_ceiling
from planner.cost import CostContext, pipeline_breakdown, pipeline_time_s, ring_allreduce_s
from planner.cost.calibration import Calibration, GpuCalibration
from planner.cost.comm import (
    boundary_bytes,
    boundary_time_s,
    dp_exposed_s,
    dp_sync_time_s,
    ring_reduce_scatter_s,
)
from planner.cost.compute import matmul_efficiency, replica_compute
from planner.cost.flops import block_params, model_flops_per_iteration, total_params
from planner.cost.gemm import Gemm
from planner.cost.memory import (
    block_activation_bytes,
    bytes_per_param,
    in_flight_micro_batches,
    replica_memory,
)
from planner.cost.schedule import StageTiming
from planner.spec import load_model


def gpt(**kw):
    base = {"name": "t", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "vocab_size": 50257}
    base.update(kw)
    return load_model(base)


# -- FLOPs ------------------------------------------------------------------------------------

def test_gpt3_175b_flops_match_6_params_tokens_plus_attention():
    m = catalog.model("gpt3-175b")
    B, s = 1536, 2048
    flops = model_flops_per_iteration(m, B, s)
    params = total_params(m)
    assert 170e9 < params < 180e9
    # 6 N T for the weights + 12 L s^2 h per sequence for the attention scores (Kaplan et al.)
    expected = 6 * params * B * s + 12 * m.num_layers * s * s * m.hidden_size * B
    assert flops == pytest.approx(expected, rel=0.02)


def test_gpt_flops_equal_narayanan_formula_exactly():
    m = gpt(num_layers=24, hidden_size=2048, num_attention_heads=16)
    B, s, L, h, V = 64, 1024, 24, 2048, 50257
    narayanan = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert model_flops_per_iteration(m, B, s) == pytest.approx(narayanan, rel=1e-12)


def test_gqa_and_swiglu_change_the_block():
    mha = gpt(ffn_hidden_size=4096)
    gqa = gpt(ffn_hidden_size=4096, num_kv_heads=4)
    swi = gpt(ffn_hidden_size=4096, mlp="swiglu")
    h = 1024
    assert block_params(mha) - block_params(gqa) > 2 * h * (h - h // 4) - 4 * h  # smaller K, V
    assert block_params(swi) - block_params(mha) >= h * 4096 - 3 * h - 4096 * 2


# -- communication ------------------------------------------------------------------------------

def test_ring_allreduce_formula():
    S, B = 1e9, 100e9
    for n in (2, 4, 8, 64):
        assert ring_allreduce_s(S, n, B) == pytest.approx(2 * (n - 1) / n * S / B)
        assert ring_allreduce_s(S, n, B, 1e-5) == pytest.approx(2 * (n - 1) / n * S / B + 2 * (n - 1) * 1e-5)
        assert ring_reduce_scatter_s(S, n, B) == pytest.approx((n - 1) / n * S / B)
    assert ring_allreduce_s(S, 1, B) == 0.0


def _ctx(model=None, **kw):
    cal = Calibration(architectures={"ampere": GpuCalibration()})
    cal = cal.with_comm(cal.comm.__class__(inter_eff=1.0, inter_latency_s=0.0))
    return CostContext(model=model or gpt(), seq_len=1024, calibration=cal, **kw)


def test_dp_sync_zero1_moves_grads_then_params():
    ctx = _ctx(precision="bf16")
    P, n, bw = 1e9, 8, 25e9
    plain = dp_sync_time_s(ctx, P, n, 1, bw, 0.0)
    assert plain == pytest.approx(2 * 7 / 8 * P * 4 / bw)  # fp32 grads with bf16 (Megatron)
    z1 = dp_sync_time_s(_ctx(precision="bf16", zero_stage=1), P, n, 1, bw, 0.0)
    assert z1 == pytest.approx(7 / 8 * P * 4 / bw + 7 / 8 * P * 2 / bw)
    # two TP ranks: two concurrent rings, each carrying half
    assert dp_sync_time_s(ctx, P, n, 2, bw, 0.0) == pytest.approx(plain / 2)
    assert dp_exposed_s(ctx, 1.0, 0.3) == pytest.approx(0.7)
    assert dp_exposed_s(_ctx(grad_reduce_overlap=False), 1.0, 0.3) == 1.0
    # ZeRO-1: reduce-scatter (4 of 6 bytes) behind the last backward, all-gather behind the first forward
    assert dp_exposed_s(_ctx(zero_stage=1), 1.2, 0.3, 0.1) == pytest.approx((0.8 - 0.3) + (0.4 - 0.1))


def test_tp_collective_at_published_nccl_bus_bandwidth():
    """Inside a node a TP all-reduce runs at the architecture's nccl-tests bus bandwidth, not the
    NVLink line rate, and pays NCCL's per-step latency plus the stack's per-collective cost."""
    from planner.catalog.benchmarks import collective_figures
    from planner.cost.comm import tp_collective_s
    a100, h100 = catalog.gpu("A100-SXM4-80GB"), catalog.gpu("H100-SXM5-80GB")
    fig = collective_figures("ampere")
    assert 0.6 < fig.busbw_fraction < 0.75 and "nccl-tests" in fig.source
    assert collective_figures("hopper").busbw_fraction > fig.busbw_fraction
    S, tp = 64e6, 8
    want = ring_allreduce_s(S, tp, a100.intra_node_bandwidth_Bps * fig.busbw_fraction, fig.intra_step_latency_s)
    got = tp_collective_s(_ctx(), S, tp, a100.intra_node_bandwidth_Bps, a100)
    assert got == pytest.approx(want + GpuCalibration().collective_overhead_s)
    assert got > ring_allreduce_s(S, tp, a100.intra_node_bandwidth_Bps)  # slower than line rate
    assert tp_collective_s(_ctx(), S, tp, h100.intra_node_bandwidth_Bps, h100) < got


def test_tp_comm_overlap_hides_behind_gemms():
    gpu = catalog.gpu("A100-SXM4-80GB")
    plain = replica_compute(_ctx(), gpu, 50e9, 8, 1, 4)
    hidden = replica_compute(_ctx(tp_comm_overlap=True), gpu, 50e9, 8, 1, 4)
    assert plain.tp_comm_s > 0 and hidden.tp_comm_s < plain.tp_comm_s
    assert hidden.forward_s == plain.forward_s


def test_boundary_between_uneven_replica_counts():
    # 3 replicas (shares 2, 1, 1) send to 2 replicas (shares 2, 2) of the next stage
    moves = boundary_bytes([2, 1, 1], [2, 2], 10.0)
    assert moves == [(0, 0, 20.0), (1, 1, 10.0), (2, 1, 10.0)]
    # receiver 1 gets two transfers one after the other: it is the bottleneck
    assert boundary_time_s([(i, j, b / 10) for i, j, b in moves]) == pytest.approx(2.0)


# -- schedules --------------------------------------------------------------------------------

@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 32), (4, 4)])
def test_1f1b_bubble_fraction_equal_stages(p, m):
    f, b = 1.0, 2.0
    stages = [StageTiming(forward_s=f, backward_s=b, compute_s=f + b) for _ in range(p)]
    t = pipeline_time_s(stages, m, "1f1b")
    assert t == pytest.approx((m + p - 1) * (f + b))
    bd = pipeline_breakdown(stages, m, "1f1b")
    assert bd["bubble"] / bd["compute"] == pytest.approx((p - 1) / m)
    assert pipeline_time_s(stages, m, "gpipe") == pytest.approx(t)
    for v in (2, 4):
        ti = pipeline_time_s(stages, m, "interleaved-1f1b", v)
        assert ti == pytest.approx((m + (p - 1) / v) * (f + b))


def test_gpipe_unequal_stages_is_a_flow_shop():
    stages = [StageTiming(forward_s=f, backward_s=b) for f, b in [(1, 2), (3, 1), (2, 2)]]
    m = 5
    # forward flow shop: sum + (m-1) max; backward likewise
    assert pipeline_time_s(stages, m, "gpipe") == pytest.approx((6 + 4 * 3) + (5 + 4 * 2))


def test_breakdown_sums_to_iteration_time_with_sync_and_optimizer():
    stages = [StageTiming(forward_s=1, backward_s=2, send_forward_s=0.1, compute_s=2.5, recompute_s=0.3,
                          tp_comm_s=0.2, dp_sync_exposed_s=0.5, optimizer_s=0.05),
              StageTiming(forward_s=1.5, backward_s=2.5, send_backward_s=0.1, compute_s=3.5,
                          recompute_s=0.4, tp_comm_s=0.1, dp_sync_exposed_s=0.2, optimizer_s=0.07)]
    bd = pipeline_breakdown(stages, 8, "1f1b")
    from planner.cost import iteration_time_s
    assert sum(bd.values()) == pytest.approx(iteration_time_s(stages, 8, "1f1b"))
    assert bd["compute"] == pytest.approx(8 * 3.5) and bd["dp_sync_exposed"] == 0.5
    assert bd["optimizer"] == 0.07 and bd["pp_comm"] == pytest.approx(8 * 0.1)
    assert min(bd.values()) >= 0


# -- memory -----------------------------------------------------------------------------------

@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_activation_memory_matches_korthikanti(t):
    m = gpt(num_layers=24, hidden_size=2048, num_attention_heads=16)
    s, b, h, a = 1024, 4, 2048, 16
    sbh = s * b * h
    no_sp = _ctx(m, flash_attention=False, sequence_parallel=False)
    sp = _ctx(m, flash_attention=False, sequence_parallel=True)
    assert block_activation_bytes(no_sp, t, b, "none") == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    if t > 1:
        assert block_activation_bytes(sp, t, b, "none") == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
        assert block_activation_bytes(sp, t, b, "selective") == pytest.approx(sbh * 34 / t)
        assert block_activation_bytes(sp, t, b, "full") == pytest.approx(2 * sbh / t)
    assert block_activation_bytes(no_sp, t, b, "selective") == pytest.approx(sbh * (10 + 24 / t))
    assert block_activation_bytes(no_sp, t, b, "full") == pytest.approx(2 * sbh)


def test_bytes_per_param_and_in_flight():
    assert sum(bytes_per_param("bf16")) == 18 and sum(bytes_per_param("fp16")) == 20
    assert [in_flight_micro_batches("1f1b", 4, s, 16) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight_micro_batches("1f1b", 8, 0, 3) == 3
    assert in_flight_micro_batches("gpipe", 4, 2, 16) == 16
    # Megatron interleaved warm-up: (p - s - 1) * 2 + (v - 1) * p + 1 chunks of 1/v
    assert in_flight_micro_batches("interleaved-1f1b", 4, 0, 16, 2) == pytest.approx((6 + 4 + 1) / 2)


def test_replica_memory_zero1_shards_optimizer_state():
    gpu = catalog.gpu("A100-SXM4-80GB")
    m = gpt(num_layers=8)
    plain = replica_memory(_ctx(m), gpu, 2, 1, 8, True, True, 4, 1)
    z1 = replica_memory(_ctx(m, zero_stage=1), gpu, 2, 1, 8, True, True, 4, 1)
    assert z1.optimizer_bytes == pytest.approx(plain.optimizer_bytes / 4)
    assert z1.weights_bytes == plain.weights_bytes
    # untied: embedding table and output projection are separate V x h matrices
    assert plain.weights_bytes == pytest.approx(2 * (8 * block_params(m) + 2 * 50257 * 1024 + 2 * 1024) / 2)


@pytest.mark.parametrize("tp, in_flight", [(1, 1), (2, 3)])
def test_plain_cross_entropy_holds_two_more_fp32_logit_tensors(tp, in_flight):
    """torchtitan's F.cross_entropy on an fp32 copy (Training.cross_entropy plain): beside the
    4-byte log-probabilities kept per micro-batch in flight, the backward of one micro-batch holds
    8 more bytes per logit; the head stage only, and nothing else moves."""
    gpu = catalog.gpu("A100-SXM4-80GB")
    m = gpt(num_layers=8)
    args = (gpu, tp, 2, 4, False, True, 4, in_flight)
    fused = replica_memory(_ctx(m), *args)
    plain = replica_memory(_ctx(m, cross_entropy="plain"), *args)
    logits = 2 * 1024 * 50257 / tp            # share 2 x seq 1024 x vocab over tp
    assert plain.activations_bytes - fused.activations_bytes == pytest.approx(8 * logits)
    assert plain.weights_bytes == fused.weights_bytes
    middle = (gpu, tp, 2, 4, False, False, 4, in_flight)
    assert replica_memory(_ctx(m, cross_entropy="plain"), *middle) == replica_memory(_ctx(m), *middle)


def test_interleaved_holds_one_micro_batchs_logits_at_the_head():
    """Megatron's interleaved order runs each micro-batch's last-chunk forward and backward back
    to back on the last rank, so its head holds one micro-batch's fp32 logits, not the stage's
    (p + 1) / 2 in flight; 1F1B's last stage holds one anyway, GPipe m."""
    from planner.cost.memory import logits_in_flight
    gpu = catalog.gpu("A100-SXM4-80GB")
    m = gpt(num_layers=8)
    p, mb = 8, 16
    inflight = in_flight_micro_batches("interleaved-1f1b", p, p - 1, mb, 2)
    assert inflight == pytest.approx((p + 1) / 2)
    args = (gpu, 1, 2, 4, False, True, 4, inflight)
    stage_count = replica_memory(_ctx(m), *args)
    one = replica_memory(_ctx(m), *args, logits_in_flight("interleaved-1f1b"))
    logits = 2 * 1024 * 50257                 # share 2 x seq 1024 x vocab
    assert stage_count.activations_bytes - one.activations_bytes == pytest.approx(4 * logits * (inflight - 1))
    assert logits_in_flight("1f1b") is None and logits_in_flight("gpipe") is None
    assert in_flight_micro_batches("1f1b", p, p - 1, mb) == 1


def test_the_search_prices_the_interleaved_heads_memory_as_evaluate_does():
    """The search's memory model (space.Pricer.memory_model) and evaluate both take the head's
    logits once under interleaving: the model at the last stage's in-flight count equals
    evaluate's peak of that stage."""
    from planner.cost import evaluate, topology_for
    from planner.plan import Plan
    from planner.search.classes import class_infos
    from planner.search.knobs import Knobs, OptionKey, make_context
    from planner.search.space import Pricer
    from planner.spec import Training, cluster_from_dict
    model = load_model("llama3-8b")
    cluster = cluster_from_dict({"name": "two", "nodes": [{"name": "a", "count": 2, "gpu": "A100-SXM4-80GB",
                                                           "gpus_per_node": 8}]})
    training = Training(global_batch_size=32, seq_len=4096)
    p, m, v = 2, 16, 2
    knobs = Knobs(2, m, "interleaved-1f1b", v, "selective", 1, p)
    ctx = make_context(model, training, knobs)
    classes = class_infos(topology_for(cluster), training.precision)
    pricer = Pricer(model, training, classes, topology_for(cluster))
    key = OptionKey(0, 8, 1)
    _, _, mem = pricer.memory_model(ctx, knobs, key, 2, False, True)
    f_last = in_flight_micro_batches("interleaved-1f1b", p, p - 1, m, v)
    blocks = model.num_layers // 2
    stages = [{"index": s, "blocks": [s * blocks, (s + 1) * blocks], "embedding": s == 0, "head": s == 1,
               "replicas": [{"gpu_type": "A100-SXM4-80GB", "tp": 8, "micro_batch_share": 2,
                             "devices": [f"a-{s}:{g}" for g in range(8)]}]} for s in range(p)]
    plan = Plan.from_json({"schema": "planner.plan/v1",
                           "inputs": {"cluster": "two", "model": model.to_mapping(),
                                      "training": {"global_batch_size": 32, "seq_len": 4096, "attention": "flash"}},
                           "micro_batch_size": 2, "num_micro_batches": m, "schedule": "interleaved-1f1b",
                           "virtual_stages": v, "recompute": "selective", "zero_stage": 1, "sequence_parallel": True,
                           "stages": stages})
    ev = evaluate(cluster, plan, check=False)
    assert mem(blocks // 2, f_last) == pytest.approx(ev.peak_memory_bytes["a-1:0"])


def test_the_cross_entropy_choice_travels_with_the_plan():
    from planner.spec import Training
    t = Training(global_batch_size=8, seq_len=1024, cross_entropy="plain")
    assert t.io_mapping()["cross_entropy"] == "plain"
    assert "cross_entropy" not in Training(global_batch_size=8, seq_len=1024).io_mapping()   # bytes kept


# -- compute ----------------------------------------------------------------------------------

def test_efficiency_saturates_and_replica_time_scales_with_blocks():
    gpu = catalog.gpu("A100-SXM4-80GB")
    ctx = _ctx()
    effs = [matmul_efficiency(ctx, gpu, Gemm("g", n, 1024, 1024)) for n in (128, 1024, 8192, 65536)]
    assert effs == sorted(effs) and effs[0] < 0.5 * effs[-1]
    assert effs[-1] <= matmul_ceiling(gpu.name).fraction  # never above the published benchmark
    one = replica_compute(ctx, gpu, 300e9, 2, 2, 1)
    four = replica_compute(ctx, gpu, 300e9, 2, 2, 4)
    assert four.total_s == pytest.approx(4 * one.total_s + 0 * one.total_s, rel=0.25)
    assert four.backward_s == pytest.approx(2 * four.forward_s, rel=0.2)


class FakeProfiles:
    def lookup(self, gpu_name, layer_kind, micro_batch, tp, seq_len, model):
        return (0.01, 0.02) if layer_kind == "block" else None


def test_profile_replaces_roofline_and_is_recorded():
    gpu = catalog.gpu("A100-SXM4-80GB")
    ctx = _ctx(profiles=FakeProfiles())
    rt = replica_compute(ctx, gpu, 300e9, 1, 4, 3, embedding=True)
    assert rt.forward_s >= 0.03 and rt.backward_s >= 0.06
    assert ctx.sources["A100-SXM4-80GB/block/mb4/tp1"] == "measured"
    assert ctx.sources["A100-SXM4-80GB/embedding/mb4/tp1"] == "estimated"
    assert math.isfinite(rt.total_s)


@pytest.mark.parametrize("recompute, extra", [("none", 8.0), ("selective", 8.0), ("full", 0.0), ("op", 0.0)])
def test_eager_norms_keep_their_fp32_input_and_output(recompute, extra):
    """An eager RMSNorm saves x.float() and its normalized output (4 more bytes per element
    than a fused norm's input), twice a block, where the norms are not recomputed; with
    sequence parallel they hold the 1/tp shard."""
    m = gpt(mlp="swiglu", num_kv_heads=4)
    for tp, sp in ((1, False), (4, True)):
        fused = _ctx(m, recompute=recompute, sequence_parallel=sp)
        eager = _ctx(m, recompute=recompute, sequence_parallel=sp, elementwise="eager")
        sbh = 1024 * 2 * 1024
        diff = (block_activation_bytes(eager, tp, 2, recompute) - block_activation_bytes(fused, tp, 2, recompute))
        assert diff == pytest.approx(extra * sbh / (tp if sp else 1))


def test_the_final_norm_runs_on_the_sequence_parallel_shard():
    """With sequence parallel the head's norm reads and writes the 1/tp shard (Megatron-Core's
    final_layernorm, torchtitan's TP plan), so only its memory-bound bytes shrink by tp."""
    from planner.cost.compute import gemm_curve_for
    from planner.cost.roofline import head_work
    gpu = catalog.gpu("A100-SXM4-80GB")
    m = gpt()
    whole, shard = _ctx(m, sequence_parallel=False), _ctx(m, sequence_parallel=True)
    curve = gemm_curve_for(whole, gpu)
    eb, h_elems = whole.activation_bytes, 2 * 1024 * m.hidden_size
    for tp in (1, 4):
        f_whole, b_whole = head_work(whole, curve, tp, 2)
        f_shard, b_shard = head_work(shard, curve, tp, 2)
        saved = 1 - 1 / tp                    # the fused norm: 4 / 8 elements of eb bytes
        assert f_whole - f_shard == pytest.approx(4 * eb * h_elems * saved / curve.memory_Bps)
        assert b_whole - b_shard == pytest.approx(8 * eb * h_elems * saved / curve.memory_Bps)
