"""Commands check what they can before working: ``replan -o`` and ``profile -o`` an output
that cannot be written (as ``plan`` does), ``validate`` the profile files of the cluster's
``profiles:`` (issue 19)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from planner.cli.main import main

ROOT = Path(__file__).parent.parent


@pytest.fixture
def blocked(tmp_path) -> Path:
    """A path under a regular file: no folder can be made there, even as root."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    return blocker / "out.yaml"


def test_replan_checks_its_output_before_reading_or_searching(blocked, capsys):
    # the plan file does not exist: had the output been checked after it, that would be the error
    code = main(["replan", str(ROOT / "cluster_specs/tiny-2gpu.yaml"), "no-such-plan.json", "-o", str(blocked)])
    assert code == 2
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.parametrize("mode", [["--model", "opt-350m", "--device", "cpu"],
                                  ["--calibrate", "no-such-profile.yaml"]], ids=["measure", "calibrate"])
def test_profile_checks_its_output_before_measuring(blocked, capsys, mode):
    assert main(["profile", *mode, "-o", str(blocked)]) == 2
    assert "cannot write" in capsys.readouterr().err


def _cluster_with_profile(tmp_path: Path, profile_text: str | None) -> Path:
    spec = tmp_path / "cluster.yaml"
    spec.write_text((ROOT / "cluster_specs/cpu-local.yaml").read_text()
                    .replace("../profiles/cpu-small-x2.yaml", "prof.yaml"))
    if profile_text is not None:
        (tmp_path / "prof.yaml").write_text(profile_text)
    return spec


def test_validate_loads_and_lists_the_clusters_profiles(tmp_path, capsys):
    spec = _cluster_with_profile(tmp_path, None)
    shutil.copy(ROOT / "profiles/cpu-small-x2.yaml", tmp_path / "prof.yaml")
    assert main(["validate", str(spec), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["profiles"]
    assert rows == [{"gpu_type": "cpu", "path": str(tmp_path / "prof.yaml"), "dtype": "fp32", "entries": 24}]
    assert main(["validate", str(spec)]) == 0
    assert "profile for cpu: " in capsys.readouterr().out


@pytest.mark.parametrize("text, needle", [
    (None, "profile file not found"),
    ("", "the file is empty"),
    ("schema: nonsense\n", "prof.yaml:1"),
], ids=["missing", "empty", "malformed"])
def test_validate_refuses_a_bad_profile_file(tmp_path, capsys, text, needle):
    spec = _cluster_with_profile(tmp_path, text)
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_a_profiles_entry_naming_a_folder_says_so(tmp_path, capsys):
    spec = _cluster_with_profile(tmp_path, None)
    (tmp_path / "prof.yaml").mkdir()
    assert main(["validate", str(spec)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'prof.yaml'} is a folder, not a profile file" in err and "--profiles" in err
    assert "not found" not in err
