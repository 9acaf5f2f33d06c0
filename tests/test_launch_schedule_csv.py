"""Per-rank action CSVs for torch's ``_PipelineScheduleRuntime``: the CSV torch's own loader
reads back is the action lists, stage by stage; the registry picks a class where torch has one
and the CSV otherwise; stored lists are validated with the entry named."""

from __future__ import annotations

import csv
import io
import json
from types import SimpleNamespace

import pytest
from test_launch_formats import make_plan

from planner.errors import InputError
from planner.launch import render
from planner.launch.schedule_csv import CSV_FILE, ROUTES, actions_csv, route
from planner.simulate.actions import generate

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")


def torch_reads(text: str, p: int, num_stages: int, m: int) -> dict[int, list]:
    """What PipelineScheduleMulti._load_csv does with the file: csv rows -> _Action.from_str per
    cell, then _validate_schedule (which raises on a malformed schedule)."""
    actions = {r: [schedules._Action.from_str(s) for s in row]
               for r, row in enumerate(csv.reader(io.StringIO(text)))}
    stage_to_rank = schedules._validate_schedule(actions, p, num_stages, m)
    return actions, stage_to_rank


@pytest.mark.parametrize("name,p,m,v", [("zb-h1", 4, 8, 1), ("1f1b", 4, 8, 1), ("gpipe", 3, 5, 1),
                                        ("interleaved-1f1b", 2, 4, 2), ("zb-h1", 3, 2, 1)])
def test_torchs_parser_reads_back_the_lists(name, p, m, v):
    sched = generate(name, p, m, v)
    actions, stage_to_rank = torch_reads(actions_csv(sched), p, p * v, m)
    assert sorted(actions) == list(range(p))
    for r, acts in enumerate(sched.ranks):
        got = [(a.stage_index, a.computation_type.value, a.microbatch_index) for a in actions[r]]
        assert got == [(sched.stage(r, a.chunk), a.kind, a.micro_batch) for a in acts]
    assert stage_to_rank == {s: sched.owner(s)[0] for s in range(p * v)}


def test_torch_rejects_a_broken_csv_so_the_check_above_can_fail():
    rows = actions_csv(generate("zb-h1", 2, 2)).splitlines()
    rows[1] = rows[1].replace("1W1", "")      # one W missing on the last stage
    with pytest.raises(AssertionError, match="I and W must have equal counts"):
        torch_reads("\n".join(rows) + "\n", 2, 2, 2)


def test_registry_picks_the_class_unless_forced():
    plan = make_plan(schedule="zb-h1")
    assert route(plan).class_name == "ScheduleInterleavedZeroBubble" and not route(plan).uses_csv
    forced = route(plan, force_csv=True)
    assert forced.class_name is None and forced.actions == generate("zb-h1", 2, 16)
    assert ROUTES["latency-aware"] is None   # torch has no class: its lists always go by CSV


def test_pipelining_writes_the_csv_and_names_the_runtime():
    plan = make_plan(schedule="1f1b")
    files = render(plan, "pipelining", master_addr="h", schedule_csv=True)
    data = json.loads(files["pipelining.json"])
    assert data["schedule_class"] == "_PipelineScheduleRuntime" and data["schedule_csv"] == CSV_FILE
    assert files[CSV_FILE] == actions_csv(generate("1f1b", 2, 16))
    assert "_load_csv" in files["pipelining_setup.py"]
    plain = render(plan, "pipelining", master_addr="h")
    assert CSV_FILE not in plain and "schedule_csv" not in json.loads(plain["pipelining.json"])


def test_csv_path_lifts_the_zero_bubble_class_rounds_rule():
    plan = make_plan(schedule="zb-h1", num_micro_batches=5)   # 5 // 2 = 2 rounds, 5 % 2 != 0
    with pytest.raises(InputError, match="multiple of its rounds.*--schedule-csv"):
        render(plan, "pipelining", master_addr="h")
    files = render(plan, "pipelining", master_addr="h", schedule_csv=True)
    torch_reads(files[CSV_FILE], 2, 2, 5)


def test_schedule_csv_refused_for_formats_without_torch_schedules():
    with pytest.raises(InputError, match="--schedule-csv applies to pipelining and torchtitan"):
        render(make_plan(), "megatron", master_addr="h", schedule_csv=True)


def stored(schedule, lists, p=2, m=2, v=1):
    """A stand-in for a plan carrying the optional ``pipeline_actions`` field."""
    return SimpleNamespace(schedule=schedule, num_stages=p, num_micro_batches=m, virtual_stages=v,
                           pipeline_actions=lists)


def test_stored_lists_go_by_csv_as_written():
    lists = [["F0.0", "F0.1", "I0.0", "I0.1", "W0.0", "W0.1"],
             ["F0.0", "I0.0", "F0.1", "W0.0", "I0.1", "W0.1"]]
    how = route(stored("latency-aware", lists))
    assert how.uses_csv
    assert actions_csv(how.actions) == "0F0,0F1,0I0,0I1,0W0,0W1\n1F0,1I0,1F1,1W0,1I1,1W1\n"
    # stored lists win over the class of a schedule torch knows: they are what was planned
    assert route(stored("1f1b", [["F0.0", "F0.1", "B0.0", "B0.1"], ["F0.0", "B0.0", "F0.1", "B0.1"]])).uses_csv


@pytest.mark.parametrize("lists,match", [
    ([["F0.0", "Fx"], ["F0.0"]], r"pipeline_actions\[0\]\[1\] is 'Fx'"),
    ([["F0.0", "Q0.1"], ["F0.0"]], r"pipeline_actions\[0\]\[1\]: action kind"),
    ([["F0.0", "F0.1", "B0.1", "B0.0"], ["B0.0", "F0.0", "F0.1", "B0.1"]], "do not run: .*deadlock"),
])
def test_stored_lists_that_cannot_run_are_refused(lists, match):
    with pytest.raises(InputError, match=match):
        route(stored("latency-aware", lists))


def test_unknown_schedule_without_lists_is_refused():
    with pytest.raises(InputError, match="has neither a torch schedule class nor action lists"):
        route(stored("mystery", None))


@pytest.mark.parametrize("fmt", ["pipelining", "torchtitan"])
@pytest.mark.parametrize("schedule, cls", [("zb-v", "ScheduleZBVZeroBubble"), ("dualpipev", "ScheduleDualPipeV")])
def test_a_v_schedule_forced_to_csv_names_the_class_that_runs_it(fmt, schedule, cls):
    plan = make_plan(schedule=schedule, virtual_stages=2, blocks=((0, 4), (4, 8)))
    with pytest.raises(InputError, match=f"'v' stage map.*drop --schedule-csv to run it with torch's {cls}"):
        render(plan, fmt, master_addr="h", schedule_csv=True)
    assert render(plan, fmt, master_addr="h")       # as the message says: the class takes it
