"""planner rebalance and the measurements file, on synthetic measurements (no processes)."""

from __future__ import annotations

import json

import pytest

from planner.cli.main import main
from planner.errors import InputError
from planner.launch.measurements import SCHEMA_ID, build, load, plan_sha256
from planner.launch.runner import RankInfo
from planner.plan import Plan
from planner.rebalance import ReplicaSpeed, rebalance, solve_shares

CLUSTER = """\
name: local
nodes:
  - {name: a, gpu: A100-SXM4-80GB, gpus_per_node: 4, network_bandwidth: 100 Gbit/s}
"""
GPU = "A100-SXM4-80GB"


def make_plan(shares, mbs=None) -> Plan:
    mbs = mbs or sum(shares)
    reps = [{"gpu_type": GPU, "tp": 1, "micro_batch_share": s, "devices": [f"a:{j}"]} for j, s in enumerate(shares)]
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "local", "training": {"global_batch_size": 2 * mbs, "seq_len": 8},
                   "model": {"name": "t", "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                             "vocab_size": 64}},
        "micro_batch_size": mbs, "num_micro_batches": 2, "schedule": "1f1b",
        "stages": [{"index": 0, "blocks": [0, 2], "embedding": True, "head": True, "replicas": reps}]})


def synthetic(plan: Plan, per_seq_s, fixed_s=0.0, allreduce_s=0.002, steps=5, share_seq=None) -> dict:
    """Measurements of replicas whose compute takes fixed + share * per_seq seconds."""
    ranks = [RankInfo(j, f"a:{j}", 0, j, 0) for j in range(len(per_seq_s))]
    per_rank, step_time = {r.rank: [] for r in ranks}, []
    for i in range(steps):
        shares = share_seq[i] if share_seq else [r.micro_batch_share for r in plan.stages[0].replicas]
        fixed = fixed_s if isinstance(fixed_s, list) else [fixed_s] * len(shares)
        compute = [f + s * b for f, s, b in zip(fixed, shares, per_seq_s)]
        for j, c in enumerate(compute):
            per_rank[j].append({"share": shares[j], "forward_s": c / 3, "backward_s": 2 * c / 3,
                                "recv_wait_s": 0.0, "sync_wait_s": max(compute) - c + allreduce_s})
        step_time.append(max(compute) + allreduce_s)
    return build(plan, ranks, per_rank, step_time, None)


def test_solve_shares_is_min_max_exact():
    speeds = [ReplicaSpeed(0, 0, 0.0, 0.01), ReplicaSpeed(0, 1, 0.0, 0.03)]
    assert solve_shares(speeds, 12) == [9, 3]
    speeds = [ReplicaSpeed(0, 0, 0.0, 0.01), ReplicaSpeed(0, 1, 0.0, 0.01), ReplicaSpeed(0, 2, 0.0, 0.02)]
    assert solve_shares(speeds, 10) == [4, 4, 2]
    assert solve_shares([ReplicaSpeed(0, 0, 0, 1.0), ReplicaSpeed(0, 1, 0, 100.0)], 6, min_share=2) == [4, 2]


def test_rebalance_static_run_predicts_proportional_shares():
    plan = make_plan([6, 6])
    doc = synthetic(plan, [0.001, 0.003])
    _, times = load_doc(doc, plan)
    res = rebalance(plan, times, [s["step_time_s"] for s in doc["steps"]])
    assert res.shares == {(0, 0): 9, (0, 1): 3}
    assert res.measured_step_s == pytest.approx(6 * 0.003 + 0.002)
    assert res.predicted_step_s == pytest.approx(9 * 0.001 + 0.002)
    assert res.predicted_old_step_s == pytest.approx(res.measured_step_s)


def test_rebalance_fits_fixed_cost_when_shares_varied():
    plan = make_plan([4, 4])
    seq = [[4, 4], [5, 3], [6, 2], [5, 3], [6, 2]]
    # replica 0 is twice as fast per sequence but pays 10 ms a step whatever its share
    doc = synthetic(plan, [0.001, 0.002], fixed_s=[0.010, 0.0], share_seq=seq)
    _, times = load_doc(doc, plan)
    res = rebalance(plan, times, [s["step_time_s"] for s in doc["steps"]])
    assert res.speeds[(0, 0)].fixed_s == pytest.approx(0.010)
    assert res.speeds[(0, 1)].fixed_s == pytest.approx(0.0, abs=1e-12)
    assert res.speeds[(0, 1)].per_sequence_s == pytest.approx(0.002)
    # 2/6 finishes both at 12 ms; proportional-to-throughput (about 5/3) would take 15 ms
    assert res.shares == {(0, 0): 2, (0, 1): 6}
    assert res.predicted_step_s == pytest.approx(0.012 + 0.002)


def load_doc(doc, plan, tmp=None):
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(doc, fh)
    return load(fh.name, plan)


