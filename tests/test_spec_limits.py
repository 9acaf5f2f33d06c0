"""Hostile inputs: bounded before they are expanded, refused within a second with the bound
named and a location an editor can jump to (issue 19, Reliability)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from planner.cli.main import main
from planner.errors import InputError
from planner.spec import limits, load_cluster, load_training

CLUSTER = """\
name: t
zones: [{name: z1}, {name: z2}]
nodes:
  - {name: x, zone: z1, gpu: A100-SXM4-80GB, gpus_per_node: 8}
  - {name: y, zone: z2, gpu: A100-SXM4-80GB, gpus_per_node: 8}
links:
  - {between: [z1, z2], bandwidth: 10 Gbit/s, latency: 10 ms}
"""

# Nine levels of ten aliases each: 10**9 values once expanded, 400 bytes on disk.
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))

# The same through merge keys: each level merges the one before ten times.
MERGE_BOMB = "a: &a {x: 1}\n" + "".join(
    f"{b}: &{b} {{<<: [{', '.join([f'*{a}'] * 10)}]}}\n" for a, b in zip("abcdefgh", "bcdefghi"))


def _refused_quickly(path: Path, capsys) -> str:
    """validate's stderr, after checking it exits 2 within a second without a traceback."""
    t0 = time.monotonic()
    assert main(["validate", str(path)]) == 2
    assert time.monotonic() - t0 < 1.0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_a_huge_node_count_is_refused_at_once_naming_the_limit(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER.replace("{name: x, zone: z1,", "{name: x, count: 1000000000000, zone: z1,"))
    err = _refused_quickly(path, capsys)
    assert f"{path}:4:" in err and "nodes[0].count" in err
    assert "1,000,000,000,001 nodes" in err and "MAX_NODES" in err


def test_too_many_gpus_per_node_and_in_all_are_refused(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER.replace("gpus_per_node: 8}\n  - {name: y", "gpus_per_node: 4096}\n  - {name: y"))
    err = _refused_quickly(path, capsys)
    assert f"{path}:4:" in err and "nodes[0].gpus_per_node" in err and "MAX_GPUS_PER_NODE" in err
    nodes = limits.MAX_NODES // 2
    per_node = limits.MAX_GPUS // nodes + 1          # under both per-group bounds, over the total
    assert per_node <= limits.MAX_GPUS_PER_NODE
    path.write_text(CLUSTER.replace("{name: x, zone: z1, gpu: A100-SXM4-80GB, gpus_per_node: 8}",
                                    f"{{name: x, count: {nodes}, zone: z1, gpu: A100-SXM4-80GB, "
                                    f"gpus_per_node: {per_node}}}"))
    err = _refused_quickly(path, capsys)
    assert f"{path}:4:" in err and "MAX_GPUS " in err.replace(")", " ")


def test_a_cluster_at_the_largest_bench_size_loads(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER.replace("{name: x, zone: z1,", "{name: x, count: 2048, zone: z1,"))
    assert load_cluster(path).num_gpus == 2049 * 8


@pytest.mark.parametrize("bomb", [ALIAS_BOMB, MERGE_BOMB], ids=["aliases", "merge-keys"])
def test_a_yaml_alias_bomb_is_refused_within_a_second(tmp_path, capsys, bomb):
    assert len(bomb) < 500
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb)
    err = _refused_quickly(path, capsys)
    assert "MAX_ALIAS_VALUES" in err and f"{path}:" in err
    # the same bomb inside a training file, a model file: one loader, one bound
    with pytest.raises(InputError, match="MAX_ALIAS_VALUES"):
        load_training(path)


def test_a_few_aliases_are_still_fine(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER.replace("gpu: A100-SXM4-80GB, gpus_per_node: 8}\n  - {name: y, zone: z2, "
                                    "gpu: A100-SXM4-80GB", "gpu: &g A100-SXM4-80GB, gpus_per_node: 8}\n"
                                    "  - {name: y, zone: z2, gpu: *g"))
    assert load_cluster(path).num_gpus == 16


def test_a_link_from_a_zone_to_itself_is_an_error(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER + "  - {between: [z1, z1], bandwidth: 10 Gbit/s}\n")
    err = _refused_quickly(path, capsys)
    assert f"{path}:8:" in err and "links[1].between" in err and "two different zones" in err


def test_a_region_may_still_be_linked_to_itself(tmp_path):
    """[east, east] joins east's zones with each other (DESIGN §2), not a zone with itself."""
    text = CLUSTER.replace("{name: z1}, {name: z2}", "{name: z1, region: east}, {name: z2, region: east}")
    path = tmp_path / "c.yaml"
    path.write_text(text.replace("[z1, z2]", "[east, east]"))
    assert load_cluster(path).link("z1", "z2") is not None


@pytest.mark.parametrize("text, needle", [
    ("", "the file is empty"),
    ("# only a comment\n", "the file is empty"),
    ("name: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
], ids=["empty", "comment only", "nested thousands deep"])
def test_whole_file_errors_name_line_one(tmp_path, capsys, text, needle):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    err = _refused_quickly(path, capsys)
    assert f"error: {path}:1:" in err and needle in err


def test_nesting_past_the_bound_names_where(tmp_path, capsys):
    """Deeper than MAX_NESTING_DEPTH but shallow enough for PyYAML: the line of the level
    that crosses the bound."""
    depth = limits.MAX_NESTING_DEPTH + 5
    path = tmp_path / "c.yaml"
    path.write_text("name: t\nnodes:\n" + "".join("  " * (i + 1) + "- \n" for i in range(depth)) + "  " * (depth + 1) + "- 1\n")
    err = _refused_quickly(path, capsys)
    # the root mapping is level 1 and nodes' list level 2 on line 3: level d starts on line
    # d + 1, and the first past the bound is d = MAX + 1
    assert "MAX_NESTING_DEPTH" in err and f"{path}:{limits.MAX_NESTING_DEPTH + 2}:" in err


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(limits, "MAX_FILE_BYTES", 100)
    path = tmp_path / "c.yaml"
    path.write_text(CLUSTER)
    err = _refused_quickly(path, capsys)
    assert f"error: {path}:1: " in err and f"{len(CLUSTER):,} bytes" in err and "MAX_FILE_BYTES" in err


def test_a_plan_nested_thousands_deep_is_a_bad_file(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text("[" * 5000 + "]" * 5000)
    assert main(["evaluate", "cluster_specs/tiny-2gpu.yaml", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"error: {path}:1: nested too deeply" in err and "internal error" not in err


@pytest.mark.parametrize("text, needle", [("", "the file is empty"), ("[1, 2]\n", "a calibration file is a mapping")])
def test_an_empty_or_foreign_calibration_file_is_refused(tmp_path, capsys, text, needle):
    """An empty calibration file was taken as a calibration of all defaults, silently."""
    path = tmp_path / "cal.yaml"
    path.write_text(text)
    code = main(["plan", "cluster_specs/tiny-2gpu.yaml", "--model", "opt-350m", "--global-batch-size", "4",
                 "--seq-len", "256", "--calibration", str(path)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{path}:1" in err and needle in err
