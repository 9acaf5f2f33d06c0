"""The loss kernel's passes over the logits (planner.cost.cross_entropy) and their price in the
head (roofline.head_work) and in an evaluated plan."""

from __future__ import annotations

import pytest

from planner import catalog
from planner.cost import CostContext, evaluate
from planner.cost.compute import gemm_curve_for
from planner.cost.cross_entropy import (
    FUSED_PRICED_BYTES_PER_LOGIT,
    loss_bytes_per_logit,
    loss_passes,
    priced_bytes_per_logit,
)
from planner.cost.roofline import head_gemm, head_work
from planner.plan import Plan
from planner.spec import cluster_from_dict, load_model

H100 = catalog.gpu("H100-SXM5-80GB")


def gpt(vocab=50272, **kw):
    return load_model({"name": "t", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16,
                       "vocab_size": vocab, **kw})


def _ctx(model=None, **kw):
    return CostContext(model=model or gpt(), seq_len=2048, **kw)


def test_plain_and_fused_passes_add_up_to_their_kernels():
    """bf16: PyTorch's log_softmax reads its row three times and writes once (22 B forward with
    the fp32 copy); Megatron's vocab-parallel loss runs five elementwise passes after the copy
    (38 B); backward the plain loss zero-fills the nll gradient and re-reads the log-probs (26 B)
    where Megatron scales its saved softmax in place (14 B)."""
    plain, fused = loss_bytes_per_logit("plain", 2), loss_bytes_per_logit("fused", 2)
    assert plain == (6 + 4 + 4 + 8, 4 + 4 + 12 + 6)
    assert fused == (6 + 4 + 8 + 8 + 4 + 8, 8 + 6)
    assert plain[0] < fused[0] and plain[1] > fused[1]


@pytest.mark.parametrize("kernel", ["plain", "fused"])
def test_fp32_logits_skip_the_casts(kernel):
    """``x.float()`` on fp32 logits is the tensor itself: no copy forward, no cast back."""
    f16, b16 = loss_bytes_per_logit(kernel, 2)
    f32, b32 = loss_bytes_per_logit(kernel, 4)
    assert (f16 - f32, b16 - b32) == (2 + 4, 4 + 2)
    assert all("float" not in p.name and "cast" not in p.name for way in loss_passes(kernel, 4) for p in way)


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="fused | plain"):
        loss_passes("liger", 2)


def _loss_s(ctx, tp=1, share=2):
    """(forward, backward) seconds of head_work beyond the same head with no loss bytes."""
    curve = gemm_curve_for(ctx, H100)
    g = head_gemm(ctx.model, share, ctx.seq_len, tp)
    norm = 4 * share * ctx.seq_len * ctx.model.hidden_size * ctx.activation_bytes / curve.memory_Bps
    fwd, bwd = head_work(ctx, curve, tp, share)
    return (fwd - curve.time_s(g) - norm,
            bwd - curve.time_s(g.dgrad()) - curve.time_s(g.wgrad()) - 2 * norm)


def test_plain_is_priced_at_its_passes_fused_at_the_calibrations_price():
    """The fused kernel keeps the bytes the shipped calibration was fitted with until a refit
    (module docstring); the plain one is charged exactly what its passes move."""
    assert priced_bytes_per_logit("plain", 2) == loss_bytes_per_logit("plain", 2)
    assert priced_bytes_per_logit("fused", 2) == FUSED_PRICED_BYTES_PER_LOGIT
    assert sum(priced_bytes_per_logit("fused", 2)) < sum(loss_bytes_per_logit("fused", 2))


@pytest.mark.parametrize("kernel", ["plain", "fused"])
def test_head_prices_the_chosen_kernels_bytes(kernel):
    ctx = _ctx(cross_entropy=kernel)
    logits = 2 * 2048 * ctx.model.vocab_size
    bw = gemm_curve_for(ctx, H100).memory_Bps
    fwd_b, bwd_b = priced_bytes_per_logit(kernel, 2)
    assert _loss_s(ctx) == pytest.approx((fwd_b * logits / bw, bwd_b * logits / bw))


def test_plain_is_slower_than_fused_by_the_priced_bytes_and_tp_splits_it():
    plain, fused = _ctx(cross_entropy="plain"), _ctx()
    bw = gemm_curve_for(plain, H100).memory_Bps
    logits = 2 * 2048 * plain.model.vocab_size
    dp, df = priced_bytes_per_logit("plain", 2), priced_bytes_per_logit("fused", 2)
    assert dp[0] > df[0] and dp[1] > df[1]
    for tp in (1, 2, 8):
        fp, bp = head_work(plain, gemm_curve_for(plain, H100), tp, 2)
        ff, bf = head_work(fused, gemm_curve_for(fused, H100), tp, 2)
        assert fp - ff == pytest.approx((dp[0] - df[0]) * logits / tp / bw)
        assert bp - bf == pytest.approx((dp[1] - df[1]) * logits / tp / bw)


