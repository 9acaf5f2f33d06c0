"""``planner rebalance --blocks`` on hand-built measurements (no processes): the split chosen is
the brute-force optimum over every split of the action-list executor's time, the DP's split
where the splits are too many to enumerate, a balanced split is kept, memory refuses splits,
and bad input exits 2. The real run is tests/test_rebalance_blocks_slow.py."""

from __future__ import annotations

import json

import pytest

from planner import api
from planner.cli.main import main
from planner.cost.compute import replica_compute
from planner.cost.evaluate import context_for_plan
from planner.cost.memory import in_flight_micro_batches, replica_memory
from planner.cost.schedule import StageTiming, pipeline_time_s
from planner.launch.measurements import build, trained_record
from planner.launch.runner import RankInfo, model_shape
from planner.plan import Plan
from planner.plan.schema import validate_plan_json
from planner.simulate.actions import generate
from planner.simulate.executor import StageTimes, execute

GPU = "A100-SXM4-80GB"
CLUSTER = f"""\
name: local
nodes:
  - {{name: a, gpu: {GPU}, gpus_per_node: 4, network_bandwidth: 100 Gbit/s}}
"""
MODEL = {"name": "rb", "num_layers": 8, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 512}
M = 4            # micro-batches
OUTSIDE_S = 0.005  # what each synthetic step spends beyond the stages' compute (sends, sync)


def make_plan(split, shares=((4,), (4,)), schedule="1f1b", cluster="local", v=1) -> Plan:
    stages, first, dev = [], 0, 0
    for i, (nb, reps) in enumerate(zip(split, shares)):
        replicas = []
        for share in reps:
            replicas.append({"gpu_type": GPU, "tp": 1, "micro_batch_share": share, "devices": [f"a:{dev}"]})
            dev += 1
        stages.append({"index": i, "blocks": [first, first + nb], "embedding": i == 0,
                       "head": i == len(split) - 1, "replicas": replicas})
        first += nb
    mbs = sum(shares[0])
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": cluster, "model": MODEL,
                   "training": {"global_batch_size": mbs * M, "seq_len": 64, "precision": "fp32"}},
        "micro_batch_size": mbs, "num_micro_batches": M, "schedule": schedule, "virtual_stages": v,
        "stages": stages})


def stage_point(plan, stage: int, nb: int, slow: float, share: int | None = None) -> tuple[float, float]:
    """(seconds, forward seconds) of one micro-batch on a replica of ``stage`` holding ``nb``
    blocks whose layers run ``slow`` times the cost model's time (per-micro-batch overhead as
    priced, in the forward as replica_compute puts it): the ground truth the synthetic run
    measures, written with the cost model's public replica_compute as the runner computes
    (float32, attention unfused, the plain loss: planner.profile.from_run.run_context)."""
    ctx = context_for_plan(plan, precision="fp32", flash_attention=False, cross_entropy="plain")
    st = plan.stages[stage]
    share = share or st.replicas[0].micro_batch_share
    node = _node()
    gpu = node.gpu
    rt = replica_compute(ctx, gpu, node.group.intra_Bps, 1, share, nb, st.embedding, st.head)
    overhead = ctx.calibration.for_gpu(gpu).microbatch_overhead_s
    return slow * (rt.total_s - overhead) + overhead, slow * (rt.forward_s - overhead) + overhead


def stage_time_s(plan, stage: int, nb: int, slow: float, share: int | None = None) -> float:
    return stage_point(plan, stage, nb, slow, share)[0]


def executor_s(plan, points) -> float:
    """The schedule's generated action lists run on (seconds, forward seconds) per stage, each
    rank's chunks an equal part of it: how the synthetic run's steps pass."""
    v = plan.virtual_stages
    chunk = [StageTimes(forward_s=f / v, backward_s=(c - f) / v) for c, f in points]
    sched = generate(plan.schedule, len(points), M, v)
    return execute(sched, [chunk[sched.owner(s)[0]] for s in range(len(points) * v)]).makespan_s


def _node():
    import yaml

    from planner.spec import cluster_from_dict
    return cluster_from_dict(yaml.safe_load(CLUSTER)).node_by_name["a"]


