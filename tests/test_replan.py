"""replan: an old plan checked against a changed cluster, and a fresh search beside it."""

from __future__ import annotations

import json

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
    # The CLI is a CI gate: exit 1 when the old plan no longer runs, the new plan written.
    out = tmp_path / "new.json"
    code = main(["replan", str(tmp_path / "small.yaml"), str(tmp_path / "plan.json"), "--json",
                 "-o", str(out), "--time-limit", "30"])
    assert code == 1
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
