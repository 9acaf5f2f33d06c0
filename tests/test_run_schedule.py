"""Fast checks of what the reference runner executes: the plan's action lists (one path for
every schedule), the model cut along a schedule's stage map, and the refusals of lists that
do not fit the plan."""

from __future__ import annotations

import subprocess

import pytest
from test_run_checks import TINY, make_plan, rep, two_stage

from planner.errors import InputError
from planner.launch import run_schedule, runner
from planner.simulate.actions import Action, Schedule, generate
from planner.simulate.schedules import stage_orders


@pytest.fixture
def no_spawn(monkeypatch):
    """Fail the test if the runner tries to start a process."""
    def boom(*a, **k):
        raise AssertionError("a process was started")
    monkeypatch.setattr(subprocess, "Popen", boom)


@pytest.mark.parametrize("schedule, p, m, v", [("gpipe", 3, 4, 1), ("1f1b", 4, 6, 1),
                                               ("interleaved-1f1b", 2, 4, 2)])
def test_classic_schedules_are_the_simulators_orders_as_actions(schedule, p, m, v):
    stages = [((i * 2 * v, (i + 1) * 2 * v), [rep(1, 2, [f"n:{i}"])]) for i in range(p)]
    plan = make_plan(stages, mbs=2, nmb=m, schedule=schedule, model={**TINY, "num_layers": 2 * v * p},
                     virtual_stages=v)
    sched = run_schedule.plan_schedule(plan)
    kinds = {"fwd": "F", "bwd": "B"}
    assert [[(a.kind, a.chunk, a.micro_batch) for a in acts] for acts in sched.ranks] == [
        [(kinds[k], c, mb) for k, c, mb in ops] for ops in stage_orders(schedule, p, m, v)]


def test_zb_h1_plan_is_accepted_with_its_generated_lists(no_spawn):
    plan = two_stage(schedule="zb-h1", nmb=3)
    shape = runner.model_shape(plan)
    sched = runner.check_plan(plan, shape)
    assert sched == generate("zb-h1", 2, 3)
    assert {a.kind for acts in sched.ranks for a in acts} == {"F", "I", "W"}


def test_v_map_chunks_put_both_ends_on_stage_0():
    plan = make_plan([((0, 4), [rep(1, 4, ["a:0"])]), ((4, 6), [rep(1, 4, ["b:0"])])],
                     model={**TINY, "num_layers": 6})
    lists = tuple((Action("F", 0, 0),) for _ in range(2))
    sched = Schedule("v", 2, 2, 1, "v", lists)
    chunks = runner.model_chunks(plan, sched)
    # Global stages 0..3 on ranks 0, 1, 1, 0; stage 0 cuts its 4 blocks in 2, stage 1 its 2.
    assert [(c["stage"], c["chunk"], c["blocks"], c["embedding"], c["head"]) for c in chunks] == [
        (0, 0, [0, 2], True, False), (1, 0, [2, 3], False, False),
        (1, 1, [3, 4], False, False), (0, 1, [4, 6], False, True)]


def test_schedule_round_trips_through_the_worker_config():
    sched = generate("interleaved-1f1b", 2, 4, 2)
    assert run_schedule.schedule_from_json(run_schedule.schedule_to_json(sched)) == sched


def test_a_schedule_that_does_not_fit_the_plan_is_refused(no_spawn):
    plan = two_stage(nmb=2)
    with pytest.raises(InputError, match="schedule: zb-h1: 3 action lists for the plan's 2 stages"):
        runner.run_plan(plan, schedule=generate("zb-h1", 3, 2))
    with pytest.raises(InputError, match="schedule: zb-h1: 4 micro-batches, the plan has 2"):
        runner.run_plan(plan, schedule=generate("zb-h1", 2, 4))
    # 3 chunks per rank cannot cut stages of 2 blocks.
    three = Schedule("odd", 2, 3, 2, "loop", tuple(
        tuple(Action(k, c, mb) for k, cs in (("F", range(3)), ("B", range(2, -1, -1)))
              for c in cs for mb in range(2)) for _ in range(2)))
    with pytest.raises(InputError, match=r"stages\[0\].blocks: 2 blocks do not split into the schedule's 3"):
        runner.run_plan(plan, schedule=three)


def test_a_deadlocking_schedule_is_refused_before_any_process(no_spawn):
    plan = two_stage(nmb=1)
    # Rank 0 lists the backward of micro-batch 0 before its forward.
    bad = Schedule("bad", 2, 1, 1, "loop", ((Action("B", 0, 0), Action("F", 0, 0)),
                                            (Action("F", 0, 0), Action("B", 0, 0))))
    with pytest.raises(InputError, match="schedule: bad: the action lists deadlock"):
        runner.run_plan(plan, schedule=bad)


def test_peak_in_flight_follows_the_lists():
    # 1F1B on 4 ranks: rank r holds p - r micro-batches; gpipe all m; zb-h1 holds a
    # micro-batch until its W, so rank r up to min(m, p) (docs/internals.md).
    assert run_schedule.peak_in_flight(generate("1f1b", 4, 8)) == [4, 3, 2, 1]
    assert run_schedule.peak_in_flight(generate("gpipe", 3, 5)) == [5, 5, 5]
    assert run_schedule.peak_in_flight(generate("zb-h1", 4, 8)) == [4, 4, 4, 4]
    # Interleaved: chunks count as halves of a stage's activations.
    assert run_schedule.peak_in_flight(generate("interleaved-1f1b", 2, 4, 2))[1] == 1.5
