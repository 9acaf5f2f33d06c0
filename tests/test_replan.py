"""replan: an old plan checked against a changed cluster, and a fresh search beside it."""

from __future__ import annotations

import json

import pytest

from planner import api
from planner.cli.main import main

MODEL = {"name": "small", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000}
TRAINING = api.Training(global_batch_size=8, seq_len=256)

BIG = """\
name: shrinking
nodes:
  - {name: a100, count: 2, gpu: A100-SXM4-80GB, gpus_per_node: 2, network_bandwidth: 100 Gbit/s}
"""
SMALL = BIG.replace("count: 2", "count: 1")


def _old_plan(tmp_path):
    (tmp_path / "big.yaml").write_text(BIG)
    (tmp_path / "small.yaml").write_text(SMALL)
    cluster = api.load_cluster(tmp_path / "big.yaml")
    result = api.plan(cluster, api.load_model(MODEL), TRAINING, time_limit_s=30)
    (tmp_path / "plan.json").write_text(result.plan.dumps())
    return result


def test_replan_after_losing_a_node(tmp_path, capsys):
    old = _old_plan(tmp_path)
    assert any(d.startswith("a100-1:") for d in old.plan.devices()), "the old plan should use both nodes"
    small = api.load_cluster(tmp_path / "small.yaml")
    result = api.replan(small, old.plan, time_limit_s=30)
    assert not result.old_valid
    assert any("a100-1" in line for line in result.old_problems)
    assert result.old_evaluation is None and result.speedup is None
    assert all(d.startswith("a100-0:") for d in result.plan.devices())
    # The CLI is a CI gate: exit 4 when the old plan no longer runs, the new plan written.
    out = tmp_path / "new.json"
    code = main(["replan", str(tmp_path / "small.yaml"), str(tmp_path / "plan.json"), "--json",
                 "-o", str(out), "--time-limit", "30"])
    assert code == 4
    summary = json.loads(capsys.readouterr().out)
    assert summary["old_plan_valid"] is False and summary["new_tokens_per_s"] > 0
    assert api.Plan.from_json(json.loads(out.read_text())).devices() == result.plan.devices()


def test_replan_on_the_same_cluster_keeps_the_plan(tmp_path):
    old = _old_plan(tmp_path)
    cluster = api.load_cluster(tmp_path / "big.yaml")
    result = api.replan(cluster, old.plan, time_limit_s=30)
    assert result.old_valid and result.old_problems == []
    assert result.speedup is not None and abs(result.speedup - 1.0) < 1e-9
    assert result.kept_devices == len(old.plan.devices())


def test_replan_without_training_is_bad_input(tmp_path, capsys):
    old = _old_plan(tmp_path)
    data = old.plan.to_json()
    data["inputs"]["training"] = {"seq_len": 256}
    (tmp_path / "broken.json").write_text(json.dumps(data))
    assert main(["replan", str(tmp_path / "small.yaml"), str(tmp_path / "broken.json")]) == 2
    err = capsys.readouterr().err
    assert "broken.json" in err and "global_batch_size" in err and "Traceback" not in err


def test_old_plan_that_no_longer_fits_memory_is_invalid(tmp_path):
    from planner.replan import old_plan_status

    old = _old_plan(tmp_path)
    tight = BIG.replace("gpu: A100-SXM4-80GB", "gpu: {name: tiny-mem, memory: 1 MB, peak_tflops: 312, "
                        "memory_bandwidth: 2039 GB/s, intra_node_bandwidth: 300 GB/s}")
    (tmp_path / "tight.yaml").write_text(tight)
    data = old.plan.to_json()
    for stage in data["stages"]:
        for rep in stage["replicas"]:
            rep["gpu_type"] = "tiny-mem"
    cluster = api.load_cluster(tmp_path / "tight.yaml")
    problems, evaluation = old_plan_status(cluster, api.Plan.from_json(data))
    assert evaluation is None
    assert problems and all("a100-" in p for p in problems)
    same, ev = old_plan_status(api.load_cluster(tmp_path / "big.yaml"), old.plan)
    assert same == [] and ev.tokens_per_s == pytest.approx(old.evaluation.tokens_per_s, rel=1e-12)
