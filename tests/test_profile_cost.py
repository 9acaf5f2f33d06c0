"""A ProfileSet plugs into planner.cost.evaluate: measured entries replace the roofline."""

from __future__ import annotations

import pytest
import yaml
from test_profile_e2e import MODEL_FILE, ROOT, SEQ_LEN, data_parallel_plan, pipeline_plan

from planner.cost import evaluate
from planner.profile import ProfileSet, load_profiles
from planner.spec import load_cluster

CLUSTER = ROOT / "cluster_specs" / "cpu-local.yaml"
BLOCK = {1: (0.004, 0.008), 2: (0.008, 0.016)}
EMB = (0.0001, 0.0003)
HEAD = (0.002, 0.004)


def synthetic_profile(tmp_path):
    from planner.spec import load_model
    entries = []
    for mb, (f, b) in BLOCK.items():
        entries.append({"layer": "block", "micro_batch": mb, "tp": 1, "forward_s": f,
                        "backward_s": b, "peak_memory_bytes": 1})
        entries.append({"layer": "embedding", "micro_batch": mb, "tp": 1, "forward_s": EMB[0] * mb,
                        "backward_s": EMB[1] * mb, "peak_memory_bytes": 1})
        entries.append({"layer": "head", "micro_batch": mb, "tp": 1, "forward_s": HEAD[0] * mb,
                        "backward_s": HEAD[1] * mb, "peak_memory_bytes": 1})
    data = {"schema": "planner.profile/v1", "device": {"kind": "cpu", "name": "test cpu"},
            "torch_version": "x", "dtype": "bf16", "created": "2026-12-02T00:00:00+00:00",
            # the kernel of the test plans (written without `attention`: unfused), so the
            # entries answer as timed (test_profile_attention.py: the other kernel)
            "attention": "unfused",
            "seq_len": SEQ_LEN, "model": load_model(MODEL_FILE).to_mapping(),
            "settings": {"warmup": 0, "repeats": 1, "timer": "wall-clock", "memory": "none"},
            "entries": entries}
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def overhead_s(cluster) -> float:
    from planner.cost import default_calibration
    gpu = cluster.node_list[0].gpu
    return getattr(default_calibration().for_gpu(gpu), "microbatch_overhead_s", 0.0)


def test_profile_replaces_roofline_compute(tmp_path):
    cluster = load_cluster(CLUSTER)
    plan = pipeline_plan(2, micro_batch_size=2, num_micro_batches=4)
    roof = evaluate(cluster, plan)
    profiles = ProfileSet.load(synthetic_profile(tmp_path))
    meas = evaluate(cluster, plan, profiles=profiles)
    # Stage 0: embedding + blocks 0-1, stage 1: blocks 2-3 + head, all at micro-batch 2, plus
    # the cost model's fixed per-micro-batch overhead (not a layer, so not profiled).
    f, b = BLOCK[2]
    extra = overhead_s(cluster)
    assert meas.stages[0].compute_s == pytest.approx(2 * (f + b) + 2 * sum(EMB) + extra)
    assert meas.stages[1].compute_s == pytest.approx(2 * (f + b) + 2 * sum(HEAD) + extra)
    # The compute term is the pipeline's compute (m micro-batches through the slowest stage
    # plus the others' fill), so it moves with the stage times and differs from the roofline's.
    assert meas.breakdown_s["compute"] != pytest.approx(roof.breakdown_s["compute"], rel=0.05)
    ratio = meas.breakdown_s["compute"] / roof.breakdown_s["compute"]
    stage_ratio = meas.stages[1].compute_s / roof.stages[1].compute_s
    assert ratio == pytest.approx(stage_ratio, rel=0.25)
    # Terms that do not come from the profile stay as they were.
    assert meas.breakdown_s["optimizer"] == pytest.approx(roof.breakdown_s["optimizer"])
    assert meas.breakdown_s["pp_comm"] == pytest.approx(roof.breakdown_s["pp_comm"])
    usage = profiles.usage()
    assert usage["estimated"] == 0 and usage["measured"] >= 3


def test_interpolated_and_missing_entries(tmp_path):
    cluster = load_cluster(CLUSTER)
    profiles = ProfileSet.load(synthetic_profile(tmp_path))
    # A data-parallel plan with shares of 1: measured; micro-batch 4 in one replica: beyond the
    # measured range, so the roofline prices it and usage says "estimated".
    dp = evaluate(cluster, data_parallel_plan(1, 2, micro_batch_size=2), profiles=profiles)
    f, b = BLOCK[1]
    assert dp.stages[0].compute_s == pytest.approx(4 * (f + b) + sum(EMB) + sum(HEAD)
                                                   + overhead_s(cluster))
    profiles.reset_usage()
    big = evaluate(cluster, pipeline_plan(2, micro_batch_size=4, num_micro_batches=2),
                   profiles=profiles)
    roof = evaluate(cluster, pipeline_plan(2, micro_batch_size=4, num_micro_batches=2))
    assert big.stages[0].compute_s == pytest.approx(roof.stages[0].compute_s)
    assert profiles.usage()["estimated"] == 3 and profiles.usage()["measured"] == 0


def test_cluster_profiles_mapping_feeds_evaluate():
    cluster = load_cluster(CLUSTER)
    profiles = load_profiles(cluster=cluster, cluster_path=CLUSTER)
    ev = evaluate(cluster, pipeline_plan(2), profiles=profiles)
    assert profiles.usage()["estimated"] == 0
    assert ev.iteration_time_s > 0