@pytest.fixture
def files(tmp_path):
    plan = make_plan([4, 4])
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "plan.json").write_text(plan.dumps())
    doc = synthetic(plan, [0.001, 0.003])
    (tmp_path / "m.json").write_text(json.dumps(doc))
    return tmp_path, plan, doc


def test_cli_writes_plan_with_new_shares(files, capsys):
    tmp, plan, _ = files
    rc = main(["rebalance", str(tmp / "cluster.yaml"), str(tmp / "plan.json"), "--measurements",
               str(tmp / "m.json"), "-o", str(tmp / "new.json"), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["shares"] == {"0/0": 6, "0/1": 2}
    assert summary["predicted_gain"] == pytest.approx((4 * 0.003 + 0.002) / (6 * 0.001 + 0.002))
    new = Plan.from_json(json.loads((tmp / "new.json").read_text()))
    assert [r.micro_batch_share for r in new.stages[0].replicas] == [6, 2]
    assert new.devices() == plan.devices() and new.predicted is None


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(plan_sha256="0" * 64), "plan_sha256"),
    (lambda d: d.update(schema="other/v9"), "schema"),
    (lambda d: d["steps"][1]["replicas"].pop(1), "steps[1].replicas: no measurement of stage/replica 0/1"),
    (lambda d: d["steps"][2]["replicas"][0].update(compute_s=0.0), "steps[2].replicas[0].compute_s"),
    (lambda d: d["steps"][0]["replicas"][1].update(compute_s=-1.0), "steps[0].replicas[1].compute_s"),
    (lambda d: d["steps"][0]["replicas"][1].update(sync_wait_s=-1.0), "steps[0].replicas[1].sync_wait_s"),
    (lambda d: d["steps"][3].update(step_time_s=0), "steps[3].step_time_s"),
    (lambda d: d["steps"][0]["replicas"][0].update(share=0), "steps[0].replicas[0].share"),
    (lambda d: d["steps"][0]["replicas"][0].update(replica=5), "steps[0].replicas[0]: stage/replica (0, 5)"),
])
def test_cli_bad_measurements_exit_2_naming_the_field(files, capsys, mutate, field):
    tmp, _, doc = files
    mutate(doc)
    (tmp / "m.json").write_text(json.dumps(doc))
    rc = main(["rebalance", str(tmp / "cluster.yaml"), str(tmp / "plan.json"), "--measurements", str(tmp / "m.json")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert field in err and "Traceback" not in err


def test_measurements_of_another_plan_are_refused(files, capsys):
    tmp, _, _ = files
    (tmp / "other.json").write_text(make_plan([5, 3]).dumps())
    rc = main(["rebalance", str(tmp / "cluster.yaml"), str(tmp / "other.json"), "--measurements", str(tmp / "m.json")])
    assert rc == 2 and "another plan" in capsys.readouterr().err


def test_document_shape(files):
    _, plan, doc = files
    assert doc["schema"] == SCHEMA_ID and doc["plan_sha256"] == plan_sha256(plan)
    row = doc["steps"][0]["replicas"][1]
    assert set(row) == {"stage", "replica", "share", "forward_s", "backward_s", "recv_wait_s",
                        "sync_wait_s", "compute_s"}
    assert row["compute_s"] == pytest.approx(4 * 0.003)


def test_launch_carries_the_rebalanced_shares_and_their_bounds(files, capsys):
    """The rebalanced plan launches with its measured shares in the rank map (and, when the
    plan lets shares move at run time, the bounds a controller must keep)."""
    from planner import api
    tmp, _, _ = files
    assert main(["rebalance", str(tmp / "cluster.yaml"), str(tmp / "plan.json"), "--measurements",
                 str(tmp / "m.json"), "-o", str(tmp / "new.json"), "--json"]) == 0
    capsys.readouterr()
    new = api.load_plan(tmp / "new.json")
    cluster = api.load_cluster(tmp / "cluster.yaml")
    rank_map = json.loads(api.launch(new, "torchrun", cluster=cluster, master_addr="10.0.0.1")["rank_map.json"])
    assert rank_map["stages"][0]["micro_batch_shares"] == [6, 2]
    assert "dynamic_shares" not in rank_map
    moving = Plan.from_json({**new.to_json(), "dynamic_shares": {"min_share": 2, "max_step_fraction": 0.25}})
    rank_map = json.loads(api.launch(moving, "torchrun", cluster=cluster, master_addr="10.0.0.1")["rank_map.json"])
    assert rank_map["dynamic_shares"] == {"min_share": 2, "max_step_fraction": 0.25, "dead_band": 0.05}


# -- measurements that contradict themselves, the speed's unit, the stale solver block ---------
def _dup_row(d):
    d["steps"][1]["replicas"].append(dict(d["steps"][1]["replicas"][0]))


def _huge(d):
    """Consistent but out of range: printed in ms it was "inf ms"."""
    for step in d["steps"]:
        step["step_time_s"] = 1.7e308
        for row in step["replicas"]:
            row["compute_s"] = 1.6e308


def _tiny(d):
    """A positive compute_s whose time per sequence underflows to 0 (a division by zero)."""
    for step in d["steps"]:
        for row in step["replicas"]:
            row["compute_s"] = 5e-324


@pytest.mark.parametrize("mutate, field, why", [
    (lambda d: d["steps"][1]["replicas"][0].update(compute_s=3.0), "steps[1].replicas",
     "stage/replica 0/0 compute_s 3 s is longer than its step"),
    (lambda d: d["steps"][2]["replicas"][1].update(compute_s=1e308), "steps[2].replicas",
     "stage/replica 0/1 compute_s 1e+308 s is longer than its step"),
    (lambda d: d["steps"][0]["replicas"][1].update(sync_wait_s=5.0), "steps[0].replicas",
     "stage/replica 0/1 sync_wait_s 5 s is longer than its step"),
    (lambda d: d["steps"][1]["replicas"][0].update(share=1000), "steps[1].replicas",
     "the shares of stage 0 (0/0 1000, 0/1 4) sum to 1004, but the plan's micro_batch_size is 8"),
    (lambda d: d["steps"][3]["replicas"][1].update(share=2), "steps[3].replicas", "sum to 6"),
    (_dup_row, "steps[*].replicas", "stage/replica 0/0 is measured 6 times in 5 steps; each step measures each replica once"),
    (_huge, "steps[0].step_time_s", "1.7e+308 s is no measured step; a step takes seconds, at most 1e+06 s"),
    (_tiny, "steps[*].replicas", "stage/replica 0/0 compute_s is too small to compute with"),
])
def test_self_contradicting_measurements_exit_2_and_write_nothing(files, capsys, mutate, field, why):
    tmp, plan, doc = files
    mutate(doc)
    (tmp / "m.json").write_text(json.dumps(doc))
    rc = main(["rebalance", str(tmp / "cluster.yaml"), str(tmp / "plan.json"), "--measurements",
               str(tmp / "m.json"), "-o", str(tmp / "new.json"), "--json"])
    captured = capsys.readouterr()
    assert rc == 2, captured.err
    assert f"{field}: " in captured.err and why in captured.err and "Traceback" not in captured.err
    assert f"{tmp / 'm.json'}" in captured.err        # the file, not "measurements"
    assert captured.out == "" and not (tmp / "new.json").exists()
    with pytest.raises(InputError):   # the API alike
        _, times = load_doc(doc, plan)
        rebalance(plan, times, [s["step_time_s"] for s in doc["steps"]])


def test_measured_sequences_per_s_counts_every_micro_batch(files, capsys):
    """A step runs num_micro_batches (2) micro-batches, each replica taking its share of each:
    share x 2 sequences in its compute_s (replica 1: 4 x 2 in 4 x 3 ms = 667/s, not 333/s)."""
    tmp, plan, _ = files
    assert plan.num_micro_batches == 2
    args = ["rebalance", str(tmp / "cluster.yaml"), str(tmp / "plan.json"), "--measurements", str(tmp / "m.json")]
    assert main([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["sequences_per_s"] == {"0/0": pytest.approx(2000.0), "0/1": pytest.approx(2000.0 / 3)}
    assert main(args) == 0
    assert "(measured sequences/s: 2000.0, 666.7)" in capsys.readouterr().out


def test_rebalanced_plan_drops_the_old_searchs_solver_block(tmp_path, capsys):
    """The solver block's status and objective were proved for the searched shares: stale after
    the rebalance, as the predicted block is (docs/runner.md)."""
    plan = Plan.from_json({**make_plan([4, 4]).to_json(),
                           "solver": {"method": "milp", "status": "optimal", "objective": 0.5, "gap": 0.0}})
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "plan.json").write_text(plan.dumps())
    (tmp_path / "m.json").write_text(json.dumps(synthetic(plan, [0.001, 0.003])))
    assert main(["rebalance", str(tmp_path / "cluster.yaml"), str(tmp_path / "plan.json"), "--measurements",
                 str(tmp_path / "m.json"), "-o", str(tmp_path / "new.json")]) == 0
    new = json.loads((tmp_path / "new.json").read_text())
    assert "solver" not in new and "predicted" not in new
    assert [r["micro_batch_share"] for r in new["stages"][0]["replicas"]] == [6, 2]


@pytest.mark.parametrize("command", ["rebalance", "profile"])
def test_non_utf8_measurements_exit_2_not_an_internal_error(files, capsys, command):
    tmp, _, _ = files
    (tmp / "m.json").write_bytes(b"\xff\xfe{}")
    argv = (["rebalance", str(tmp / "cluster.yaml"), str(tmp / "plan.json"), "--measurements", str(tmp / "m.json")]
            if command == "rebalance" else
            ["profile", "--from-run", str(tmp / "m.json"), "--plan", str(tmp / "plan.json"),
             "--cluster", str(tmp / "cluster.yaml"), "-o", str(tmp / "prof")])
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "not a readable JSON measurements file" in err and "internal error" not in err
