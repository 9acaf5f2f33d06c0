"""The closed forms of planner.cost.schedule against the event simulator (planner.simulate)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from planner.cost.schedule import StageTiming, bottleneck_stage, pipeline_breakdown, pipeline_time_s

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


def test_1f1b_bounds_the_simulator_where_each_backward_is_the_longer_pass():
    # the generator's stages: f in [0.5, 2], b in [1, 4] (training's backward runs ~2x its
    # forward); 5,000 such cases and 5,000 with b = 2 f and sends never fell below
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


def test_1f1b_is_not_a_bound_where_a_forward_dwarfs_its_backward():
    # a review's counterexample to the docstring's "an upper bound": a stage whose forward
    # runs 4x its backward, next to one the other way round (docs/internals.md, item 4)
    ex = [StageTiming(forward_s=1, backward_s=4), StageTiming(forward_s=4, backward_s=1),
          StageTiming(forward_s=1, backward_s=1)]
    assert pipeline_time_s(ex, 2, "1f1b") == 17 and makespan(ex, 2, "1f1b") == pytest.approx(18)


# --------------------------------------------------------------------------- ZB-H1


def _zb_run(stages, m):
    from planner.simulate.plan import simulate_action_schedule

    return simulate_action_schedule(stages, m, "zb-h1").makespan_s


def _zb_stage(f, i, w, sf=0.0, sb=0.0):
    return StageTiming(forward_s=f, backward_s=i + w, backward_weight_s=w, send_forward_s=sf,
                       send_backward_s=sb, compute_s=f + i + w)


@pytest.mark.parametrize("f,i,w", [(1, 1, 1), (1, 1, 0.5), (1, 2, 0.5), (2, 1, 1), (1, 1, 2),
                                   (0.5, 1, 1), (1, 0.5, 1.5), (3, 1, 1), (1, 1, 0), (0.25, 3, 0.25)])
def test_zb_h1_closed_form_exact_for_equal_stages(f, i, w):
    # every p, m: T = m (F + I + W) + (p - 1)(F + I) - (min(m, p) - 1) min(F, I, W)
    for p in range(1, 7):
        for m in range(1, 13):
            stages = [_zb_stage(f, i, w)] * p
            expect = m * (f + i + w) + (p - 1) * (f + i) - (min(m, p) - 1) * min(f, i, w)
            assert pipeline_time_s(stages, m, "zb-h1") == pytest.approx(expect, abs=1e-9)
            assert _zb_run(stages, m) == pytest.approx(expect, abs=1e-9), (p, m)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 8), (5, 12)])
def test_zb_h1_is_the_papers_bubble_when_w_is_smallest(p, m):
    # Qi et al. 2024 §3.1: m (F + I + W) + (p - 1)(F + I - W) for m >= p, W <= F, I
    f, i, w = 1.0, 1.3, 0.7
    stages = [_zb_stage(f, i, w)] * p
    assert pipeline_time_s(stages, m, "zb-h1") == pytest.approx(m * (f + i + w) + (p - 1) * (f + i - w))
    assert pipeline_time_s([_zb_stage(1, 1, 1)] * 4, 8, "zb-h1") == 27  # 1F1B: 33
    assert pipeline_time_s([StageTiming(1, 2)] * 4, 8, "1f1b") == 33


def test_zb_h1_without_weight_part_is_1f1b_and_p1_is_exact():
    rng = random.Random(3)
    for _ in range(50):
        p, m = rng.randint(1, 6), rng.randint(1, 16)
        stages = _random_stages(rng, p)  # backward_weight_s = 0
        assert pipeline_time_s(stages, m, "zb-h1") == pytest.approx(pipeline_time_s(stages, m, "1f1b"))
        one = [_zb_stage(rng.uniform(.1, 2), rng.uniform(.1, 2), rng.uniform(0, 2))]
        assert pipeline_time_s(one, m, "zb-h1") == pytest.approx(_zb_run(one, m))


_stage = hs.tuples(hs.floats(0.05, 2), hs.floats(0.05, 2), hs.floats(0.0, 2),
                   hs.floats(0.0, 0.5), hs.floats(0.0, 0.5))


@settings(max_examples=300, deadline=None)
@given(hs.lists(_stage, min_size=2, max_size=6), hs.integers(1, 16))
def test_zb_h1_unequal_stages_is_an_estimate_within_the_documented_range(raw, m):
    # Neither exact nor a bound on unequal stages (module docstring): on arbitrary stages,
    # extremes included, 43% below to 93% above the action-list executor were seen.
    p = len(raw)
    stages = [_zb_stage(f, i, w, sf if k < p - 1 else 0.0, sb if k > 0 else 0.0)
              for k, (f, i, w, sf, sb) in enumerate(raw)]
    closed, run = pipeline_time_s(stages, m, "zb-h1"), _zb_run(stages, m)
    assert 0.5 * run <= closed <= 2.0 * run
    # never above 1F1B's closed form, and the breakdown sums to the pipeline time
    assert closed <= pipeline_time_s(stages, m, "1f1b") + 1e-9
    parts = pipeline_breakdown(stages, m, "zb-h1")
    assert parts["bubble"] >= 0
    assert sum(v for k, v in parts.items() if k not in ("dp_sync_exposed", "optimizer")) == pytest.approx(closed)
    assert bottleneck_stage(stages, "zb-h1") == bottleneck_stage(stages, "1f1b")


def test_zb_h1_never_slower_for_a_faster_forward_or_input_part():
    # a review's find: with mu, the least work item, read as is, one stage's F falling from 1
    # to 0.2 raised the time from 26.0 to 26.8 (the executor: 26.0 -> 25.2); and with the
    # stage of the largest cycle alone paying its W, a stage of less W overtaking it dropped
    # the time by up to 13% as it grew.  Padded F's and I's and the largest (m - 1) c_k + w_k
    # over k make it monotone in every F, I and send
    def one(f0):
        return pipeline_time_s([_zb_stage(f0, 1, 1), _zb_stage(1, 1, 1), _zb_stage(1, 1, 1)], 8, "zb-h1")

    assert [one(f0) for f0 in (0.2, 0.6, 1.0)] == [26.0, 26.0, 26.0]
    rng = random.Random(5)
    for _ in range(3000):
        p, m = rng.randint(2, 8), rng.randint(1, 16)
        raw = [[rng.uniform(.1, 2), rng.uniform(.1, 2), rng.uniform(.1, 2), rng.uniform(0, .3), rng.uniform(0, .3)]
               for _ in range(p)]
        before = pipeline_time_s([_zb_stage(*x) for x in raw], m, "zb-h1")
        raw[rng.randrange(p)][rng.choice((0, 1, 3, 4))] += rng.uniform(0, .5)
        assert pipeline_time_s([_zb_stage(*x) for x in raw], m, "zb-h1") >= before - 1e-9 * before


def test_zb_h1_near_balanced_stages_figures():
    # Near-balanced stages (+-20%, W 35-55% of the backward, small sends), as the search's plans
    # are: the closed form stayed within 2% below and 15% above the executor (docs/internals.md).
    rng = random.Random(7)
    lo = hi = 0.0
    for _ in range(600):
        p, m = rng.randint(2, 8), rng.randint(1, 32)
        stages = []
        for k in range(p):
            f = rng.uniform(.8, 1.2)
            b = 2 * f * rng.uniform(.9, 1.1)
            w = b * rng.uniform(.35, .55)
            stages.append(_zb_stage(f, b - w, w, rng.uniform(0, .1) if k < p - 1 else 0.0,
                                    rng.uniform(0, .1) if k > 0 else 0.0))
        rel = pipeline_time_s(stages, m, "zb-h1") / _zb_run(stages, m) - 1
        lo, hi = min(lo, rel), max(hi, rel)
    assert -0.04 <= lo and hi <= 0.15, (lo, hi)
