"""``planner launch`` on the command line: exit codes, printing, and ``-o DIR`` writing all
files or none."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest
from test_launch_formats import make_plan, rep

from planner.cli.main import main
from planner.errors import InputError
from planner.launch import render, write

ONE_NODE = [[rep(["a:0", "a:1"]), rep(["a:2", "a:3"])], [rep(["a:4", "a:5"]), rep(["a:6", "a:7"])]]

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
    err = capsys.readouterr().err
    assert "wrote 4 files" in err and "removed" not in err


def test_prints_files_without_output_folder(plan_file, capsys):
    assert main(["launch", str(plan_file), "--format", "torchrun", "--master-addr", "h", "--json"]) == 0
    files = json.loads(capsys.readouterr().out)
    assert files == render(make_plan(), "torchrun", master_addr="h")
    assert main(["launch", str(plan_file), "--format", "torchrun", "--master-addr", "h",
                 "--script", "my train.py"]) == 0
    text = capsys.readouterr().out
    assert "==> node0-a.sh <==" in text and "'my train.py'" in text


@pytest.mark.parametrize("fmt", ["torchrun", "megatron", "deepspeed", "pipelining", "torchtitan"])
def test_a_single_node_rendezvous_at_localhost_unless_given(fmt):
    """Every process of a one-node plan runs on that node: --master-addr was required even then."""
    import json as json_

    files = render(make_plan(ONE_NODE), fmt)
    assert json_.loads(files["rank_map.json"])["master_addr"] == "localhost"
    script = next(text for name, text in files.items() if name.endswith(".sh"))
    assert "--master-addr localhost" in script
    given = render(make_plan(ONE_NODE), fmt, master_addr="10.0.0.7")
    assert json_.loads(given["rank_map.json"])["master_addr"] == "10.0.0.7"


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


def _two_node_cluster(tmp_path, a_gpus: int, b_gpus: int):
    """cluster.yaml of two A100 nodes, a and b, with these GPU counts."""
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("name: t\nnodes:\n"
                       f"  - {{name: a, gpu: A100-SXM4-80GB, gpus_per_node: {a_gpus}, network_bandwidth: 100 Gbit/s}}\n"
                       f"  - {{name: b, gpu: A100-SXM4-80GB, gpus_per_node: {b_gpus}, network_bandwidth: 100 Gbit/s}}\n")
    return cluster


def test_cluster_option_pins_partly_used_nodes(tmp_path, capsys):
    cluster = _two_node_cluster(tmp_path, 8, 4)
    plan = tmp_path / "plan.json"
    plan.write_text(make_plan().dumps())
    assert main(["launch", str(plan), "--format", "pipelining", "--master-addr", "h",
                 "--cluster", str(cluster), "--json"]) == 0
    files = json.loads(capsys.readouterr().out)
    assert "export CUDA_VISIBLE_DEVICES=0,1,2,3" in files["node0-a.sh"]
    assert "CUDA_VISIBLE_DEVICES" not in files["node1-b.sh"]


@pytest.mark.parametrize("gpu", ["H100-SXM5-80GB", "Z9000"])
def test_cluster_option_checks_each_replicas_gpu_type(tmp_path, capsys, gpu):
    """Found by a robustness sweep: an H100 (or unknown Z9000) replica on an A100 node got its
    launch files written, rc 0, while `planner evaluate` refused the plan; with --cluster the
    launch applies evaluate's checks of the plan against the cluster."""
    cluster = _two_node_cluster(tmp_path, 4, 4)
    plan = tmp_path / "plan.json"
    plan.write_text(make_plan([[rep(["a:0", "a:1"]), rep(["a:2", "a:3"])],
                               [rep(["b:0", "b:1"]), rep(["b:2", "b:3"], gpu=gpu)]]).dumps())
    out = tmp_path / "out"
    args = ["launch", str(plan), "--format", "torchrun", "--master-addr", "h", "--cluster", str(cluster)]
    assert main([*args, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert (f"{plan}: stages[1].replicas[1].gpu_type: gpu_type {gpu!r} does not match node 'b', "
            "which holds A100-SXM4-80GB") in err
    assert "Traceback" not in err and not out.exists()
    assert main(["evaluate", str(cluster), str(plan)]) == 2   # the same refusal
    assert f"{plan}: stages[1].replicas[1].gpu_type" in capsys.readouterr().err
    assert main(args[:-2] + ["--json"]) == 0                  # without the cluster: nothing to check against


def test_cluster_option_refuses_devices_it_lacks(tmp_path, capsys):
    cluster = _two_node_cluster(tmp_path, 4, 2)
    plan = tmp_path / "plan.json"
    plan.write_text(make_plan().dumps())
    assert main(["launch", str(plan), "--format", "megatron", "--master-addr", "h", "--cluster", str(cluster)]) == 2
    err = capsys.readouterr().err
    assert "launch: stage 1 replica 1 uses b:2, but b has 2 GPUs (indices 0..1)" in err and "Traceback" not in err


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


# -- an earlier launch in the folder ------------------------------------------------------------
# Found by a robustness sweep: a launch of a 1-node plan into a folder holding a 12-node launch
# said it wrote 2 files and left the other 11 node scripts, so `node*.sh` started a mixture.

def _launch(plan_file, out, fmt="torchrun", *extra):
    return main(["launch", str(plan_file), "--format", fmt, "--master-addr", "h", "-o", str(out), *extra])


@pytest.fixture()
def one_node_file(tmp_path):
    path = tmp_path / "one-node.json"
    path.write_text(make_plan(ONE_NODE).dumps())
    return path


def test_an_earlier_launchs_files_are_removed_and_named(plan_file, one_node_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert _launch(plan_file, out, "megatron") == 0
    # a person's files beside the launch, one of them named like a node script
    (out / "notes.txt").write_text("mine\n")
    (out / "node7-mine.sh").write_text("#!/bin/sh\n")
    capsys.readouterr()
    assert _launch(one_node_file, out) == 0
    err = capsys.readouterr().err
    assert "wrote 2 files" in err
    assert "removed 2 files of an earlier launch: megatron_args.json, node1-b.sh" in err
    assert sorted(p.name for p in out.iterdir()) == ["node0-a.sh", "node7-mine.sh", "notes.txt", "rank_map.json"]
    assert (out / "rank_map.json").read_text() == render(make_plan(ONE_NODE), "torchrun", master_addr="h")["rank_map.json"]
    # --json: the same, as paths
    assert _launch(plan_file, out, "deepspeed", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["removed"] == [] and data["kept"] == []
    assert _launch(one_node_file, out, "torchrun", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert sorted(os.path.basename(p) for p in data["removed"]) == [
        "deepspeed_pipeline.json", "ds_config.json", "node1-b.sh", "pipeline_module.py"]


def test_files_changed_since_the_launch_are_kept_with_a_warning(plan_file, one_node_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert _launch(plan_file, out, "deepspeed") == 0
    (out / "ds_config.json").write_text('{"optimizer": "completed by hand"}\n')
    capsys.readouterr()
    assert _launch(one_node_file, out) == 0
    err = capsys.readouterr().err
    assert ("warning: kept 1 file of an earlier launch in " + str(out) + " that was changed since the "
            "planner wrote it: ds_config.json; delete it if stale") in err
    assert "removed 3 files of an earlier launch: deepspeed_pipeline.json, node1-b.sh, pipeline_module.py" in err
    assert (out / "ds_config.json").read_text() == '{"optimizer": "completed by hand"}\n'
    # the new rank map lists only its own files: the kept one is the person's from now on
    assert _launch(one_node_file, out) == 0
    assert "ds_config.json" not in capsys.readouterr().err


def test_a_rank_map_without_a_file_list_keeps_its_node_scripts(plan_file, one_node_file, tmp_path, capsys):
    """A launch written before rank maps listed their files (the sweep's folder): its map names
    its node scripts with no checksum, and an edited script keeps its "Generated by" line, so
    none of them is known to be the planner's bytes: all are kept and named, none deleted."""
    out = tmp_path / "out"
    assert _launch(plan_file, out, "megatron") == 0
    old = json.loads((out / "rank_map.json").read_text())
    del old["files"]
    (out / "rank_map.json").write_text(json.dumps(old))
    (out / "node0-a.sh").write_text("#!/bin/sh\n")      # overwritten either way
    edited = (out / "node1-b.sh").read_text() + "echo my edit\n"
    assert "Generated by `planner launch`" in edited
    (out / "node1-b.sh").write_text(edited)
    capsys.readouterr()
    assert _launch(one_node_file, out) == 0
    err = capsys.readouterr().err
    assert (out / "node1-b.sh").read_text() == edited
    assert ("warning: kept 1 node script of an earlier launch in " + str(out) + " (an older rank map "
            "records no checksums; delete it yourself if stale): node1-b.sh") in err
    assert "removed" not in err
    # the old map did not say megatron_args.json was the planner's: left alone, not named
    assert sorted(p.name for p in out.iterdir()) == ["megatron_args.json", "node0-a.sh", "node1-b.sh",
                                                     "rank_map.json"]
    # an untouched script is kept too (nothing proves it untouched); --json lists it as kept
    assert _launch(plan_file, out) == 0
    (out / "rank_map.json").write_text(json.dumps(old))
    capsys.readouterr()
    assert _launch(one_node_file, out, "torchrun", "--json") == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["removed"] == [] and [os.path.basename(p) for p in data["kept"]] == ["node1-b.sh"]
    assert "kept 1 node script of" in captured.err and (out / "node1-b.sh").exists()


def _snapshot(folder):
    """Every entry of ``folder``, hidden ones included: bytes and mode, a folder's entries, or
    a link's target."""
    out = {}
    for p in sorted(folder.iterdir()):
        mode = stat.S_IMODE(os.lstat(p).st_mode)
        if p.is_symlink():
            out[p.name] = ("link", os.readlink(p))
        else:
            out[p.name] = (_snapshot(p) if p.is_dir() else p.read_bytes(), mode)
    return out


@pytest.mark.parametrize("in_the_way", ["folder", "empty folder", "link"])
def test_a_name_taken_by_a_folder_or_link_is_refused_before_writing(plan_file, one_node_file, tmp_path,
                                                                    capsys, in_the_way):
    """Found in review: a folder named like a node script crashed the write (IsADirectoryError,
    exit 3) after the earlier launch was set aside: old and new files mixed, hidden leftovers."""
    out = tmp_path / "out"
    assert _launch(plan_file, out, "megatron") == 0
    (out / "node0-a.sh").unlink()
    if in_the_way == "link":
        (out / "node0-a.sh").symlink_to(tmp_path / "elsewhere.sh")
    else:
        (out / "node0-a.sh").mkdir()
        if in_the_way == "folder":
            (out / "node0-a.sh" / "mine.txt").write_text("mine\n")
    before = _snapshot(out)
    capsys.readouterr()
    assert _launch(one_node_file, out) == 2
    err = capsys.readouterr().err
    assert f"cannot write {out / 'node0-a.sh'}: it exists and is a " in err and "Traceback" not in err
    assert _snapshot(out) == before


def test_a_failed_rename_into_place_undoes_the_write(plan_file, one_node_file, tmp_path, monkeypatch, capsys):
    """All or none to the last rename: a failure on the k-th rename of the commit (setting the
    earlier launch aside, moving a replaced file aside, or putting a new file in place) leaves
    the folder exactly as it was, for every k."""
    files = render(make_plan(ONE_NODE), "torchrun", master_addr="h")
    real_rename = os.rename
    k = 0
    while True:
        k += 1
        out = tmp_path / f"out{k}"
        assert _launch(plan_file, out, "megatron") == 0
        (out / "notes.txt").write_text("mine\n")
        before = _snapshot(out)
        calls = {"n": 0}

        def failing_rename(src, dst, k=k, calls=calls):
            calls["n"] += 1
            if calls["n"] == k:
                raise OSError(5, "Input/output error", str(src))
            real_rename(src, dst)

        monkeypatch.setattr(os, "rename", failing_rename)
        try:
            written = write(files, out, replace_launch=True)
        except InputError as exc:
            assert "Input/output error" in str(exc) and "the folder is as it was" in str(exc)
            assert _snapshot(out) == before, f"rename {k}"
            continue
        finally:
            monkeypatch.setattr(os, "rename", real_rename)
        break
    # 2 stale files set aside, then per new file: the original aside and the new one in place
    assert k == 2 + 2 * len(files) + 1
    assert [p.name for p in written.removed] == ["megatron_args.json", "node1-b.sh"]
    assert sorted(p.name for p in out.iterdir()) == ["node0-a.sh", "notes.txt", "rank_map.json"]
    assert {n: (out / n).read_text() for n in files} == files


def test_a_rank_map_never_reaches_outside_the_folder_or_through_links(one_node_file, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.sh"
    victim.write_text("precious\n")
    (out / "node5-link.sh").symlink_to(victim)
    sha = hashlib.sha256(b"precious\n").hexdigest()
    names = ["../victim.sh", str(victim), ".hidden", "node5-link.sh", "rank_map.json"]
    (out / ".hidden").write_text("precious\n")
    (out / "rank_map.json").write_text(json.dumps({"schema": "planner.rank_map/v1",
                                                   "files": dict.fromkeys(names, sha)}))
    assert _launch(one_node_file, out) == 0
    err = capsys.readouterr().err
    assert "removed" not in err and "kept" not in err
    assert victim.read_text() == "precious\n" and (out / ".hidden").exists() and (out / "node5-link.sh").is_symlink()
    # a rank_map.json that is not the planner's (another schema, not JSON) names nothing
    for text in (json.dumps({"files": {"notes.txt": sha}}), "not json", "[1, 2]",
                 '{"schema": "planner.rank_map/v1", "nodes": 3}'):
        (out / "notes.txt").write_text("precious\n")
        (out / "rank_map.json").write_text(text)
        assert _launch(one_node_file, out) == 0
        assert (out / "notes.txt").exists()


def test_a_failed_write_keeps_the_earlier_launch_whole(plan_file, one_node_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    assert _launch(plan_file, out, "megatron") == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    files = render(make_plan(ONE_NODE), "torchrun", master_addr="h")
    real_rename, real_fsync = os.rename, os.fsync

    def failing_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)    # while staging: nothing set aside yet
    with pytest.raises(InputError, match="No space left on device"):
        write(files, out, replace_launch=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    monkeypatch.setattr(os, "fsync", real_fsync)
    calls = {"n": 0}

    def failing_rename(src, dst):       # the second stale file cannot be moved (a sticky folder)
        calls["n"] += 1
        if calls["n"] == 2:
            raise PermissionError(1, "Operation not permitted", str(src))
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", failing_rename)
    with pytest.raises(InputError, match="node1-b.sh, a file of an earlier launch: Operation not permitted"):
        write(files, out, replace_launch=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before   # no temporaries, nothing hidden
    monkeypatch.setattr(os, "rename", real_rename)
    written = write(files, out, replace_launch=True)
    assert [p.name for p in written.removed] == ["megatron_args.json", "node1-b.sh"]
    assert sorted(p.name for p in out.iterdir()) == ["node0-a.sh", "rank_map.json"]


def test_without_replace_launch_write_removes_nothing(plan_file, one_node_file, tmp_path):
    """write() is also every command's atomic file write (plan -o, profile): it only replaces
    the files it is given unless told the files are a launch."""
    out = tmp_path / "out"
    assert _launch(plan_file, out, "megatron") == 0
    written = write(render(make_plan(ONE_NODE), "torchrun", master_addr="h"), out)
    assert written.removed == [] and (out / "node1-b.sh").exists() and (out / "megatron_args.json").exists()


@pytest.mark.parametrize("schedule, blocks, want", [
    # the V: rank 0 holds the first piece (embedding) and the last (head)
    ("zb-v", ((0, 2), (2, 8)), ["0-1 +emb, 7-8 +head", "1-4, 4-7"]),
    # the loop: stage s holds pieces s and p + s
    ("interleaved-1f1b", ((0, 4), (4, 8)), ["0-2 +emb, 4-6", "2-4, 6-8 +head"]),
    ("1f1b", ((0, 4), (4, 8)), ["0-4 +emb", "4-8 +head"])])
def test_stage_tables_show_the_blocks_each_stage_runs(schedule, blocks, want):
    """A V stage's table row said "+head" on the last stage, where rank 0 runs the head, and
    an interleaved stage's range was not the blocks it runs (a robustness sweep)."""
    from planner.cli.common import blocks_cell

    plan = make_plan(blocks=blocks, schedule=schedule, virtual_stages=1 if schedule == "1f1b" else 2)
    assert [blocks_cell(plan, st) for st in plan.stages] == want
