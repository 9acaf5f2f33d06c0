"""The reference runner on action-list schedules against the single-process run: zb-h1 (I and W
apart) on 2 and 3 stages, and a V-map schedule with 2 chunks per rank written here as
``actions.Action`` lists (the head and the embedding on rank 0, the middle stages handed over
in memory on rank 1, B on some micro-batches and I / W on others); the generated zb-v and
dualpipev lists, and a latency-aware plan's stored lists.  After 3 steps in float64
the loss and every parameter agree to 1e-5, as in tests/test_run_slow.py."""

from __future__ import annotations

import pytest
from test_run_slow import GELU, STEPS, SWIGLU_GQA, _reference, assert_matches_reference, make_plan, rep

from planner.simulate.actions import Action, Schedule, validate

pytestmark = pytest.mark.slow


# 4 processes: stage 0 in two replicas (shares 2, 1) feeding one tp-2 replica; tied embeddings
# across the two stages.
PLAN_ZB2 = make_plan(GELU, [
    ((0, 2), [rep(1, 2, ["z:0"]), rep(1, 1, ["z:1"])]),
    ((2, 4), [rep(2, 3, ["z:2", "z:3"])]),
], mbs=3, nmb=3, schedule="zb-h1")

# 3 processes, 3 stages of uneven blocks, swiglu with grouped-query attention, m > p.
PLAN_ZB3 = make_plan(SWIGLU_GQA, [
    ((0, 1), [rep(1, 2, ["y:0"])]),
    ((1, 3), [rep(1, 2, ["y:1"])]),
    ((3, 4), [rep(1, 2, ["y:2"])]),
], mbs=2, nmb=4, schedule="zb-h1")

# 3 processes for the V: rank 0 one replica, rank 1 two replicas (shares 1, 1); 2 blocks per
# stage cut into 2 chunks of one block.  Tied embeddings: on the v map both ends are on rank 0.
PLAN_V = make_plan(GELU, [
    ((0, 2), [rep(1, 2, ["v:0"])]),
    ((2, 4), [rep(1, 1, ["v:1"]), rep(1, 1, ["v:2"])]),
], mbs=2, nmb=4, schedule="1f1b")


# The generated V schedules and a plan's stored lists, 2 processes each: zb-v and dualpipev
# (m >= 2p) from their generators, and a latency-aware plan whose pipeline_actions are ZB-H1's
# lists written into the plan (the runner reads the plan's lists, not a generator).
PLAN_ZBV = make_plan(GELU, [((0, 2), [rep(1, 2, ["zv:0"])]), ((2, 4), [rep(1, 2, ["zv:1"])])],
                     mbs=2, nmb=4, schedule="zb-v", virtual_stages=2)
PLAN_DPV = make_plan(SWIGLU_GQA, [((0, 2), [rep(1, 2, ["dv:0"])]), ((2, 4), [rep(1, 2, ["dv:1"])])],
                     mbs=2, nmb=4, schedule="dualpipev", virtual_stages=2)


def latency_plan():
    from planner.simulate.actions import generate
    from planner.simulate.latency_plan import actions_to_json

    plan = make_plan(GELU, [((0, 1), [rep(1, 2, ["la:0"])]), ((1, 4), [rep(1, 2, ["la:1"])])],
                     mbs=2, nmb=3, schedule="latency-aware")
    return plan.model_copy(update={"pipeline_actions": actions_to_json(generate("zb-h1", 2, 3))})


def v_schedule(p: int, m: int) -> Schedule:
    """A valid V order: every forward of chunk 0, then of chunk 1, then the backwards of chunk 1
    and chunk 0; even micro-batches take a whole B, odd ones an I, their W's deferred to the end
    (chunk 0's first)."""
    def bwd(c, mb):
        return Action("B" if mb % 2 == 0 else "I", c, mb)
    ranks = []
    for _ in range(p):
        acts = [Action("F", c, mb) for c in (0, 1) for mb in range(m)]
        acts += [bwd(c, mb) for c in (1, 0) for mb in range(m)]
        acts += [Action("W", c, mb) for c in (0, 1) for mb in range(m) if mb % 2]
        ranks.append(tuple(acts))
    sched = Schedule("hand-v", p, 2, m, "v", tuple(ranks))
    validate(sched)
    return sched


def _run(plan, schedule=None):
    from planner.launch import runner

    seen = []
    result = runner.run_plan(plan, steps=STEPS, dtype="float64", return_params=True,
                             on_step=lambda *a: seen.append(a), schedule=schedule)
    assert seen == list(zip(range(STEPS), result.losses, result.step_time_s))
    return result, _reference(plan)


@pytest.fixture(scope="module")
def zb2():
    return _run(PLAN_ZB2)


@pytest.fixture(scope="module")
def zb3():
    return _run(PLAN_ZB3)


@pytest.fixture(scope="module")
def vmap():
    return _run(PLAN_V, v_schedule(2, 4))


@pytest.fixture(scope="module")
def zbv():
    return _run(PLAN_ZBV)


@pytest.fixture(scope="module")
def dualpipev():
    return _run(PLAN_DPV)


@pytest.fixture(scope="module")
def stored():
    return _run(latency_plan())


@pytest.mark.parametrize("name", ["zb2", "zb3", "vmap", "zbv", "dualpipev", "stored"])
def test_action_list_schedules_match_single_process_reference(name, request):
    assert_matches_reference(*request.getfixturevalue(name))
