"""run --measurements / --dynamic-batching / --slow-rank refusals happen before any process
starts (exit 2, the reason named); the plan's dynamic_shares block is schema-valid."""

from __future__ import annotations

import pytest
from test_rebalance import make_plan

from planner.cli.main import main
from planner.launch.dynamic_run import settings_for
from planner.plan import Plan
from planner.plan.schema import validate_plan_json


@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(make_plan([3, 3]).dumps())
    return path


def test_measurements_output_checked_first(plan_file, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["run", str(plan_file), "--measurements", str(blocker / "m.json")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_dynamic_batching_needs_a_stage_with_replicas(tmp_path, capsys):
    path = tmp_path / "one.json"
    path.write_text(make_plan([6]).dumps())
    assert main(["run", str(path), "--dynamic-batching"]) == 2
    assert "no stage of this plan has more than one replica" in capsys.readouterr().err


@pytest.mark.parametrize("arg, needle", [("2:3", "rank 2 is not one of 0..1"), ("1:0.5", "at least 1"),
                                         ("x", "RANK:FACTOR")])
def test_slow_rank_checked(plan_file, capsys, arg, needle):
    assert main(["run", str(plan_file), "--slow-rank", arg]) == 2
    assert needle in capsys.readouterr().err


def test_min_share_above_a_share_is_refused(tmp_path, capsys):
    data = make_plan([5, 1]).to_json()
    data["dynamic_shares"] = {"min_share": 2}
    path = tmp_path / "p.json"
    path.write_text(Plan.from_json(data).dumps())
    assert main(["run", str(path), "--dynamic-batching"]) == 2
    assert "stages[0].replicas[1].micro_batch_share: 1 is below dynamic_shares.min_share 2" in capsys.readouterr().err


def test_plan_dynamic_shares_field():
    data = make_plan([3, 3]).to_json()
    data["dynamic_shares"] = {"min_share": 2, "max_step_fraction": 0.25, "dead_band": 0.1}
    validate_plan_json(data)
    plan = Plan.from_json(data)
    st = settings_for(plan)
    assert (st.min_share, st.max_step_fraction, st.dead_band) == (2, 0.25, 0.1)
    assert Plan.from_json(plan.to_json()) == plan
    data["dynamic_shares"]["max_step_fraction"] = 0
    with pytest.raises(Exception, match="max_step_fraction"):
        validate_plan_json(data)
    with pytest.raises(Exception, match="max_step_fraction"):
        Plan.from_json(data)
