"""The eager elementwise ops' bytes (planner.cost.elementwise), their price in a block
(roofline.block_work) and in an evaluated plan, and the training choice that selects them."""

from __future__ import annotations

import pytest

from planner import catalog
from planner.cost import CostContext, evaluate
from planner.cost.compute import gemm_curve_for
from planner.cost.elementwise import (
    WIDTHS,
    block_passes,
    bytes_per_token,
    eager_block_bytes,
    final_norm_bytes,
)
from planner.cost.roofline import BLOCK_ACTIVATION_PASSES, block_work, head_work
from planner.plan import Plan
from planner.spec import cluster_from_dict, load_model
from planner.spec.training import KERNEL_CHOICES, Training

H100 = catalog.gpu("H100-SXM5-80GB")
LLAMA = {"name": "l", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "num_kv_heads": 4,
         "ffn_hidden_size": 3584, "mlp": "swiglu", "normalization": "rmsnorm", "position_embedding": "rope",
         "linear_bias": False, "vocab_size": 32000}


def model(**kw):
    return load_model({**LLAMA, **kw})


def per_width(passes) -> dict[str, float]:
    return {w: bytes_per_token(passes, {x: float(x == w) for x in WIDTHS}) for w in WIDTHS}


def _ctx(m=None, **kw):
    return CostContext(model=m or model(), seq_len=2048, flash_attention=True, **kw)


@pytest.mark.parametrize("eb", [2, 4])
def test_eager_moves_more_than_the_fused_kernels_each_way(eb):
    m = model()
    fwd, bwd = eager_block_bytes(m, eb, 1, 1, False, m.ffn_size)
    fused = (BLOCK_ACTIVATION_PASSES * m.hidden_size + 3 * m.ffn_size) * eb
    assert fwd > fused and bwd > 2 * fused


def test_fp32_activations_skip_the_casts():
    """x.float() and type_as return the tensor itself in fp32: no cast pass is listed."""
    fwd, bwd = block_passes(model(), 4)
    assert not [p for p in fwd + bwd if "float()" in p.name or "type_as" in p.name]
    fwd, bwd = block_passes(model(), 2)
    assert [p for p in fwd + bwd if "float()" in p.name]


def test_swiglu_moves_more_per_ffn_element_than_gelu_and_the_rest_is_the_same():
    sw = [per_width(p) for p in block_passes(model(), 2)]
    ge = [per_width(p) for p in block_passes(model(mlp="gelu"), 2)]
    for s, g in zip(sw, ge):
        assert s["f"] > g["f"] > 0
        assert s["q"] == g["q"] and s["kv"] == g["kv"]
    # one gradient add fewer on the gathered b s h: GeLU has one up-projection (w1 and w3 share
    # the normed h)
    assert sw[1]["h_gathered"] - ge[1]["h_gathered"] == 3 * 2 and sw[1]["h"] == ge[1]["h"]


def test_rope_and_repeat_kv_only_where_the_model_has_them():
    mha = per_width(block_passes(model(num_kv_heads=16), 2)[0])
    gqa = per_width(block_passes(model(), 2)[0])
    learned = per_width(block_passes(model(position_embedding="learned", num_kv_heads=16), 2)[0])
    assert gqa["q"] > mha["q"] > learned["q"] == 0   # repeat_kv writes q-sized copies of k and v
    assert learned["kv"] == 0


@pytest.mark.parametrize("sp", [True, False])
def test_tp_divides_as_the_fused_path_does(sp):
    """q, kv and f divide by tp; b s h only with sequence parallelism, as roofline's fused term."""
    m = model()
    one = eager_block_bytes(m, 2, 4096, 1, sp, m.ffn_size)
    two = eager_block_bytes(m, 2, 4096, 2, sp, m.ffn_size)
    fwd, _ = block_passes(m, 2)
    h_part = 4096 * m.hidden_size * per_width(fwd)["h"]
    assert two[0] == pytest.approx(one[0] / 2 if sp else h_part + (one[0] - h_part) / 2)
    curve = gemm_curve_for(_ctx(), H100)
    for eager, fused in ((block_work(_ctx(elementwise="eager", sequence_parallel=sp), curve, t, 2),
                          block_work(_ctx(sequence_parallel=sp), curve, t, 2)) for t in (1, 2)):
        assert eager.elementwise_forward_s > fused.elementwise_forward_s


def test_sequence_parallel_leaves_the_gathered_inputs_gradient_adds_whole():
    """Under sequence parallelism torchtitan's TP plan shards the norms and residual adds over the
    sequence but all-gathers the normed x and h before wq / wk / wv and w1 / w3 (PrepareModuleInput
    Shard(1) -> Replicate): the gradients those linears send back are added on the whole b s h on
    every GPU, before the all-gather's backward reduce-scatters them.  So of the 214 B per h element
    a bf16 Llama block's backward moves (module docstring), the three adds' 3 x 3 x 2 B are not
    divided by tp; the forward (84 B per h element) is all sequence-sharded."""
    m, tokens, tp = model(), 4096, 4
    fwd_sp, bwd_sp = eager_block_bytes(m, 2, tokens, tp, True, m.ffn_size)
    fwd_whole, bwd_whole = eager_block_bytes(m, 2, tokens, tp, False, m.ffn_size)
    gathered_adds = 3 * (2 * 2 + 2)
    assert fwd_whole - fwd_sp == pytest.approx(tokens * 84 * m.hidden_size * (1 - 1 / tp))
    assert bwd_whole - bwd_sp == pytest.approx(tokens * (214 - gathered_adds) * m.hidden_size * (1 - 1 / tp))


