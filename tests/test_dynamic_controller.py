"""The dynamic-batching share controller (planner.launch.dynamic) on synthetic speeds."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from planner.launch.dynamic import ControllerSettings, ShareController, largest_remainder, proportional_shares

MAX_STEPS = 15  # the bound the controller must converge within on these cases


def simulate(speeds, shares, steps=MAX_STEPS, overhead_s=0.0, noise=0.0, seed=0, settings=None):
    """Run the controller against replicas whose compute time is overhead + share / speed."""
    rng = random.Random(seed)
    ctl = ShareController(list(shares), settings or ControllerSettings())
    history = [list(shares)]
    for _ in range(steps):
        times = [(overhead_s + s / v) * (1 + rng.uniform(-noise, noise)) for s, v in zip(ctl.shares, speeds)]
        history.append(ctl.update(times))
    return ctl, history


@pytest.mark.parametrize("speeds, mbs", [((1.0, 3.0), 12), ((2.0, 1.0), 8), ((1.0, 1.0, 2.0), 12),
                                         ((5.0, 1.0, 1.0), 14), ((1.0, 1.7), 16)])
def test_converges_within_one_sequence_of_speed_ratio(speeds, mbs):
    n = len(speeds)
    equal = largest_remainder([mbs / n] * n, mbs, 1)
    _ctl, history = simulate(speeds, equal)
    ideal = [mbs * v / sum(speeds) for v in speeds]
    assert all(abs(s - t) <= 1.0 for s, t in zip(history[-1], ideal)), (history, ideal)
    # and it stays there: the last five steps are all within one sequence
    for shares in history[-5:]:
        assert all(abs(s - t) <= 1.0 for s, t in zip(shares, ideal)), history


def test_noisy_times_still_converge_and_settle():
    speeds, mbs = (1.0, 2.5), 14
    _, history = simulate(speeds, [7, 7], steps=25, noise=0.03, seed=3)
    ideal = [mbs * v / sum(speeds) for v in speeds]
    for shares in history[-8:]:
        assert all(abs(s - t) <= 1.0 for s, t in zip(shares, ideal)), history


def test_bounds_respected_every_step():
    st = ControllerSettings(kp=1.0, ki=0.5, max_step_fraction=0.25, min_share=2)
    _, history = simulate((1.0, 50.0, 1.0), (6, 6, 6), steps=30, settings=st)
    for prev, cur in itertools.pairwise(history):
        assert sum(cur) == 18
        assert min(cur) >= 2
        for p, c in zip(prev, cur):
            assert abs(c - p) <= math.ceil(max(1.0, 0.25 * p)), (prev, cur)
    # the fast replica took what it could: the slow ones sit at the floor
    assert history[-1] == [2, 14, 2]


def test_dead_band_holds_shares_and_equal_speeds_do_not_move():
    ctl = ShareController([4, 4], ControllerSettings(dead_band=0.1))
    assert ctl.update([1.0, 1.05]) == [4, 4]
    assert ctl.integral == [0.0, 0.0]
    # outside the band the continuous share moves at once; the integer one only when it is a
    # whole sequence away (sticky rounding): here the target 4.8 / 3.2 is within one of 4 / 4
    assert ctl.update([1.0, 1.5]) == [4, 4] and ctl.x[0] > 4.5
    assert ctl.update([1.0, 3.0])[0] > 4  # target 6 / 2


def test_sticky_rounding_ignores_noise_around_a_settled_split():
    speeds = (1.0, 2.0)  # of 12 sequences: ideal 4 / 8
    _, history = simulate(speeds, [6, 6], steps=40, noise=0.04, seed=1)
    settled = history[15:]
    assert all(abs(a - 4) <= 1 for a, _ in settled)
    flips = sum(a != b for a, b in itertools.pairwise(settled))
    assert flips <= 2, settled


def test_fixed_overhead_still_equalises_times():
    # time = 0.5 s + share / speed: the proportional target is biased, the loop corrects it
    speeds, mbs = (1.0, 3.0), 16
    _ctl, history = simulate(speeds, [8, 8], steps=25, overhead_s=0.5)
    times = [0.5 + s / v for s, v in zip(history[-1], speeds)]
    best = min(max(0.5 + a / speeds[0], 0.5 + (mbs - a) / speeds[1]) for a in range(1, mbs))
    assert max(times) <= best + 1 / min(speeds) + 1e-9


def test_bad_settings_and_times_are_refused():
    with pytest.raises(ValueError, match="min_share"):
        ShareController([1, 1], ControllerSettings(min_share=2))
    with pytest.raises(ValueError, match="kp"):
        ShareController([2, 2], ControllerSettings(kp=0))
    ctl = ShareController([2, 2])
    with pytest.raises(ValueError, match="positive"):
        ctl.update([1.0, 0.0])
    with pytest.raises(ValueError, match="2 replicas"):
        ctl.update([1.0])


def test_rounding_helpers():
    assert largest_remainder([2.6, 2.2, 3.2], 8, 1) == [3, 2, 3]
    assert sum(largest_remainder([0.2, 0.2, 7.6], 8, 1)) == 8
    assert min(largest_remainder([0.2, 0.2, 7.6], 8, 1)) == 1
    assert proportional_shares([1.0, 3.0], 12) == [3, 9]
