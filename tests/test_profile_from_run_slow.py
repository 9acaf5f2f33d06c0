"""``planner profile --from-run`` on a real run: the reference runner trains a 2-replica plan on
gloo, one replica on GPU type cpu-b made 3x slower (``--slow-rank``); the profiles made from its
measurements predict the measured step time closer than the cost model did without them (the
two GPU types have identical specs, so without a profile it cannot see the slow one)."""

from __future__ import annotations

import json
import statistics

import pytest
from test_profile_from_run import CLUSTER, make_plan

from planner import api
from planner.cli.main import main
from planner.plan import Plan

pytestmark = pytest.mark.slow

STEPS = 6
TOLERANCE = 0.25  # as tests/test_profile_e2e.py: one run's median step on a shared CPU


def pipeline_plan() -> Plan:
    """Two stages, one replica each: embedding + block 0 on cpu-a, block 1 + head on cpu-b."""
    data = json.loads(make_plan(precision="fp32").dumps())
    data["stages"] = [
        {"index": 0, "blocks": [0, 1], "embedding": True, "head": False, "replicas": [
            {"gpu_type": "cpu-a", "tp": 1, "micro_batch_share": 8, "devices": ["fast:0"]}]},
        {"index": 1, "blocks": [1, 2], "embedding": False, "head": True, "replicas": [
            {"gpu_type": "cpu-b", "tp": 1, "micro_batch_share": 8, "devices": ["slow:0"]}]}]
    return Plan.from_json(data)


@pytest.mark.parametrize("plan", [make_plan(precision="fp32"), pipeline_plan()], ids=["dp2", "pp2"])
def test_profile_from_a_run_predicts_its_step_time(tmp_path, capsys, plan):
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "plan.json").write_text(plan.dumps())
    m = tmp_path / "m.json"
    # rank 1 is the replica on node "slow" (ranks node by node, in the plan's order)
    rc = main(["run", str(tmp_path / "plan.json"), "--steps", str(STEPS), "--measurements", str(m),
               "--slow-rank", "1:3", "--json"])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    rc = main(["profile", "--from-run", str(m), "--plan", str(tmp_path / "plan.json"),
               "--cluster", str(tmp_path / "cluster.yaml"), "-o", str(tmp_path / "prof"), "--json"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    scale = summary["measured_over_predicted"]
    # the slowed replica's layers came out slower than the other's (3x less the shared costs)
    assert scale["cpu-b"] > 1.5 * scale["cpu-a"], scale

    cluster = api.load_cluster(tmp_path / "cluster.yaml")
    doc = json.loads(m.read_text())
    measured = statistics.median(s["step_time_s"] for s in doc["steps"][1:])
    before = api.evaluate(cluster, plan, grad_reduce_overlap=False).iteration_time_s
    after = api.evaluate(cluster, plan, profiles=tmp_path / "prof", grad_reduce_overlap=False).iteration_time_s
    err_before, err_after = before / measured - 1, after / measured - 1
    assert abs(err_after) < min(abs(err_before), TOLERANCE), (
        f"measured {measured * 1e3:.1f} ms; predicted without the profile {before * 1e3:.1f} ms "
        f"({err_before:+.1%}), with it {after * 1e3:.1f} ms ({err_after:+.1%})")
    print(f"measured {measured * 1e3:.1f} ms; without profile {before * 1e3:.1f} ms ({err_before:+.1%}); "
          f"with it {after * 1e3:.1f} ms ({err_after:+.1%})")


def test_a_flash_plans_run_says_it_computed_attention_unfused(tmp_path, capsys):
    """The runner computes attention unfused whatever the plan priced: a flash plan's
    ``--measurements`` run says so, and its profiles are labelled attention: unfused."""
    data = json.loads(make_plan(precision="fp32").dumps())
    data["inputs"]["training"]["attention"] = "flash"
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "plan.json").write_text(json.dumps(data))
    m = tmp_path / "m.json"
    assert main(["run", str(tmp_path / "plan.json"), "--steps", "2", "--measurements", str(m), "--json"]) == 0
    assert "computes attention unfused" in capsys.readouterr().err
    assert main(["profile", "--from-run", str(m), "--plan", str(tmp_path / "plan.json"), "--warmup", "1",
                 "--cluster", str(tmp_path / "cluster.yaml"), "-o", str(tmp_path / "prof"), "--json"]) == 0
    written = sorted((tmp_path / "prof").glob("*.yaml"))
    assert written and all("attention: unfused" in f.read_text() for f in written)
    assert main(["run", str(tmp_path / "plan.json"), "--steps", "1", "--json"]) == 0
    assert "attention" not in capsys.readouterr().err     # no measurements: the same maths, no note
