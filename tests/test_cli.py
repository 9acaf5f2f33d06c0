"""The command group: every command loads, the catalog lists, bugs never print a traceback."""

from __future__ import annotations

import json

import pytest

from planner.cli import main as cli_main
from planner.cli.main import COMMANDS, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name, capsys):
    assert main([name, "--help"]) == 0
    assert "Usage" in capsys.readouterr().out


def test_catalog_lists_gpus_and_models_with_sources(capsys):
    assert main(["catalog", "gpus", "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)
    assert len(gpus) == 19 and all(g["sources"] for g in gpus.values())
    assert main(["catalog", "models", "--json"]) == 0
    models = json.loads(capsys.readouterr().out)
    assert {"llama3-70b", "gpt3-175b", "opt-350m"} <= set(models)
    assert main(["catalog", "models"]) == 0
    assert "Model catalog" in capsys.readouterr().out


def test_unexpected_error_is_one_line_exit_3(monkeypatch, capsys):
    def boom(*args, **kwargs):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(cli_main.cli, "main", boom)
    assert main(["validate", "x.yaml"]) == 3
    err = capsys.readouterr().err
    assert "internal error" in err and "kaboom" in err and "Traceback" not in err


def test_unwritable_output_is_bad_input_and_nothing_is_left(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code = main(["plan", "cluster_specs/tiny-2gpu.yaml", "--model", "profiles/models/cpu-small.yaml",
                 "--global-batch-size", "4", "--seq-len", "128", "-o", str(blocker / "plan.json")])
    assert code == 2
    assert "cannot write" in capsys.readouterr().err
    assert blocker.read_text() == "not a folder"


def test_validate_given_a_plan_says_so_and_names_evaluate(tmp_path, capsys):
    """A plan file given to validate listed 16 keys unknown to a cluster spec."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": "planner.plan/v1", "inputs": {}, "stages": []}))
    assert main(["validate", str(plan)]) == 2
    err = capsys.readouterr().err
    assert f"{plan}:1:1: this is a plan (planner.plan/v1), not a cluster spec" in err
    assert "planner evaluate CLUSTER PLAN" in err and "unknown key" not in err
