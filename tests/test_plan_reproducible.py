"""The plan file is the same bytes for the same inputs (timing and counters go to stderr and
``--report``), and Ctrl-C during ``plan`` keeps the best plan found so far (issue 19)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planner.errors import INTERRUPTED_EXIT
from planner.plan import Plan
from planner.plan.model import PLAN_SOLVER_FIELDS
from planner.plan.schema import validate_plan_json

ROOT = Path(__file__).parent.parent
# small enough that the search completes well inside its limit: nothing is cut by the clock
JOB = ["plan", str(ROOT / "cluster_specs/tiny-2zone.yaml"), "--model", "opt-350m",
       "--global-batch-size", "8", "--seq-len", "256", "--time-limit", "60"]


def _planner(args: list[str], seed: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", "import sys; from planner.cli.main import main; sys.exit(main())",
                             *args], env=env, text=True, **popen)


def test_the_same_inputs_give_the_same_plan_bytes_under_any_hash_seed(tmp_path):
    plans, reports = [], []
    for seed in ("0", "1", "4242"):
        out, report = tmp_path / f"plan-{seed}.json", tmp_path / f"report-{seed}.json"
        proc = _planner([*JOB, "-o", str(out), "--report", str(report)], seed,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stdout, stderr = proc.communicate(timeout=240)
        assert proc.returncode == 0, stderr
        assert "search: " in stderr and " s, " in stderr and "answer found at " in stderr   # timing: stderr
        assert "search: " not in stdout and "solver: optimal" in stdout
        plans.append(out.read_bytes())
        reports.append(json.loads(report.read_text()))
    assert plans[0] == plans[1] == plans[2]
    solver = json.loads(plans[0])["solver"]
    assert set(solver) <= set(PLAN_SOLVER_FIELDS) and "wall_s" not in solver and "answer_found_s" not in solver
    for report in reports:      # the report holds what the plan left out, and the plan's verdict
        assert report["wall_s"] > 0 and report["knob_tuples"] >= report["knob_tuples_solved"] > 0
        assert 0 <= report["answer_found_s"] <= report["wall_s"]      # when the answer first entered
        assert report["status"] == solver["status"] and report["gap"] == solver["gap"]


def test_an_old_plan_file_with_timing_still_loads(tmp_path):
    """Plans written before the timing left them carry solver.wall_s and candidates."""
    out = tmp_path / "plan.json"
    proc = _planner([*JOB, "-o", str(out), "--quiet"], "0")
    assert proc.wait(timeout=240) == 0
    data = json.loads(out.read_text())
    data["solver"].update(wall_s=12.5, candidates=7)
    validate_plan_json(data)
    assert Plan.from_json(data).solver.for_plan().model_dump(exclude_none=True) == \
        json.loads(out.read_text())["solver"]


def test_ctrl_c_writes_the_best_plan_so_far_and_says_so(tmp_path):
    """three-zone's warm start finds a plan in a few seconds, then the search runs on for
    half a minute: Ctrl-C after the first incumbent must keep it.  Sequences of 8192 tokens: with
    flash attention (the default) the warm start of the 4096-token job finds no plan in its share
    of the time, and this one announces its incumbent after ~10 s, as that job did unfused."""
    out, report = tmp_path / "plan.json", tmp_path / "report.json"
    args = ["plan", str(ROOT / "cluster_specs/three-zone.yaml"), "--model", "llama3-8b",
            "--global-batch-size", "256", "--seq-len", "8192", "--time-limit", "120",
            "-o", str(out), "--report", str(report)]
    proc = _planner(args, "0", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen = []
    try:
        for line in proc.stderr:                    # progress lines on stderr
            seen.append(line)
            if line.startswith("warm start ") and line.rstrip().endswith(" s"):
                break                               # an incumbent is being recorded
        else:
            pytest.fail("no incumbent announced: " + "".join(seen))
        time.sleep(1.0)                             # the line comes just before it is stored
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert time.monotonic() - sent < 10, "the interrupt was not acted on promptly"
    assert rc == INTERRUPTED_EXIT, rest
    assert "interrupted: the best plan found so far (feasible" in rest and str(out) in rest
    plan = Plan.from_json(json.loads(out.read_text()))
    assert plan.solver.status == "feasible" and plan.solver.interrupted is True
    # the bound is the least time bound of all tuples: below the plan, so a positive gap
    assert plan.solver.bound is not None and 0 < plan.solver.bound <= plan.solver.objective
    assert 0 < plan.solver.gap < 1
    assert plan.predicted.tokens_per_s > 0 and plan.launch is not None
    assert json.loads(report.read_text())["interrupted"] is True
    assert not list(tmp_path.glob(".*tmp*")), "a temporary file was left behind"
