"""``planner launch`` on the command line: exit codes, printing, and ``-o DIR`` writing all
files or none."""

from __future__ import annotations

import json
import os
import stat

import pytest
from test_launch_formats import make_plan, rep

from planner.cli.main import main
from planner.errors import InputError
from planner.launch import render, write

UNEVEN = [[rep(["a:0", "a:1"]), rep(["a:2", "a:3"])],
          [rep(["b:0", "b:1"], 1), rep(["b:2", "b:3"], 2), rep(["b:4", "b:5"], 1)]]


@pytest.fixture()
def plan_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(make_plan().dumps())
    return path


def test_writes_every_file_and_the_same_bytes_twice(plan_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["launch", str(plan_file), "--format", "megatron", "-o", str(out),
                 "--master-addr", "10.0.0.1", "--master-port", "6000"]) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["megatron_args.json", "node0-a.sh", "node1-b.sh", "rank_map.json"]
    first = {n: (out / n).read_bytes() for n in names}
    assert b"--master-port 6000" in first["node0-a.sh"]
    assert stat.S_IMODE(os.stat(out / "node0-a.sh").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(out / "rank_map.json").st_mode) == 0o644
    assert main(["launch", str(plan_file), "--format", "megatron", "-o", str(out),
                 "--master-addr", "10.0.0.1", "--master-port", "6000"]) == 0
    assert {n: (out / n).read_bytes() for n in names} == first
    assert "wrote 4 files" in capsys.readouterr().err


def test_prints_files_without_output_folder(plan_file, capsys):
    assert main(["launch", str(plan_file), "--format", "torchrun", "--master-addr", "h", "--json"]) == 0
    files = json.loads(capsys.readouterr().out)
    assert files == render(make_plan(), "torchrun", master_addr="h")
    assert main(["launch", str(plan_file), "--format", "torchrun", "--master-addr", "h",
                 "--script", "my train.py"]) == 0
    text = capsys.readouterr().out
    assert "==> node0-a.sh <==" in text and "'my train.py'" in text


def test_errors_exit_2_and_write_nothing(plan_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["launch", str(plan_file), "--format", "torchrun", "-o", str(out)]) == 2
    assert "--master-addr is required" in capsys.readouterr().err
    bad = tmp_path / "uneven.json"
    bad.write_text(make_plan(UNEVEN).dumps())
    assert main(["launch", str(bad), "--format", "megatron", "-o", str(out), "--master-addr", "h"]) == 2
    err = capsys.readouterr().err
    assert "stage 1 has 3 replicas, stage 0 has 2" in err and "Traceback" not in err
    assert not out.exists()
    (tmp_path / "broken.json").write_text("{not json")
    assert main(["launch", str(tmp_path / "broken.json"), "--format", "torchrun", "--master-addr", "h"]) == 2
    assert main(["launch", str(plan_file), "--format", "slurm", "--master-addr", "h"]) == 2
    assert main(["launch", str(plan_file), "--format", "torchrun", "--master-addr", "h",
                 "--master-port", "0"]) == 2


def test_failed_write_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "rank_map.json").write_text("old\n")
    files = render(make_plan(), "deepspeed", master_addr="h")
    calls = {"n": 0}
    real_fsync = os.fsync

    def failing_fsync(fd):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(InputError, match="No space left on device"):  # a user-facing error, exit 2
        write(files, out)
    assert sorted(p.name for p in out.iterdir()) == ["rank_map.json"]  # no temporaries left
    assert (out / "rank_map.json").read_text() == "old\n"
    monkeypatch.setattr(os, "fsync", real_fsync)
    written = write(files, out)
    assert sorted(p.name for p in written) == sorted(files)
    assert (out / "rank_map.json").read_text() == files["rank_map.json"]


def test_cluster_option_pins_partly_used_nodes(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("name: t\nnodes:\n"
                       "  - {name: a, gpu: A100-SXM4-80GB, gpus_per_node: 8, network_bandwidth: 100 Gbit/s}\n"
                       "  - {name: b, gpu: A100-SXM4-80GB, gpus_per_node: 4, network_bandwidth: 100 Gbit/s}\n")
    plan = tmp_path / "plan.json"
    plan.write_text(make_plan().dumps())
    assert main(["launch", str(plan), "--format", "pipelining", "--master-addr", "h",
                 "--cluster", str(cluster), "--json"]) == 0
    files = json.loads(capsys.readouterr().out)
    assert "export CUDA_VISIBLE_DEVICES=0,1,2,3" in files["node0-a.sh"]
    assert "CUDA_VISIBLE_DEVICES" not in files["node1-b.sh"]


@pytest.mark.parametrize("fmt", ["torchrun", "megatron", "pipelining"])
def test_a_broken_plan_file_is_refused_naming_the_file(plan_file, tmp_path, capsys, fmt):
    # found by scripts/fuzz_plans.py's bad inputs: evaluate named the file, launch said "<plan>"
    data = json.loads(plan_file.read_text())
    data["num_micro_batches"] += 1      # no longer micro-batch x count = global batch
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    assert main(["launch", str(edited), "--format", fmt, "--master-addr", "10.0.0.1"]) == 2
    err = capsys.readouterr().err
    assert f"{edited}: num_micro_batches: " in err and "<plan>" not in err
