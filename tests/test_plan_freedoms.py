"""``plan --schedule / --recompute / --zero-stage`` narrow the search as the training file's
``schedules`` / ``recompute_modes`` / ``zero_stages`` do (issue 19)."""

from __future__ import annotations

import json

import pytest

from planner.cli.main import main

BASE = ["plan", "cluster_specs/tiny-2gpu.yaml", "--model", "opt-350m", "--time-limit", "60", "--json", "--quiet"]
BATCH = ["--global-batch-size", "4", "--seq-len", "256"]


@pytest.mark.parametrize("flags, expected", [
    (["--recompute", "full", "--schedule", "gpipe", "--zero-stage", "0"],
     {"recompute": "full", "schedule": "gpipe", "zero_stage": 0}),
    (["--recompute", "selective,full", "--zero-stage", "1"], {"zero_stage": 1}),
])
def test_flags_narrow_the_search(capsys, flags, expected):
    assert main([*BASE, *BATCH, *flags]) == 0
    plan = json.loads(capsys.readouterr().out)
    for key, value in expected.items():
        assert plan[key] == value
    if "selective,full" in flags:
        assert plan["recompute"] in ("selective", "full")


@pytest.mark.parametrize("flags, needle", [
    (["--recompute", "partial"], "recompute_modes[0]: Input should be 'none', 'selective', 'full' or 'op'"),
    (["--zero-stage", "4"], "zero_stages[0]: Input should be 0, 1, 2 or 3"),
    (["--zero-stage", "one"], "give ZeRO stages 0 to 3"),
    (["--schedule", ","], "give one or more choices"),
])
def test_bad_flags_are_input_errors(capsys, flags, needle):
    assert main([*BASE, *BATCH, *flags]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_a_flag_contradicting_the_training_file_is_refused(tmp_path, capsys):
    path = tmp_path / "t.yaml"
    path.write_text("global_batch_size: 4\nseq_len: 256\nrecompute_modes: [none]\n")
    assert main([*BASE, "--training", str(path), "--recompute", "full"]) == 2
    assert f"contradicts recompute_modes: ['none'] in {path}" in capsys.readouterr().err
    # the same choice, or a freedom the file leaves open, is fine
    assert main([*BASE, "--training", str(path), "--recompute", "none", "--zero-stage", "0"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["recompute"] == "none" and plan["zero_stage"] == 0


def test_an_error_on_one_flags_field_names_that_flag_alone(capsys):
    # seen in scripts/fuzz_plans.py's output: "--recompute / --context-parallel:
    # context_parallel_degrees: ..." named every flag given, sending the user to --recompute too
    assert main([*BASE, "--global-batch-size", "4", "--seq-len", "100", "--recompute", "full",
                 "--context-parallel", "1,8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --context-parallel: context_parallel_degrees: ") and "--recompute" not in err