def measurements(plan, slow: dict, steps: int = 5) -> dict:
    """Each replica (stage, replica) runs ``slow[(stage, replica)]`` times the cost model's layer
    time; step 0 three times that (a warm-up the rebalance leaves out); each step takes the 1F1B
    schedule's executor time on the slowest replicas plus OUTSIDE_S."""
    ranks, per_rank, step_time = [], {}, []
    rank = 0
    for st in plan.stages:
        for j, r in enumerate(st.replicas):
            ranks.append(RankInfo(rank, r.devices[0], st.index, j, 0))
            per_rank[rank] = []
            rank += 1
    for i in range(steps):
        x = 3.0 if i == 0 else 1.0
        points = {}
        for rk in ranks:
            st = plan.stages[rk.stage]
            share = st.replicas[rk.replica].micro_batch_share
            point = stage_point(plan, rk.stage, st.num_blocks, slow[(rk.stage, rk.replica)], share)
            c, f = (x * M * t for t in point)
            per_rank[rk.rank].append({"share": share, "forward_s": f, "backward_s": c - f,
                                      "recv_wait_s": 0.0, "sync_wait_s": 0.0})
            points[rk.stage] = max(points.get(rk.stage, (0.0, 0.0)), (c / M, f / M))
        step_time.append(executor_s(plan, [points[s] for s in range(len(plan.stages))]) + OUTSIDE_S)
    return build(plan, ranks, per_rank, step_time, None,
                 trained_record(model_shape(plan), "float32", "gloo", False, None))


def brute_force(plan, slow: dict) -> tuple[int, float]:
    """(blocks on stage 0, pipeline time by the schedule's executor) minimising over every split
    of a 2-stage plan (in whole chunks of virtual_stages blocks), ties to the plan's own split:
    no DP, no table."""
    L, v = MODEL["num_layers"], plan.virtual_stages
    best = None
    for a in range(v, L, v):
        points = [stage_point(plan, 0, a, slow[(0, 0)]), stage_point(plan, 1, L - a, slow[(1, 0)])]
        t = executor_s(plan, points)
        key = (t * (1 - 1e-12) if a == plan.stages[0].num_blocks else t, a)
        if best is None or key < best[0]:
            best = (key, (a, t))
    return best[1]


def run_cli(tmp, plan, doc, *extra, cluster=CLUSTER):
    (tmp / "cluster.yaml").write_text(cluster)
    (tmp / "plan.json").write_text(plan.dumps())
    (tmp / "m.json").write_text(json.dumps(doc))
    return main(["rebalance", str(tmp / "cluster.yaml"), str(tmp / "plan.json"), "--measurements",
                 str(tmp / "m.json"), "-o", str(tmp / "new.json"), *extra])


