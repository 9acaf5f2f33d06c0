"""``planner rebalance --blocks`` on a real run: a 2-stage 1F1B plan whose stage 1 rank is made
3x slower (``--slow-rank``, the runner sleeps twice each action's compute after it) moves
blocks to stage 0, making it the slowest stage, and a rerun of the new plan under the same
slow-down takes the predicted step time within TOLERANCE."""

from __future__ import annotations

import json
import statistics

import pytest
from timing import probe_spread, require_quiet_machine, speed_probe_s, steady_errors

from planner.cli.main import main
from planner.plan import Plan

pytestmark = pytest.mark.slow

# The runner shares this machine's 2 cores with whatever else runs. The prediction is the
# action-list executor's time on the new stage times plus the measured run's sends and sync
# (planner.rebalance_blocks): forced on a quiet machine (PLANNER_TIMING_TESTS=force) it came
# out -6% to +4% of the rerun in eight runs on 2026-12-05, and +14% in two more during which
# both runs slowed by a fifth (another tenant). It had a 25% tolerance while it was 1F1B's
# closed form, which the rebalanced plan's early bottleneck puts 7-21% over the rerun (the
# warm-up forwards of the slowest stage overlap the fill); the 15% of the shares-only
# rebalance (docs/runner.md) now holds it, for a measurement (both runs and the rebalance)
# during which speed probes agree (tests/timing.py), as tests/test_profile_e2e.py counts them.
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


MAX_MEASUREMENTS = 3


def measure(tmp_path, capsys) -> tuple[float, float, float, list[float]]:
    """Run the plan, rebalance it, run the new plan: (predicted, measured after, measured
    before, speed probes before, between and after the runs)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "plan.json").write_text(PLAN.dumps())
    m1, m2, new = tmp_path / "m1.json", tmp_path / "m2.json", tmp_path / "new.json"
    probes = [speed_probe_s()]
    assert main(["run", str(tmp_path / "plan.json"), "--steps", str(STEPS), "--measurements", str(m1),
                 "--slow-rank", "1:3", "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    probes.append(speed_probe_s())
    assert main(["rebalance", str(tmp_path / "cluster.yaml"), str(tmp_path / "plan.json"), "--measurements",
                 str(m1), "--blocks", "-o", str(new), "--json"]) == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    (a, b), _ = summary["blocks"]["new"]
    assert a == 0 and b > 4, summary["blocks"]        # blocks went to the fast stage 0
    assert main(["run", str(new), "--steps", str(STEPS), "--measurements", str(m2),
                 "--slow-rank", "1:3", "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    probes.append(speed_probe_s())
    return summary["predicted_step_s"], measured_median_s(m2), measured_median_s(m1), probes


def test_rebalanced_split_runs_at_the_predicted_step_time(tmp_path, capsys):
    def measurements():
        for attempt in range(1, MAX_MEASUREMENTS + 1):
            predicted, after, before, probes = measure(tmp_path / f"measurement{attempt}", capsys)
            assert after < before, (before, after)
            require_quiet_machine()  # the tolerance holds for the plan's time, not a loaded machine's
            error = predicted / after - 1
            with capsys.disabled():
                print(f"measurement {attempt}: predicted {predicted * 1e3:.1f} ms, measured {after * 1e3:.1f} ms "
                      f"({error:+.1%}), probes {[round(p * 1e3, 1) for p in probes]} ms "
                      f"(spread {probe_spread(probes):.0%})")
            yield error, probes

    errors = steady_errors(measurements(), TOLERANCE, MAX_MEASUREMENTS)
    assert abs(errors[-1]) <= TOLERANCE, errors
