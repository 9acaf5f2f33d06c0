"""evaluate() on hand-built clusters and plans: the terms add up, memory, money, CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from planner.cost import evaluate, iteration_time_s
from planner.plan import Plan
from planner.spec import cluster_from_dict

MODEL = {"name": "toy-gpt", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
         "vocab_size": 32000}

CLUSTER = {
    "name": "two-zones",
    "zones": [{"name": "za"}, {"name": "zb"}],
    "nodes": [
        {"name": "a", "count": 2, "zone": "za", "gpu": "A100-SXM4-80GB", "gpus_per_node": 4,
         "network_bandwidth": "200 Gbit/s", "price_per_hour": 10.0},
        {"name": "v", "count": 1, "zone": "zb", "gpu": "V100-SXM2-32GB", "gpus_per_node": 4,
         "network_bandwidth": "100 Gbit/s", "price_per_hour": 4.0},
    ],
    "links": [{"between": ["za", "zb"], "bandwidth": "10 Gbit/s", "latency": "20 ms",
               "egress_price_per_gb": 0.02}],
}


def replica(gpu, tp, share, devices):
    return {"gpu_type": gpu, "tp": tp, "micro_batch_share": share, "devices": devices}


def make_plan(**kw) -> Plan:
    data = {
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "two-zones", "model": MODEL,
                   "training": {"global_batch_size": 64, "seq_len": 1024, "precision": "fp16"}},
        "micro_batch_size": 4, "num_micro_batches": 16, "schedule": "1f1b",
        "recompute": "selective", "zero_stage": 1, "sequence_parallel": True,
        "stages": [
            {"index": 0, "blocks": [0, 5], "embedding": True, "head": False, "replicas": [
                replica("A100-SXM4-80GB", 2, 2, ["a-0:0", "a-0:1"]),
                replica("A100-SXM4-80GB", 2, 2, ["a-1:0", "a-1:1"])]},
            {"index": 1, "blocks": [5, 8], "embedding": False, "head": True, "replicas": [
                replica("A100-SXM4-80GB", 2, 1, ["a-0:2", "a-0:3"]),
                replica("V100-SXM2-32GB", 4, 3, ["v-0:0", "v-0:1", "v-0:2", "v-0:3"])]},
        ],
    }
    data.update(kw)
    return Plan.from_json(data)


@pytest.fixture(scope="module")
def cluster():
    return cluster_from_dict(CLUSTER)


def test_terms_sum_and_decompose(cluster):
    ev = evaluate(cluster, make_plan())
    assert set(ev.breakdown_s) == {"compute", "recompute", "tp_comm", "pp_comm", "bubble",
                                   "dp_sync_exposed", "optimizer"}
    assert sum(ev.breakdown_s.values()) == pytest.approx(ev.iteration_time_s)
    assert ev.iteration_time_s == pytest.approx(iteration_time_s(ev.stages, 16, "1f1b"))
    assert all(v >= 0 for v in ev.breakdown_s.values())
    assert ev.tokens_per_s == pytest.approx(64 * 1024 / ev.iteration_time_s)
    assert 0 < ev.mfu < 1
    # the cross-zone stage-1 ring (A100 + V100 replicas) and the boundary cost egress
    assert ev.egress_usd_per_hour > 0
    assert ev.usd_per_hour == pytest.approx(10.0 * 2 + 4.0 + ev.egress_usd_per_hour)
    assert ev.usd_per_million_tokens == pytest.approx(ev.usd_per_hour / (ev.tokens_per_s * 3600) * 1e6)
    assert ev.fits and not ev.memory_problems
    assert set(ev.peak_memory_bytes) == set(make_plan().devices())
    pred = ev.predicted()
    assert pred.iteration_time_s == ev.iteration_time_s
    rows = ev.explain()
    assert [r[0] for r in rows[:7]] == list(ev.breakdown_s) and all(r[2] for r in rows)
    json.dumps(ev.to_json())


def test_uneven_split_makes_v100_the_bottleneck(cluster):
    ev = evaluate(cluster, make_plan())
    # stage 1's slowest replica is the V100 one (share 3 of 4, older GPU)
    assert ev.stages[1].slowest_replica == 1
    # zone-link sends (20 ms latency) dominate pp_comm
    assert ev.stages[0].send_forward_s > 0.02


def test_schedule_and_recompute_move_the_terms(cluster):
    base = evaluate(cluster, make_plan())
    full = evaluate(cluster, make_plan(recompute="full"))
    assert full.breakdown_s["recompute"] > base.breakdown_s["recompute"]
    assert max(full.peak_memory_bytes.values()) < max(base.peak_memory_bytes.values())
    gp = evaluate(cluster, make_plan(schedule="gpipe"))
    assert max(gp.peak_memory_bytes.values()) > max(base.peak_memory_bytes.values())
    plan = make_plan()
    even = [st.model_copy(update={"blocks": (4 * i, 4 * i + 4)}) for i, st in enumerate(plan.stages)]
    one = evaluate(cluster, plan.model_copy(update={"stages": tuple(even)}))
    inter = evaluate(cluster, plan.model_copy(update={"stages": tuple(even), "schedule": "interleaved-1f1b",
                                                      "virtual_stages": 2}))
    # half the fill, but every micro-batch crosses the (slow, cross-zone) boundary twice as often
    assert inter.breakdown_s["pp_comm"] > 1.5 * one.breakdown_s["pp_comm"]
    assert inter.breakdown_s["bubble"] < one.breakdown_s["bubble"] + inter.breakdown_s["pp_comm"]


def test_memory_problem_names_device_amount_and_fixes(cluster):
    big = dict(MODEL, num_layers=8, hidden_size=16384, num_attention_heads=128)
    plan = make_plan(inputs={"cluster": "two-zones", "model": big,
                             "training": {"global_batch_size": 64, "seq_len": 1024, "precision": "fp16"}},
                     zero_stage=0, recompute="none")
    ev = evaluate(cluster, plan)
    assert not ev.fits
    msg = ev.memory_problems[0]
    assert "over by" in msg and "GiB" in msg and ":0" in msg
    assert "full recompute" in msg and "ZeRO-1" in msg and "tp=" in msg
    # every priced change says whether it fits alone (a list headed "would fit" named ones that
    # did not)
    assert "each change alone: " in msg and "would fit" not in msg
    assert msg.count("(fits)") + msg.count("(still over by") >= 3
    # the V100 replica already spans its 4-GPU node: no doubled TP is named for it
    v100 = [p for p in ev.memory_problems if "V100" in p]
    assert v100 and all("tp=8" not in p for p in v100) and "tp=4 (twice the GPUs)" in msg


def test_cli_evaluate_prints_and_exits(tmp_path, cluster):
    import yaml

    from planner.cli.main import main
    cpath = tmp_path / "c.yaml"
    cpath.write_text(yaml.safe_dump(CLUSTER))
    ppath = tmp_path / "p.json"
    ppath.write_text(make_plan().dumps())
    runner = CliRunner()
    from planner.cli.main import cli
    res = runner.invoke(cli, ["evaluate", str(cpath), str(ppath), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["iteration_time_s"] > 0 and data["fits"] is True
    res = runner.invoke(cli, ["evaluate", str(cpath), str(ppath)])
    assert res.exit_code == 0 and "dp_sync_exposed" in res.output and "MFU" in res.output
    big = make_plan(zero_stage=0, recompute="none", inputs={
        "cluster": "two-zones", "model": dict(MODEL, hidden_size=16384, num_attention_heads=128),
        "training": {"global_batch_size": 64, "seq_len": 1024, "precision": "fp16"}})
    ppath.write_text(big.dumps())
    assert main(["evaluate", str(cpath), str(ppath)]) == 1


def test_predicted_passes_the_plan_schema(cluster):
    from planner.plan.schema import validate_plan_json
    plan = make_plan()
    ev = evaluate(cluster, plan)
    with_pred = plan.model_copy(update={"predicted": ev.predicted()})
    validate_plan_json(with_pred.to_json())
    assert Plan.from_json(with_pred.to_json()).predicted.iteration_time_s == pytest.approx(ev.iteration_time_s)


def test_measured_profiles_replace_the_roofline(tmp_path):
    """cluster_specs/cpu-local.yaml names profiles/cpu-small.yaml for its pseudo-GPU 'cpu'."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    spec, model_file = root / "cluster_specs" / "cpu-local.yaml", root / "profiles" / "models" / "cpu-small.yaml"
    if not spec.exists() or not model_file.exists():
        pytest.skip("cpu-local profiles not present")
    import yaml

    from planner.cli.main import cli
    from planner.profile import load_profiles
    from planner.spec import load_cluster
    model = yaml.safe_load(model_file.read_text())
    plan = Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "cpu-local", "model": model,
                   "training": {"global_batch_size": 4, "seq_len": 128, "precision": "bf16"}},
        "micro_batch_size": 2, "num_micro_batches": 2,
        "stages": [{"index": 0, "blocks": [0, model["num_layers"]], "embedding": True, "head": True,
                    "replicas": [replica("cpu", 1, 2, ["cpu:0"])]}]})
    cluster = load_cluster(spec)
    profiles = load_profiles(None, cluster=cluster, cluster_path=spec)
    ev = evaluate(cluster, plan, profiles=profiles)
    assert ev.sources and set(ev.sources.values()) == {"measured"}
    ppath = tmp_path / "p.json"
    ppath.write_text(plan.dumps())
    res = CliRunner().invoke(cli, ["evaluate", str(spec), str(ppath)])
    assert res.exit_code == 0 and "3 measured" in res.output


def test_the_plans_attention_kernel_and_loss_are_priced(cluster):
    """inputs.training's attention and cross_entropy reach the evaluation: flash drops the s x s
    scores the unfused core keeps (recompute none), plain adds the loss's fp32 tensors."""
    def plan_with(**training):
        t = {"global_batch_size": 64, "seq_len": 1024, "precision": "fp16", **training}
        return make_plan(recompute="none", inputs={"cluster": "two-zones", "model": MODEL, "training": t})

    def peak(**training):
        return evaluate(cluster, plan_with(**training)).peak_memory_bytes

    unfused, flash, plain = peak(), peak(attention="flash"), peak(cross_entropy="plain")
    assert peak(attention="unfused") == unfused      # an absent key: unfused, as plans before flash's default
    assert all(flash[d] < unfused[d] for d in unfused)               # every stage holds scores
    head_devices = {d for r in plan_with().stages[1].replicas for d in r.devices}
    assert {d for d in unfused if plain[d] > unfused[d]} == head_devices
    assert all(plain[d] == unfused[d] for d in unfused if d not in head_devices)