def test_block_work_charges_the_eager_bytes_and_the_backward_apart():
    ctx = _ctx(elementwise="eager")
    curve = gemm_curve_for(ctx, H100)
    work = block_work(ctx, curve, 1, 2)
    fwd, bwd = eager_block_bytes(ctx.model, 2, 2 * 2048, 1, False, ctx.model.ffn_size)
    assert work.elementwise_forward_s == pytest.approx(fwd / curve.memory_Bps)
    assert work.elementwise_backward == pytest.approx(bwd / curve.memory_Bps)
    fused = block_work(_ctx(), curve, 1, 2)
    assert fused.elementwise_backward == pytest.approx(2 * fused.elementwise_forward_s)
    assert work.forward_s - fused.forward_s == pytest.approx(work.elementwise_forward_s - fused.elementwise_forward_s)
    assert work.backward_s - fused.backward_s == pytest.approx(work.elementwise_backward - fused.elementwise_backward)


def test_op_recompute_redoes_the_eager_forward():
    curve = gemm_curve_for(_ctx(), H100)
    eager = block_work(_ctx(elementwise="eager", recompute="op"), curve, 1, 2)
    fused = block_work(_ctx(recompute="op"), curve, 1, 2)
    assert eager.op_recompute_forward_s - fused.op_recompute_forward_s == pytest.approx(
        eager.elementwise_forward_s - fused.elementwise_forward_s)


def test_the_head_prices_an_eager_final_norm():
    curve = gemm_curve_for(_ctx(), H100)
    e, f = head_work(_ctx(elementwise="eager"), curve, 1, 2), head_work(_ctx(), curve, 1, 2)
    h_elems = 2 * 2048 * LLAMA["hidden_size"]
    norm_fwd, norm_bwd = final_norm_bytes(model(), 2)
    assert e[0] - f[0] == pytest.approx((norm_fwd - 4 * 2) * h_elems / curve.memory_Bps)
    assert e[1] - f[1] == pytest.approx((norm_bwd - 8 * 2) * h_elems / curve.memory_Bps)


CLUSTER = {"name": "one", "nodes": [{"name": "h", "count": 1, "gpu": "H100-SXM5-80GB", "gpus_per_node": 8,
                                     "network_bandwidth": "400 Gbit/s", "price_per_hour": 10.0}]}


# Llama-3-8B's block shape (two blocks): its GPU work is well over the launch floor, which a block
# too small would pay instead (compute._block_roofline), hiding the elementwise term
BIG = {**LLAMA, "num_layers": 2, "hidden_size": 4096, "num_attention_heads": 32, "num_kv_heads": 8,
       "ffn_hidden_size": 14336}


def _one_gpu_plan(**training) -> Plan:
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "one", "model": BIG,
                   "training": {"global_batch_size": 8, "seq_len": 2048, "precision": "bf16",
                                "attention": "flash", **training}},
        "micro_batch_size": 2, "num_micro_batches": 4, "schedule": "1f1b", "recompute": "none",
        "zero_stage": 0, "sequence_parallel": False,
        "stages": [{"index": 0, "blocks": [0, 2], "embedding": True, "head": True, "replicas": [
            {"gpu_type": "H100-SXM5-80GB", "tp": 1, "micro_batch_share": 2, "devices": ["h-0:0"]}]}]})


def test_an_evaluated_eager_plan_is_slower_by_its_bytes_per_block_and_micro_batch():
    cluster = cluster_from_dict(CLUSTER)
    eager, fused = evaluate(cluster, _one_gpu_plan(elementwise="eager")), evaluate(cluster, _one_gpu_plan())
    big = load_model(BIG)
    curve = gemm_curve_for(_ctx(big), H100)
    e, f = block_work(_ctx(big, elementwise="eager"), curve, 1, 2), block_work(_ctx(big), curve, 1, 2)
    floor = _ctx(big).calibration.for_gpu(H100).layer_overhead_s
    assert f.forward_s > floor and f.backward_s > 2 * floor
    he, hf = head_work(_ctx(big, elementwise="eager"), curve, 1, 2), head_work(_ctx(big), curve, 1, 2)
    per_micro_batch = 2 * (e.forward_s + e.backward_s - f.forward_s - f.backward_s) + sum(he) - sum(hf)
    assert eager.iteration_time_s - fused.iteration_time_s == pytest.approx(4 * per_micro_batch, rel=1e-6)
    rows = {term: (value, formula) for term, value, formula in eager.details}
    assert rows["elementwise_forward_s"][0] == pytest.approx(e.elementwise_forward_s)
    assert "planner.cost.elementwise" in rows["elementwise_backward_s"][1]
    fused_rows = {term: formula for term, _, formula in fused.details}
    assert "fused kernels" in fused_rows["elementwise_forward_s"]


def test_the_choice_is_a_kernel_choice_plans_carry_off_its_default():
    assert "elementwise" in KERNEL_CHOICES
    base = {"global_batch_size": 8, "seq_len": 2048}
    assert "elementwise" not in Training(**base).io_mapping()
    assert Training(**base, elementwise="eager").io_mapping()["elementwise"] == "eager"
    eager = _one_gpu_plan(elementwise="eager")
    assert Plan.from_json(eager.to_json()).training_choice("elementwise") == "eager"
    assert _one_gpu_plan().training_choice("elementwise") == "fused"
