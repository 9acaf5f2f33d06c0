"""The trust of a prediction: per GPU type, validated on measured runs or datasheet-only."""

from __future__ import annotations

from planner import api
from planner.cost.trust import plan_trust, trust_for, trust_line, validation_table


def test_validated_types_carry_their_held_out_error():
    table = validation_table()["gpu_types"]
    a100 = trust_for("A100-SXM4-80GB", "bf16")
    held_out = [e for e in table["A100-SXM4-80GB"] if not e["fitted"]]
    assert a100.level == "validated" and held_out
    assert a100.mape == max(e["mape_percent"] for e in held_out) / 100
    assert "vtrain-multi" in a100.note and "predicted without fitting" in a100.note
    # fp16 runs validate bf16 (same tensor-core GEMMs), not fp32
    assert trust_for("A100-SXM4-80GB", "fp16").level == "validated"
    assert trust_for("A100-SXM4-80GB", "fp32").level == "datasheet-only"


def test_types_without_runs_are_datasheet_only():
    for gpu in ("V100-SXM2-32GB", "L40S-48GB", "MI300X-192GB"):
        t = trust_for(gpu, "fp16")
        assert t.level == "datasheet-only" and t.mape is None and "no measured run" in t.note
    v100 = plan_trust(["V100-SXM2-32GB"], "fp16")[0]
    assert "assumed matmul ceiling" in v100.note          # no published MAMF for V100
    mi300 = plan_trust(["MI300X-192GB"], "bf16")[0]
    assert "published max-achievable-matmul" in mi300.note
    assert trust_line([v100]).startswith("trust: V100-SXM2-32GB datasheet-only")


def test_plan_and_evaluation_carry_the_trust_of_each_gpu_type():
    cluster = api.load_cluster("cluster_specs/lab-mixed.yaml")
    model = api.load_model("gpt-neo-2.7b")
    training = api.Training(global_batch_size=64, seq_len=2048, precision="fp16")
    result = api.plan(cluster, model, training, time_limit_s=20)
    ev = api.evaluate(cluster, result.plan)
    used = sorted({r.gpu_type for st in result.plan.stages for r in st.replicas})
    assert [t.gpu_type for t in ev.trust] == used
    data = result.plan.to_json()["predicted"]["trust"]
    assert [t["gpu_type"] for t in data] == used
    assert {t["level"] for t in data} <= {"validated", "calibrated", "datasheet-only", "profiled"}


def test_a_gpu_checked_on_a_lent_machine_is_micro_benchmarked():
    """H200: GEMMs timed and one plan trained on one lent GPU (reference/device/h200-2026-12-04),
    no multi-GPU run: better than datasheet-only, not validated; fp32 was not checked."""
    bf16, tf32 = trust_for("H200-SXM-141GB", "bf16"), trust_for("H200-SXM-141GB", "tf32")
    assert bf16.level == tf32.level == "micro-benchmarked"
    assert "GEMMs timed on one GPU" in bf16.note and "no multi-GPU measured run" in bf16.note
    assert "single-GPU training run" in tf32.note and 0 < tf32.mape < 1
    assert trust_for("H200-SXM-141GB", "fp32").level == "datasheet-only"


def test_device_checks_file_matches_a_fresh_run():
    """planner/cost/device_checks.yaml is what `python -m planner.cost.device_checks` writes
    from reference/device/ today: a model change that moves those errors shows here."""
    import yaml

    from planner.cost.device_checks import CHECKS_FILE, collect
    assert yaml.safe_load(CHECKS_FILE.read_text()) == collect()
