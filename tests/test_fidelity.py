"""Prediction error of the cost model on every measured set (prints the table).

Calibration sets: vtrain-single (A100), megatron-core-h100 (H100).  Predicted without any
fitting: vtrain-multi, sailor (GH200 and the mixed RTX cluster).  The bounds are the levels
reached, rounded up a little; a change that makes a set worse fails here.
`python -m planner.cost.fidelity` (or `make fidelity`) prints the same table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not (Path(__file__).parent / "fidelity" / "rows.py").exists(),
                                reason="fidelity sets not present")

# MAPE bounds (fraction), the level reached rounded up; see the module docstring.
# 2026-12-05: the bf16/fp16 matmul ceiling became a training shape's, 0.90 x the published
# best-shape MAMF (catalog benchmarks.yaml, measured on the H200 GEMM sweep), and both entries
# were refitted.  Moved: megatron-core-h100 7.5% -> 5.4%, vtrain-multi 8.9% -> 7.1%, torchtitan
# 5.0% -> 1.6%, Sailor's per-layer check 0.171 -> 0.158; against it vtrain-single 6.6% -> 7.0%
# and, through the refitted half-sizes carried to their GPUs (their tf32 / fp32 ceilings did not
# move), Sailor GH200 17.4% -> 19.1% (no suspect 10.5% -> 12.5%) and MIT 24.3% -> 25.8%.
# Then Hopper's GEMM half-sizes came from the H200's GEMM sweep instead of the nine H100 rows
# (cost/gemm_sweep_fit.py; the rows had put the fill size at its bound): megatron-core-h100
# 5.4% -> 5.5%, torchtitan 1.6% -> 2.3%, Sailor GH200 19.1% -> 18.4% (no suspect 11.8%).
# Then Megatron's softmax on its PyTorch path where its fused kernel's shape rule refuses (b * a /
# tp not a multiple of 4; cost/softmax.py): its bytes, and four more launches each way at the
# fitted floor's cost per launch.  vtrain-single 7.0% -> 6.8% (its tp 8 micro-batch 1 rows -27%
# -> -16%), Sailor GH200 (fp32, always the fallback; now its launches too) 18.4% -> 16.3%, no
# suspect 11.8% -> 9.6%; the rest unchanged.
BOUNDS = {
    "vtrain-single": 0.069,
    "megatron-core-h100": 0.056,
    "vtrain-multi": 0.072,
    "sailor/GH200": 0.164,
    # MIT went from 20.5% to 24.3% (no suspect: 17.9% to 22.0%) when the GEMM half-sizes were
    # carried to each GPU by its peak and operand rate (gemm.transferred_halves) instead of the
    # A100's fitted values on the RTX 3090 (ampere) and the Turing parts' FP32: their blocks had
    # been priced 1.30-1.57x slower than Sailor's own per-layer profiles of them, now 1.15-1.36x
    # (planner.cost.layer_check).  The rows were closer by a compute error cancelling a missed
    # pipeline/network cost, not by being right; they are predicted too fast, more so now.
    "sailor/MIT-mixed": 0.26,
    # without the rows the generator marks suspect from the source's own figures (fidelity.py)
    "sailor/GH200 (no suspect)": 0.097,
    "sailor/MIT-mixed (no suspect)": 0.237,
    # 18.6% -> 5.0% when the rows without torch.compile were priced eager (planner.cost.elementwise)
    # and the two compile rows without Float8 became expressible as fused
    "torchtitan-h100": 0.024,
    # peak memory: torchtitan logs the allocator's max reserved, above the allocated peak priced
    "torchtitan-h100 (peak memory)": 0.09,
}

# torchtitan's own eager -> torch.compile speed-up (Tables 1 and 3: +15.7% on 8 H100, +16.2% on
# 128) against the predicted eager / fused ratio: a check of the eager term, which was derived
# from the ops that run, never tuned to it.  Reached: +17.5% and +17.6%; the bound is in points.
COMPILE_SPEEDUP_POINTS = 0.025


def test_torchtitan_compile_speedup_matches_the_eager_term(capsys):
    from planner.cost.fidelity import predict_set
    by_id = {r.id: r for r in predict_set("torchtitan-h100")}
    pairs = [(i, i.replace("-plain", "-compile")) for i in by_id if i.endswith("-plain")]
    assert len(pairs) == 2 and all(c in by_id for _, c in pairs)
    for eager, fused in pairs:
        e, f = by_id[eager], by_id[fused]
        measured, predicted = e.measured_s / f.measured_s - 1, e.predicted_s / f.predicted_s - 1
        with capsys.disabled():
            print(f"\n{eager}: compile speed-up measured {measured:+.1%}, predicted {predicted:+.1%}")
        assert abs(predicted - measured) <= COMPILE_SPEEDUP_POINTS, (eager, measured, predicted)


@pytest.fixture(scope="module")
def table():
    from planner.cost.fidelity import fidelity_table
    return fidelity_table()


def test_fidelity_table_prints_and_meets_bounds(table, capsys):
    from planner.cost.fidelity import format_table
    with capsys.disabled():
        print("\n" + format_table(table))
    by_name = {s.name: s for s in table}
    assert by_name["vtrain-single"].rows == 1440 and by_name["sailor"].rows == 36
    for name, bound in BOUNDS.items():
        assert by_name[name].mape <= bound, f"{name}: MAPE {by_name[name].mape:.3f} > {bound}"
        assert by_name[name].median_ape <= by_name[name].mape * 1.5


# Largest spread of the median signed error between hidden-size buckets (of 3 rows or more) of
# one set: a model whose shape is right shows no trend with model size.  The median, so that the
# suspect rows the sets flag (tests/fidelity/README.md) do not decide it.
TREND_BOUND = 0.12


def test_no_trend_of_error_with_model_size(capsys):
    from planner.cost.fidelity import bucket_table, format_buckets
    buckets = bucket_table()
    with capsys.disabled():
        print("\n" + format_buckets(buckets))
    by_set: dict[str, list[float]] = {}
    for b in buckets:
        if b.rows >= 3:
            by_set.setdefault(b.set, []).append(b.median_signed)
    assert by_set["vtrain-multi"] and by_set["vtrain-single"]
    for name, means in by_set.items():
        assert max(means) - min(means) <= TREND_BOUND, f"{name}: error trend with hidden size {means}"


def test_shipped_validation_file_is_current():
    """planner/cost/validation.yaml (what the trust line reads) equals a fresh fidelity run."""
    import yaml

    from planner.cost.fidelity import validation_summary
    from planner.cost.trust import VALIDATION_FILE
    assert yaml.safe_load(VALIDATION_FILE.read_text()) == validation_summary(), (
        "rewrite it with `python -m planner.cost.fidelity --write`")


def test_every_row_is_predicted_finite(table):
    for s in table:
        assert s.rows > 0 and 0 <= s.mape < 10 and s.worst_id


def test_rows_share_a_context_only_with_the_same_parallel_degrees(monkeypatch):
    """predict_set shares one cost context between rows of the same model and knobs; rows that
    differ only in their context-parallel degree (torchtitan's cp 1 / 2 / 4 / 8 rows, the
    same job split differently) must each be priced with their own, as evaluate prices them."""
    from types import SimpleNamespace

    from planner.cost import evaluate, fidelity
    from planner.plan import Plan
    from planner.spec import cluster_from_dict, load_model

    cluster = cluster_from_dict({"name": "one", "nodes": [{"name": "h", "count": 1, "gpu": "H100-SXM5-80GB",
                                                           "gpus_per_node": 2, "network_bandwidth": "400 Gbit/s"}]})
    spec = {"name": "l", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "vocab_size": 32000}
    model = load_model(spec)

    def plan(cp: int) -> Plan:
        return Plan.from_json({
            "schema": "planner.plan/v1",
            "inputs": {"cluster": "one", "model": spec,
                       "training": {"global_batch_size": 4, "seq_len": 8192, "precision": "bf16"}},
            "micro_batch_size": 2, "num_micro_batches": 2, "schedule": "1f1b", "context_parallel": cp,
            "stages": [{"index": 0, "blocks": [0, 4], "embedding": True, "head": True, "replicas": [
                {"gpu_type": "H100-SXM5-80GB", "tp": 1, "micro_batch_share": 2,
                 "devices": [f"h-0:{d}" for d in range(cp)]}]}]})

    rows = tuple((SimpleNamespace(id=f"cp{cp}", plan=plan(cp), measured_iteration_time_s=1.0, extras={},
                                  notes=(), config={}), cluster, model) for cp in (1, 2))
    monkeypatch.setattr(fidelity, "load_rows", lambda name: rows)
    got = {r.id: r.predicted_s for r in fidelity.predict_set("torchtitan-h100")}
    extra = fidelity.SET_CONTEXT["torchtitan-h100"]
    want = {row.id: evaluate(cl, row.plan, model=m, **extra).iteration_time_s for row, cl, m in rows}
    assert want["cp1"] != pytest.approx(want["cp2"])
    assert got == pytest.approx(want)
