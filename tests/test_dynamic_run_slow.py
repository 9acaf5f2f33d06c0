"""Dynamic batching in the reference runner: shares move between steps toward the fast replica
and the loss and every parameter still equal the single-process reference (float64, 1e-5);
``--measurements`` writes a file ``planner rebalance`` accepts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.cli.main import main
from planner.launch import runner
from planner.launch import tiny_model as tm
from planner.launch.dynamic import ControllerSettings
from planner.plan import Plan

pytestmark = pytest.mark.slow

GPU = "A100-SXM4-80GB"
MODEL = {"name": "t", "num_layers": 3, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 64,
         "tied_embeddings": True}
STEPS = 5
TOL = 1e-5


def rep(share, dev):
    return {"gpu_type": GPU, "tp": 1, "micro_batch_share": share, "devices": [dev]}


def make_plan(stages, mbs, nmb=2) -> Plan:
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "local", "model": MODEL, "training": {"global_batch_size": mbs * nmb, "seq_len": 8}},
        "micro_batch_size": mbs, "num_micro_batches": nmb, "schedule": "1f1b",
        "dynamic_shares": {"min_share": 1, "max_step_fraction": 0.5, "dead_band": 0.02},
        "stages": [{"index": i, "blocks": list(b), "embedding": i == 0, "head": i == len(stages) - 1,
                    "replicas": reps} for i, (b, reps) in enumerate(stages)]})


# 3 data-parallel replicas, rank 2 made 4x slower.
PLAN_DP3 = make_plan([((0, 3), [rep(4, "a:0"), rep(4, "a:1"), rep(4, "a:2")])], mbs=12)
# 2 stages: stage 0 in two replicas (rank 1 slow) feeding one replica; the pieces sent between
# stages are re-cut every time stage 0's shares move.
PLAN_PP = make_plan([((0, 1), [rep(3, "a:0"), rep(3, "a:1")]), ((1, 3), [rep(6, "a:2")])], mbs=6)


def _reference(plan: Plan):
    shape = tm.Shape(**runner.model_shape(plan))
    return tm.reference_run(shape, plan.micro_batch_size * plan.num_micro_batches, STEPS, seed=0, dtype="float64")


@pytest.mark.parametrize("plan, slow_rank, stage", [(PLAN_DP3, 2, 0), (PLAN_PP, 1, 0)], ids=["dp3", "pp"])
def test_dynamic_shares_move_and_match_reference(plan, slow_rank, stage):
    seen = []
    res = runner.run_plan(plan, steps=STEPS, dtype="float64", return_params=True,
                          dynamic=ControllerSettings(dead_band=0.02), slowdown={slow_rank: 4.0},
                          on_step=lambda *a: None, on_shares=lambda step, sh: seen.append(sh))
    ref_losses, ref_params = _reference(plan)
    np.testing.assert_allclose(res.losses, ref_losses, rtol=0, atol=TOL)
    for name, ref in ref_params.items():
        np.testing.assert_allclose(res.params[name], ref, rtol=0, atol=TOL, err_msg=name)
    assert res.replica_max_abs_diff <= TOL
    # shares moved off the slow replica, kept the micro-batch size, and every step was reported
    steps = res.measurements["steps"]
    assert len(seen) == STEPS == len(steps)
    first = {(r["stage"], r["replica"]): r["share"] for r in steps[0]["replicas"]}
    last = {(r["stage"], r["replica"]): r["share"] for r in steps[-1]["replicas"]}
    slow = next((r.stage, r.replica) for r in res.ranks if r.rank == slow_rank)
    assert last[slow] < first[slow]
    for st in steps:
        assert sum(r["share"] for r in st["replicas"] if r["stage"] == stage) == plan.micro_batch_size
    assert seen[-1] == last


def test_cli_measurements_feed_rebalance(tmp_path, capsys):
    plan = PLAN_DP3.model_copy(update={"dynamic_shares": None})
    (tmp_path / "plan.json").write_text(plan.dumps())
    (tmp_path / "cluster.yaml").write_text(
        "name: local\nnodes:\n  - {name: a, gpu: A100-SXM4-80GB, gpus_per_node: 4, network_bandwidth: 100 Gbit/s}\n")
    m = tmp_path / "m.json"
    rc = main(["run", str(tmp_path / "plan.json"), "--steps", "4", "--measurements", str(m),
               "--slow-rank", "2:4", "--json"])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    doc = json.loads(m.read_text())
    assert doc["schema"] == "planner.measurements/v1" and len(doc["steps"]) == 4
    for step in doc["steps"]:
        rows = step["replicas"]
        assert [r["share"] for r in rows] == [4, 4, 4]
        assert all(r["forward_s"] > 0 and r["backward_s"] > 0 and r["sync_wait_s"] >= 0 for r in rows)

    def median(field, j):
        return float(np.median([st["replicas"][j][field] for st in doc["steps"][1:]]))

    # the 4x slower replica computes longest and waits least at the gradient all-reduce
    # (medians over the steps after the first: the machine may be shared)
    assert median("compute_s", 2) == max(median("compute_s", j) for j in range(3))
    assert median("sync_wait_s", 2) == min(median("sync_wait_s", j) for j in range(3))
    rc = main(["rebalance", str(tmp_path / "cluster.yaml"), str(tmp_path / "plan.json"),
               "--measurements", str(m), "-o", str(tmp_path / "new.json"), "--json"])
    assert rc == 0
    shares = json.loads(capsys.readouterr().out)["shares"]
    assert shares["0/2"] < 4 and sum(shares.values()) == 12


def test_bench_dynamic_runs(capsys):
    """The benchmark's short form runs (so it cannot rot); its timings are not asserted."""
    from planner import bench_dynamic

    assert bench_dynamic.main(["--steps", "3", "--replicas", "2", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["replicas"] == 2 and len(row["dynamic_shares"]) == 3
    assert sum(row["rebalance_shares"]) == bench_dynamic.MICRO_BATCH
    assert row["static_median_s"] > 0 and row["rebalance_predicted_s"] > 0
