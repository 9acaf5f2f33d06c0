"""The closed forms of planner.cost.schedule against the event simulator (planner.simulate)."""

from __future__ import annotations

import random

import pytest

from planner.cost.schedule import StageTiming, pipeline_time_s

sim = pytest.importorskip("planner.simulate.engine")


def makespan(stages, m, schedule, v=1):
    return sim.simulate_pipeline(stages, m, schedule, v).makespan_s


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2),
                                        ("interleaved-1f1b", 4)])
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 8)])
def test_exact_for_equal_stages(schedule, v, p, m):
    stages = [StageTiming(forward_s=1.0, backward_s=2.0) for _ in range(p)]
    assert pipeline_time_s(stages, m, schedule, v) == pytest.approx(makespan(stages, m, schedule, v))


def _random_stages(rng, p):
    return [StageTiming(forward_s=rng.uniform(0.5, 2), backward_s=rng.uniform(1, 4),
                        send_forward_s=rng.uniform(0, 0.3) if i < p - 1 else 0.0,
                        send_backward_s=rng.uniform(0, 0.3) if i > 0 else 0.0) for i in range(p)]


def test_gpipe_exact_for_unequal_stages_with_sends():
    rng = random.Random(7)
    for _ in range(100):
        p, m = rng.randint(1, 6), rng.randint(1, 12)
        stages = _random_stages(rng, p)
        assert pipeline_time_s(stages, m, "gpipe") == pytest.approx(makespan(stages, m, "gpipe"))


def test_1f1b_is_an_upper_bound_for_unequal_stages():
    rng = random.Random(11)
    worst = 0.0
    for _ in range(200):
        p, m = rng.randint(1, 6), rng.randint(1, 12)
        stages = _random_stages(rng, p)
        closed, exact = pipeline_time_s(stages, m, "1f1b"), makespan(stages, m, "1f1b")
        assert closed >= exact - 1e-9
        worst = max(worst, closed / exact - 1)
    assert worst < 0.25
    # the documented example: a slow first stage overlaps its warm-up with the fill
    ex = [StageTiming(forward_s=2, backward_s=2), StageTiming(forward_s=1, backward_s=1)]
    assert makespan(ex, 2, "1f1b") == pytest.approx(8) and pipeline_time_s(ex, 2, "1f1b") == 10
