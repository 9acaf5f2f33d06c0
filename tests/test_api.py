"""The Python API (DESIGN §7) prices a plan exactly as the CLI does and says what it rests on."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from planner import api
from planner.cli.main import main

ROOT = Path(__file__).parent.parent
SMALL = ROOT / "profiles" / "models" / "cpu-small.yaml"


@pytest.fixture(scope="module")
def cpu_result():
    cluster = api.load_cluster(ROOT / "cluster_specs" / "cpu-local.yaml")
    return cluster, api.plan(cluster, api.load_model(SMALL), api.Training(global_batch_size=4, seq_len=128),
                             time_limit_s=30)


def test_plan_records_measured_layer_costs(cpu_result):
    _, result = cpu_result
    record = result.plan.inputs.profiles
    assert record["estimated"] == []
    assert {k.split("/")[1] for k in record["measured"]} == {"embedding", "block", "head"}
    assert record["files"] and record["files"][0]["gpu_type"] == "cpu"


def test_api_evaluate_uses_the_cluster_profiles(cpu_result):
    cluster, result = cpu_result
    ev = api.evaluate(cluster, result.plan)
    assert ev.iteration_time_s == result.plan.predicted.iteration_time_s
    assert set(ev.sources.values()) == {"measured"}


def test_without_profiles_everything_is_estimated():
    cluster = api.load_cluster(ROOT / "cluster_specs" / "tiny-2gpu.yaml")
    result = api.plan(cluster, api.load_model(SMALL), api.Training(global_batch_size=4, seq_len=128),
                      time_limit_s=30)
    record = result.plan.inputs.profiles
    assert record["measured"] == [] and record["estimated"]
    assert "files" not in record


def test_cli_plan_file_matches_api_and_evaluate(tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = main(["plan", str(ROOT / "cluster_specs" / "cpu-local.yaml"), "--model", str(SMALL),
                 "--global-batch-size", "4", "--seq-len", "128", "-o", str(out), "--quiet"])
    assert code == 0
    written = json.loads(out.read_text())
    assert written["inputs"]["profiles"]["estimated"] == []
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask, "mode as a plain open() would give"
    capsys.readouterr()
    assert main(["evaluate", str(ROOT / "cluster_specs" / "cpu-local.yaml"), str(out), "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["iteration_time_s"] == written["predicted"]["iteration_time_s"]


def test_cli_evaluate_bad_plan_names_the_file(cpu_result, tmp_path, capsys):
    _, result = cpu_result
    data = result.plan.to_json()
    data["stages"][0]["replicas"][0]["devices"] = ["nope:0"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert main(["evaluate", str(ROOT / "cluster_specs" / "cpu-local.yaml"), str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: stages[0].replicas[0].devices[0]: unknown device 'nope:0'" in err
    assert "Traceback" not in err


def test_calibration_flag_changes_the_roofline_for_one_command(tmp_path, capsys):
    import yaml

    from planner.cost.calibration import default_calibration

    cluster = ROOT / "cluster_specs" / "tiny-2gpu.yaml"
    result = api.plan(api.load_cluster(cluster), api.load_model(SMALL),
                      api.Training(global_batch_size=4, seq_len=128), time_limit_s=30)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(result.plan.dumps())
    data = default_calibration().to_mapping()
    for entry in list(data["gpus"].values()) + list(data["architectures"].values()):
        entry["matmul_ceiling"] = 0.4  # about half the published max achievable matmul
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(data))

    def compute_s(*extra):
        assert main(["evaluate", str(cluster), str(plan_file), "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["breakdown_s"]["compute"]

    shipped = compute_s()
    assert compute_s("--calibration", str(slow)) > shipped
    assert compute_s() == shipped  # the flag held for one command only
    assert main(["evaluate", str(cluster), str(plan_file), "--calibration", str(tmp_path / "none.yaml")]) == 2
    assert "calibration file not found" in capsys.readouterr().err


def test_interpolated_layer_costs_are_recorded_as_such():
    cluster = api.load_cluster(ROOT / "cluster_specs" / "cpu-local.yaml")
    # The cpu profiles measured micro-batches 1, 2, 4, 8: a share of 3 is interpolated.
    result = api.plan(cluster, api.load_model(SMALL),
                      api.Training(global_batch_size=3, seq_len=128, micro_batch_sizes=(3,)),
                      time_limit_s=30)
    record = result.plan.inputs.profiles
    assert any("/mb3/" in k for k in record["interpolated"]), record
    assert not any("/mb3/" in k for k in record["measured"])
