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
    assert {t["level"] for t in data} <= {"validated", "calibrated", "micro-benchmarked", "datasheet-only",
                                           "profiled"}


def test_a_device_check_makes_a_type_micro_benchmarked():
    """H200 has no fidelity-set run but a one-GPU device check (reference/device): its blocks
    (bf16) and a runner plan (tf32) were predicted without fitting; the level says so."""
    checks = validation_table()["device_checks"]["H200-SXM-141GB"]
    for precision, also in (("bf16", "fp16"), ("tf32", None)):
        mine = [c for c in checks if c["precision"] == precision]
        assert mine, precision
        t = trust_for("H200-SXM-141GB", precision)
        assert t.level == "micro-benchmarked"
        assert t.mape == max(c["mape_percent"] for c in mine) / 100
        assert "one GPU" in t.note and mine[0]["folder"] in t.note and "collectives unchecked" in t.note
        if also:  # bf16 and fp16 share the tensor-core GEMMs (precision_class)
            assert trust_for("H200-SXM-141GB", also).level == "micro-benchmarked"
    assert trust_for("H200-SXM-141GB", "fp32").level == "datasheet-only"  # nothing measured in fp32
    # A type validated on measured runs keeps that level; a profile still comes first.
    assert trust_for("H100-SXM5-80GB", "bf16").level == "calibrated"
    assert trust_for("H200-SXM-141GB", "bf16", profiled=True).level == "profiled"
    line = trust_line([trust_for("H200-SXM-141GB", "bf16")])
    assert line.startswith("trust: H200-SXM-141GB micro-benchmarked") and "one-GPU micro-benchmarks" in line


def test_the_device_plan_carries_the_new_level_and_stays_schema_valid():
    from planner.plan.schema import validate_plan_json
    plan = api.load_plan("reference/device/h200-2026-12-04/plan.json")
    cluster = api.load_cluster("scripts/device-h200-1gpu.yaml")
    ev = api.evaluate(cluster, plan)
    assert [(t.gpu_type, t.level) for t in ev.trust] == [("H200-SXM-141GB", "micro-benchmarked")]
    data = plan.to_json()
    data["predicted"]["trust"] = [t.to_json() for t in ev.trust]
    validate_plan_json(data)
