"""``planner rebalance --blocks`` on a real run: a 2-stage 1F1B plan whose stage 1 rank is made
3x slower (``--slow-rank``, the runner sleeps twice each action's compute after it) moves
blocks to stage 0, making it the slowest stage, and a rerun of the new plan under the same
slow-down takes the predicted step time within TOLERANCE."""

from __future__ import annotations

import json
import statistics

import pytest
from timing import require_quiet_machine

from planner.cli.main import main
from planner.plan import Plan

pytestmark = pytest.mark.slow

# The runner shares this machine's 2 cores with whatever else runs. The prediction is the
# action-list executor's time on the new stage times plus the measured run's sends and sync
# (planner.rebalance_blocks): forced on a quiet machine (PLANNER_TIMING_TESTS=force) it came
# out -6% to +4% of the rerun in five runs on 2026-12-05. It had a 25% tolerance while it was
# 1F1B's closed form, which the rebalanced plan's early bottleneck puts 7-21% over the rerun
# (the warm-up forwards of the slowest stage overlap the fill); the 15% of the shares-only
# rebalance (docs/runner.md) now holds it.
TOLERANCE = 0.15
STEPS = 8
MODEL = {"name": "rbs", "num_layers": 8, "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 256}
CLUSTER = "name: local\nnodes:\n  - {name: a, gpu: A100-SXM4-80GB, gpus_per_node: 4, network_bandwidth: 100 Gbit/s}\n"


def rep(dev):
    return {"gpu_type": "A100-SXM4-80GB", "tp": 1, "micro_batch_share": 4, "devices": [dev]}


PLAN = Plan.from_json({
    "schema": "planner.plan/v1",
    "inputs": {"cluster": "local", "model": MODEL, "training": {"global_batch_size": 16, "seq_len": 64}},
    "micro_batch_size": 4, "num_micro_batches": 4, "schedule": "1f1b",
    "stages": [{"index": 0, "blocks": [0, 4], "embedding": True, "replicas": [rep("a:0")]},
               {"index": 1, "blocks": [4, 8], "head": True, "replicas": [rep("a:1")]}]})


def measured_median_s(path) -> float:
    steps = json.loads(path.read_text())["steps"]
    return statistics.median(s["step_time_s"] for s in steps[1:])   # step 0 is the warm-up


def test_rebalanced_split_runs_at_the_predicted_step_time(tmp_path, capsys):
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "plan.json").write_text(PLAN.dumps())
    m1, m2, new = tmp_path / "m1.json", tmp_path / "m2.json", tmp_path / "new.json"
    assert main(["run", str(tmp_path / "plan.json"), "--steps", str(STEPS), "--measurements", str(m1),
                 "--slow-rank", "1:3", "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["rebalance", str(tmp_path / "cluster.yaml"), str(tmp_path / "plan.json"), "--measurements",
                 str(m1), "--blocks", "-o", str(new), "--json"]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    (a, b), _ = summary["blocks"]["new"]
    assert a == 0 and b > 4, summary["blocks"]        # blocks went to the fast stage 0
    assert main(["run", str(new), "--steps", str(STEPS), "--measurements", str(m2),
                 "--slow-rank", "1:3", "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    before, after = measured_median_s(m1), measured_median_s(m2)
    predicted = summary["predicted_step_s"]
    assert after < before, (before, after)
    require_quiet_machine()  # the prediction's tolerance holds for the plan's time, not a loaded machine's
    assert abs(predicted - after) <= TOLERANCE * after, (predicted, after, before)
