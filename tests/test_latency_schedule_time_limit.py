"""The latency-aware schedule's time limit is checked as ``plan``'s and ``replan``'s is: a
positive, finite number of seconds (``planner.search.check_time_limit``), in the API and the
command, before anything is read, searched or written."""

from __future__ import annotations

import json
import math

import pytest
from test_latency_plan import TWO_DC

from planner import api
from planner.cli.main import main
from planner.errors import InputError


@pytest.fixture
def files(tmp_path):
    """Two one-GPU stages of a small model, one per datacenter (on test_latency_plan's cluster)."""
    (tmp_path / "cluster.yaml").write_text(TWO_DC)
    data = {
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "two-dc",
                   "model": {"name": "t", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                             "vocab_size": 1000},
                   "training": {"global_batch_size": 8, "seq_len": 256}},
        "micro_batch_size": 2, "num_micro_batches": 4, "schedule": "1f1b",
        "stages": [{"index": i, "blocks": [2 * i, 2 * i + 2], "embedding": i == 0, "head": i == 1,
                    "replicas": [{"gpu_type": "A100-SXM4-80GB", "tp": 1, "micro_batch_share": 2,
                                  "devices": [d]}]} for i, d in enumerate(["a-0:0", "b-0:0"])]}
    (tmp_path / "plan.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize("limit", [-1.0, 0.0, math.nan, math.inf])
def test_api_refuses_a_time_limit_plan_refuses(files, limit):
    cluster, plan = api.load_cluster(files / "cluster.yaml"), api.load_plan(files / "plan.json")
    with pytest.raises(InputError, match="the time limit must be a positive number of seconds"):
        api.latency_schedule(cluster, plan, exact=True, time_limit_s=limit)
    with pytest.raises(InputError, match="the time limit must be a positive number of seconds"):
        api.plan(cluster, api.load_model(plan.inputs.model), api.Training(global_batch_size=8, seq_len=256),
                 time_limit_s=limit)


@pytest.mark.parametrize("limit", ["0", "-1", "nan", "inf"])
def test_cli_refuses_it_before_writing(files, capsys, limit):
    out = files / "la.json"
    rc = main(["schedule", str(files / "cluster.yaml"), str(files / "plan.json"), "--latency-aware", "--exact",
               "--time-limit", limit, "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "the time limit must be a positive number of seconds" in err and "Traceback" not in err
    assert not out.exists()


def test_a_positive_time_limit_still_schedules(files, capsys):
    out = files / "la.json"
    assert main(["schedule", str(files / "cluster.yaml"), str(files / "plan.json"), "--latency-aware",
                 "--time-limit", "5", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["schedule"] == "latency-aware"