def test_slow_stage_gives_blocks_to_the_fast_one_as_brute_force_says(tmp_path, capsys):
    plan = make_plan((4, 4))
    slow = {(0, 0): 1.0, (1, 0): 2.0}   # stage 1 twice as slow per block
    assert run_cli(tmp_path, plan, measurements(plan, slow), "--blocks", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    a, t = brute_force(plan, slow)
    assert a > 4                         # blocks moved to the fast stage 0
    assert summary["blocks"]["new"] == [[0, a], [a, 8]] and summary["blocks"]["moved"]
    assert summary["blocks"]["old"] == [[0, 4], [4, 8]]
    per_block = summary["blocks"]["per_block_s"]
    assert per_block["1/0"] / per_block["0/0"] == pytest.approx(2.0)
    assert summary["predicted_step_s"] == pytest.approx(t + OUTSIDE_S, rel=1e-9)
    assert summary["predicted_old_step_s"] == pytest.approx(summary["measured_step_s"], rel=1e-9)
    assert summary["predicted_gain"] > 1.1
    new = api.load_plan(tmp_path / "new.json")
    assert [s.blocks for s in new.stages] == [(0, a), (a, 8)] and new.devices() == plan.devices()
    validate_plan_json(json.loads((tmp_path / "new.json").read_text()))   # the published schema
    cluster = api.load_cluster(tmp_path / "cluster.yaml")
    assert api.evaluate(cluster, new).fits
    rank_map = json.loads(api.launch(new, "torchrun", cluster=cluster, master_addr="10.0.0.1")["rank_map.json"])
    assert len(rank_map["stages"]) == 2


def test_too_many_splits_take_the_closed_forms_dp_split(tmp_path, capsys, monkeypatch):
    """Where the splits are too many to run each through the executor, the DP's optimum of the
    closed form (an upper bound on the executor's time) is the one candidate: the split that
    brute force over the closed form gives, priced by the executor."""
    import planner.rebalance_blocks as rb
    monkeypatch.setattr(rb, "SPLITS_ENUMERATED", 0)
    plan = make_plan((4, 4))
    slow = {(0, 0): 1.0, (1, 0): 2.0}
    assert run_cli(tmp_path, plan, measurements(plan, slow), "--blocks", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    L = MODEL["num_layers"]
    closed = {a: pipeline_time_s([StageTiming(stage_time_s(plan, 0, a, 1.0), 0.0),
                                  StageTiming(stage_time_s(plan, 1, L - a, 2.0), 0.0)], M, "1f1b")
              for a in range(1, L)}
    a = min(closed, key=closed.get)
    assert summary["blocks"]["new"] == [[0, a], [a, L]]
    t = executor_s(plan, [stage_point(plan, 0, a, 1.0), stage_point(plan, 1, L - a, 2.0)])
    assert summary["predicted_step_s"] == pytest.approx(t + OUTSIDE_S, rel=1e-9)
    assert t < closed[a]     # the early stage is now the slowest: the form is above the executor


def test_interleaved_split_moves_whole_chunks_as_brute_force_says(tmp_path, capsys):
    plan = make_plan((4, 4), schedule="interleaved-1f1b", v=2)
    slow = {(0, 0): 1.0, (1, 0): 3.0}
    assert run_cli(tmp_path, plan, measurements(plan, slow), "--blocks", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    a, t = brute_force(plan, slow)
    assert a > 4 and a % 2 == 0
    assert summary["blocks"]["new"] == [[0, a], [a, 8]]
    assert summary["predicted_step_s"] == pytest.approx(t + OUTSIDE_S, rel=1e-9)


def test_a_flash_plans_run_is_split_as_the_runner_computed_it(tmp_path):
    """The measurements are the reference runner's, which computes in float32 with attention
    unfused and the plain loss whatever the plan priced (planner.profile.from_run.run_context):
    a flash plan's per-block and fixed times are split in those kernels' proportions, as
    ``profile --from-run`` splits them, not in the flash core's."""
    from planner.launch.measurements import load
    from planner.rebalance_blocks import replica_lines
    base = make_plan((4, 4))
    data = base.to_json()
    data["inputs"]["training"] = {**data["inputs"]["training"], "seq_len": 512, "attention": "flash"}
    plan = Plan.from_json(data)
    (tmp_path / "m.json").write_text(json.dumps(measurements(plan, {(0, 0): 1.0, (1, 0): 2.0})))
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    cluster = api.load_cluster(tmp_path / "cluster.yaml")
    result, _ = api.rebalance(cluster, plan, tmp_path / "m.json", blocks=True)
    doc, times = load(tmp_path / "m.json", plan)
    used = range(1, len(doc["steps"]))
    ran = replica_lines(context_for_plan(plan, precision="fp32", flash_attention=False, cross_entropy="plain"),
                        cluster, plan, times, used, "m.json")
    priced = replica_lines(context_for_plan(plan), cluster, plan, times, used, "m.json")
    line, want, other = result.lines[(1, 0)], ran[(1, 0)], priced[(1, 0)]
    assert want.per_block_s / want.fixed_s != pytest.approx(other.per_block_s / other.fixed_s)
    assert (line.per_block_s, line.fixed_s) == pytest.approx((want.per_block_s, want.fixed_s))


def test_human_summary_names_split_and_times(tmp_path, capsys):
    plan = make_plan((4, 4))
    assert run_cli(tmp_path, plan, measurements(plan, {(0, 0): 1.0, (1, 0): 2.0}), "--blocks") == 0
    out = capsys.readouterr().out
    assert "blocks: [0,4) [4,8) -> " in out and "with the new split and shares" in out


def test_balanced_split_is_kept(tmp_path, capsys):
    slow = {(0, 0): 1.0, (1, 0): 1.0}
    a, _ = brute_force(make_plan((4, 4)), slow)   # the optimum for equal speeds
    plan = make_plan((a, 8 - a))
    assert run_cli(tmp_path, plan, measurements(plan, slow), "--blocks", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["blocks"]["new"] == summary["blocks"]["old"] and not summary["blocks"]["moved"]
    assert summary["predicted_step_s"] == pytest.approx(summary["predicted_old_step_s"], rel=1e-9)


def test_replicated_stage_reshares_after_the_split(tmp_path, capsys):
    """Stage 1 in two replicas, one 3x slower: shares move first (as rebalance does without
    --blocks); the split then prices the stage at its re-solved shares."""
    plan = make_plan((4, 4), shares=((4,), (2, 2)))
    slow = {(0, 0): 1.0, (1, 0): 1.0, (1, 1): 3.0}
    assert run_cli(tmp_path, plan, measurements(plan, slow), "--blocks", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["shares"]["1/0"] > summary["shares"]["1/1"]
    assert summary["predicted_step_s"] <= summary["blocks"]["predicted_shares_only_step_s"] * (1 + 1e-12)
    assert summary["blocks"]["predicted_shares_only_step_s"] < summary["predicted_old_step_s"]


def test_split_that_does_not_fit_is_refused(tmp_path, capsys):
    """The same GPU spec with two memory sizes: with room, the slow stage 1 hands stage 0 six
    blocks or more; with memory for five blocks on stage 0 and not six, the DP stops at five."""
    slow = {(0, 0): 1.0, (1, 0): 4.0}
    plan = make_plan((4, 4))
    ctx = context_for_plan(plan)
    infl = in_flight_micro_batches("1f1b", 2, 0, M)
    need = [replica_memory(ctx, _node().gpu, 1, 4, nb, True, False, 1, infl).total_bytes for nb in (5, 6)]
    got = {}
    for label, memory_gb in (("roomy", 80.0), ("small", (need[0] + need[1]) / 2 / 1e9)):
        name = f"gpu-{label}"
        cluster = CLUSTER.replace(f"gpu: {GPU}", f"gpu: {{name: {name}, memory: {memory_gb:.6f} GB, "
                                  "peak_tflops: 312, memory_bandwidth: 2039 GB/s, intra_node_bandwidth: 600 GB/s}")
        custom = Plan.from_json(json.loads(plan.dumps().replace(GPU, name)))
        doc = measurements(plan, slow) | {"plan_sha256": _sha(custom)}
        assert run_cli(tmp_path, custom, doc, "--blocks", "--json", cluster=cluster) == 0
        got[label] = json.loads(capsys.readouterr().out)["blocks"]["new"]
    assert got["roomy"][0][1] >= 6
    assert got["small"] == [[0, 5], [5, 8]]


def _sha(plan):
    from planner.launch.measurements import plan_sha256
    return plan_sha256(plan)


@pytest.mark.parametrize("case, expect", [
    ("other-plan", "another plan"),
    ("one-stage", "one stage"),
    ("gpipe", "schedule 'gpipe'"),
    ("no-trained", "trained"),
])
def test_bad_input_exits_2(tmp_path, capsys, case, expect):
    plan = make_plan((4, 4))
    slow = {(0, 0): 1.0, (1, 0): 2.0}
    doc = measurements(plan, slow)
    if case == "other-plan":
        doc = measurements(make_plan((3, 5)), slow)
    elif case == "one-stage":
        plan = make_plan((8,), shares=((4,),))
        doc = measurements(plan, {(0, 0): 1.0})
    elif case == "gpipe":
        plan = make_plan((4, 4), schedule="gpipe")
        doc = measurements(plan, slow)
    elif case == "no-trained":
        doc["trained"] = None
    rc = run_cli(tmp_path, plan, doc, "--blocks")
    err = capsys.readouterr().err
    assert rc == 2, err
    assert expect in err and "Traceback" not in err
    assert not (tmp_path / "new.json").exists()


@pytest.mark.parametrize("case, expect", [
    ("compute-over-step", "steps[2].replicas: stage/replica 1/0 compute_s 50 s is longer than its step"),
    ("huge", "steps[0].replicas: stage/replica 0/0 compute_s 1e+308 s is longer than its step"),
    ("share-over-micro-batch", "the shares of stage 0 (0/0 1000) sum to 1000, but the plan's micro_batch_size is 4"),
    ("twice", "steps[*].replicas: stage/replica 1/0 is measured 6 times in 5 steps"),
])
def test_self_contradicting_measurements_exit_2_naming_the_file(tmp_path, capsys, case, expect):
    """As rebalance without --blocks: nothing priced, nothing written, the file and step named."""
    plan = make_plan((4, 4))
    doc = measurements(plan, {(0, 0): 1.0, (1, 0): 2.0})
    rows = doc["steps"]
    if case == "compute-over-step":
        rows[2]["replicas"][1]["compute_s"] = 50.0
    elif case == "huge":
        for step in rows:
            for row in step["replicas"]:
                row["compute_s"] = 1e308
    elif case == "share-over-micro-batch":
        rows[1]["replicas"][0]["share"] = 1000
        expect = "steps[1].replicas: " + expect
    else:
        rows[3]["replicas"].append(dict(rows[3]["replicas"][1]))
    rc = run_cli(tmp_path, plan, doc, "--blocks", "--json")
    captured = capsys.readouterr()
    assert rc == 2, captured.err
    assert f"m.json: {expect}" in captured.err and "Traceback" not in captured.err
    assert captured.out == "" and not (tmp_path / "new.json").exists()


def test_block_rebalanced_plan_has_no_stale_solver_block(tmp_path, capsys):
    plan = Plan.from_json({**make_plan((4, 4)).to_json(),
                           "solver": {"method": "milp", "status": "optimal", "objective": 1.0, "gap": 0.0}})
    slow = {(0, 0): 1.0, (1, 0): 2.0}
    assert run_cli(tmp_path, plan, measurements(plan, slow), "--blocks", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["blocks"]["moved"]
    new = json.loads((tmp_path / "new.json").read_text())
    assert "solver" not in new and "predicted" not in new
    # share x num_micro_batches sequences in a step's compute_s (measured at the old split)
    m = json.loads((tmp_path / "m.json").read_text())
    row = m["steps"][1]["replicas"][0]
    assert summary["sequences_per_s"]["0/0"] == pytest.approx(row["share"] * M / row["compute_s"])