@pytest.mark.parametrize("kernel", ["plain", "fused"])
def test_head_time_grows_with_the_vocabulary(kernel):
    small, large = _ctx(gpt(32000), cross_entropy=kernel), _ctx(gpt(128256), cross_entropy=kernel)
    assert all(a < b for a, b in zip(head_work(small, gemm_curve_for(small, H100), 1, 2),
                                     head_work(large, gemm_curve_for(large, H100), 1, 2)))
    # the loss part is linear in the vocabulary: the GEMM's efficiency is not
    ratio = [b / a for a, b in zip(_loss_s(small), _loss_s(large))]
    assert ratio == pytest.approx([128256 / 32000] * 2)


CLUSTER = {"name": "one", "nodes": [{"name": "h", "count": 1, "gpu": "H100-SXM5-80GB", "gpus_per_node": 8,
                                     "network_bandwidth": "400 Gbit/s", "price_per_hour": 10.0}]}


def _one_gpu_plan(**training) -> Plan:
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "one", "model": {"name": "toy", "num_layers": 4, "hidden_size": 1024,
                                                "num_attention_heads": 16, "vocab_size": 50272},
                   "training": {"global_batch_size": 8, "seq_len": 2048, "precision": "bf16", **training}},
        "micro_batch_size": 2, "num_micro_batches": 4, "schedule": "1f1b", "recompute": "none",
        "zero_stage": 0, "sequence_parallel": False,
        "stages": [{"index": 0, "blocks": [0, 4], "embedding": True, "head": True, "replicas": [
            {"gpu_type": "H100-SXM5-80GB", "tp": 1, "micro_batch_share": 2, "devices": ["h-0:0"]}]}]})


def test_an_evaluated_plan_pays_its_loss_kernels_bytes_per_micro_batch():
    """One stage, one GPU: plain is slower by 4 micro-batches x the two kernels' priced bytes,
    and the explain rows name the plan's kernel."""
    cluster = cluster_from_dict(CLUSTER)
    plain, fused = evaluate(cluster, _one_gpu_plan(cross_entropy="plain")), evaluate(cluster, _one_gpu_plan())
    ctx = _ctx(gpt(), cross_entropy="plain")
    bw = gemm_curve_for(ctx, H100).memory_Bps
    logits = 2 * 2048 * 50272
    delta = sum(priced_bytes_per_logit("plain", 2)) - sum(priced_bytes_per_logit("fused", 2))
    assert delta > 0
    assert plain.iteration_time_s - fused.iteration_time_s == pytest.approx(4 * delta * logits / bw)
    rows = {term: (value, formula) for term, value, formula in plain.details}
    value, formula = rows["cross_entropy_forward_s"]
    assert formula.startswith("plain loss") and value == pytest.approx(22 * logits / bw)
    assert rows["cross_entropy_backward_s"][0] == pytest.approx(26 * logits / bw)
    fused_rows = {term: formula for term, _, formula in fused.details}
    assert "the calibration's price" in fused_rows["cross_entropy_forward_s"]


TWO_TYPES = {"name": "two", "nodes": [
    {"name": "h", "count": 1, "gpu": "H100-SXM5-80GB", "gpus_per_node": 1, "network_bandwidth": "400 Gbit/s",
     "price_per_hour": 10.0},
    {"name": "a", "count": 1, "gpu": "A100-SXM4-80GB", "gpus_per_node": 1, "network_bandwidth": "400 Gbit/s",
     "price_per_hour": 5.0}]}


def test_a_v_schedules_loss_is_explained_on_the_rank_that_runs_the_head():
    """In a V (zb-v) the head is rank 0's second chunk (evaluate._priced_stages), though the plan
    file keeps it on the last stage: the loss rows are those of rank 0's GPU (an H100 here), not
    the last stage's (an A100)."""
    data = _one_gpu_plan(cross_entropy="plain").to_json()
    data["inputs"]["cluster"] = "two"
    data.update(schedule="zb-v", virtual_stages=2, stages=[
        {"index": 0, "blocks": [0, 2], "embedding": True, "head": False, "replicas": [
            {"gpu_type": "H100-SXM5-80GB", "tp": 1, "micro_batch_share": 2, "devices": ["h-0:0"]}]},
        {"index": 1, "blocks": [2, 4], "embedding": False, "head": True, "replicas": [
            {"gpu_type": "A100-SXM4-80GB", "tp": 1, "micro_batch_share": 2, "devices": ["a-0:0"]}]}])
    ev = evaluate(cluster_from_dict(TWO_TYPES), Plan.from_json(data))
    ctx = _ctx(gpt(), cross_entropy="plain")
    logits = 2 * 2048 * 50272
    on = {g: 22 * logits / gemm_curve_for(ctx, catalog.gpu(g)).memory_Bps for g in ("H100-SXM5-80GB", "A100-SXM4-80GB")}
    assert on["H100-SXM5-80GB"] != pytest.approx(on["A100-SXM4-80GB"])
    rows = {term: value for term, value, _ in ev.details}
    assert rows["cross_entropy_forward_s"] == pytest.approx(on["H100-SXM5-80GB"])
