"""BitPipe on the action-list engine (planner.simulate.bitpipe, planner.simulate.layouts): the
bidirectional stage map, validity of the generated lists, makespan at unit times against the
critical path and against 1F1B / interleaved 1F1B at equal work, peak in-flight activations.
The authors' figures against the generated order: tests/test_bitpipe_figure.py."""

from __future__ import annotations

import random

import pytest

from planner.cost.bitpipe import in_flight_micro_batches
from planner.simulate.actions import Action, Schedule, ScheduleError, StageTimes, execute, generate, validate
from planner.simulate.bitpipe import bitpipe, paper_order_applies, pipelines, rank_stage_times

CHUNK = StageTimes(forward_s=1, backward_s=2)  # one chunk: half of a rank's share in one pipeline
GRID = [(2, 2), (2, 8), (4, 2), (4, 4), (4, 6), (4, 8), (4, 16), (6, 12), (8, 8), (8, 12), (8, 16), (8, 32)]


def test_bitpipe_map_mirrors_the_down_v():
    s = bitpipe(4, 4)
    # down: rank r holds stages r and 2p-1-r; up: what rank p-1-r holds in the down pipeline
    assert [[s.stage(r, c) for c in range(4)] for r in range(4)] == \
        [[0, 7, 3, 4], [1, 6, 2, 5], [2, 5, 1, 6], [3, 4, 0, 7]]
    assert [s.pipe(0, c) for c in range(4)] == [0, 0, 1, 1]
    assert s.pipelines == ((0, 1), (2, 3)) and s.num_slots == 16
    for mb in range(4):
        for stage in range(8):
            r, c = s.owner(stage, mb)
            assert s.stage(r, c) == stage and s.pipe(r, c) == s.pipe_of(mb)
    # the pair r, p-1-r hold the same four stages
    held = [sorted(s.stage(r, c) for c in range(4)) for r in range(4)]
    assert held[0] == held[3] and held[1] == held[2] and held[0] != held[1]


@pytest.mark.parametrize("p,m", GRID)
def test_valid_complete_and_critical_path(p, m):
    s = generate("bitpipe", p, m)
    validate(s)
    assert s.chunks == 4 and s.num_stages == 2 * p
    assert sum(len(a) for a in s.ranks) == 2 * m * 2 * p  # F and B of 2p stages per micro-batch
    run = execute(s, CHUNK)
    assert run.busy_s == [6.0 * m] * p               # each rank: 2 chunks of every micro-batch
    # no schedule beats one micro-batch's own path (2p forwards, 2p backwards) or the work
    assert run.makespan_s >= max(2 * p * 3, 6 * m)
    if m == 2:
        assert run.makespan_s == 2 * p * 3            # one micro-batch per pipeline: pure path


@pytest.mark.parametrize("p,m", [(2, 2), (2, 8), (4, 4), (4, 8), (6, 12), (8, 8), (8, 16), (16, 16)])
def test_faster_than_1f1b_and_interleaved_up_to_two_units(p, m):
    """At equal work (a rank: F = 2, B = 4 per micro-batch), measured where the authors' order
    has one or two units (m <= 2p); it loses to interleaved 1F1B from m = 3p on (next test)."""
    assert paper_order_applies(p, m)
    run = execute(bitpipe(p, m), CHUNK)
    one_f_one_b = execute(generate("1f1b", p, m), StageTimes(forward_s=2, backward_s=4)).makespan_s
    assert one_f_one_b == (m + p - 1) * 6
    assert run.makespan_s < one_f_one_b
    inter = execute(generate("interleaved-1f1b", p, m, 2), CHUNK).makespan_s
    assert inter == (m + (p - 1) / 2) * 6
    assert run.makespan_s < inter


@pytest.mark.parametrize("p,m,expected", [(4, 4, 28), (4, 8, 54), (4, 16, 106), (8, 8, 60), (8, 16, 114),
                                          (8, 32, 222), (8, 64, 438), (16, 16, 124), (16, 64, 454)])
def test_recorded_unit_makespans(p, m, expected):
    """The figures docs/schedules.md and the module docstring quote; p=8, m=32 and m=64 and
    p=16, m=64 lose to interleaved 1F1B (213, 405, 429): each unit boundary adds p - 2."""
    assert execute(bitpipe(p, m), CHUNK).makespan_s == expected


@pytest.mark.parametrize("p", [2, 4, 6, 8, 10, 12, 16])
@pytest.mark.parametrize("units", [1, 2, 3, 5])
def test_unit_makespan_law(p, units):
    """The measured law the docstring states: 6m + (p - 2)(m/p + 1) at unit chunk times."""
    m = p * units
    assert execute(bitpipe(p, m), CHUNK).makespan_s == 6 * m + (p - 2) * (units + 1)


@pytest.mark.parametrize("p,m", GRID + [(16, 32), (16, 64)])
def test_peak_in_flight_rule(p, m):
    """Chunk activations held per rank (F done, B not yet) against the memory rule the cost
    model charges (planner.cost.bitpipe.in_flight_micro_batches, in half-chunk shares): the
    closed form 3p/2 + 1 + min(r, p-1-r) in the authors' order, the executor's count in the
    fallback, whose peaks stay within the larger cap 3p plus the continuation allowance."""
    run = execute(bitpipe(p, m), CHUNK)
    peak = run.peak_in_flight
    assert [n / 2 for n in peak] == in_flight_micro_batches(p, m)
    if paper_order_applies(p, m):
        assert peak == [3 * p // 2 + 1 + min(r, p - 1 - r) for r in range(p)]
    else:
        assert max(peak) <= min(3 * p + p // 2 + 1, 2 * m)
    tight = execute(bitpipe(p, m, cap=2 * p), CHUNK).peak_in_flight
    assert max(tight) <= min(2 * p + p // 2 + 1, 2 * m)
    if m == 2:
        assert peak == [4] * p   # each rank holds its two chunks of both micro-batches


@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 12), (8, 16), (8, 40)])
def test_list_schedule_fallback_is_valid_where_the_paper_order_applies_too(p, m):
    """``cap`` asks for the fallback at any even m: both orders run every action once."""
    for s in (bitpipe(p, m), bitpipe(p, m, cap=3 * p)):
        validate(s)
        assert sorted(a for acts in s.ranks for a in acts) == \
            sorted(a for acts in bitpipe(p, m, cap=2 * p).ranks for a in acts)


@pytest.mark.parametrize("p,m", [(4, 2), (4, 6), (6, 4), (8, 12), (8, 20)])
def test_other_m_get_the_list_schedule(p, m):
    assert not paper_order_applies(p, m)
    s = bitpipe(p, m)
    validate(s)
    assert s.name == "bitpipe (list order)" and bitpipe(p, p).name == "bitpipe"
    assert s.ranks in (bitpipe(p, m, cap=2 * p).ranks, bitpipe(p, m, cap=3 * p).ranks)


def test_valid_under_random_durations_and_sends():
    rng = random.Random(5)
    s = bitpipe(6, 12)
    for _ in range(20):
        times = [StageTimes(forward_s=rng.uniform(0.1, 2), backward_s=rng.uniform(0.1, 3),
                            send_forward_s=rng.uniform(0, 0.5), send_backward_s=rng.uniform(0, 0.5))
                 for _ in range(s.num_slots)]
        run = execute(s, times, blocking_sends=rng.random() < 0.5)
        assert run.makespan_s > 0 and len(run.actions) == 2 * 12 * 12


def test_turn_of_the_v_sends_nothing():
    stages = [type("T", (), {"forward_s": 2.0, "backward_s": 4.0, "send_forward_s": 0.5,
                             "send_backward_s": 0.5})() for _ in range(4)]
    times = rank_stage_times(stages)
    run = execute(bitpipe(4, 2), times)
    # one micro-batch per pipeline: 2p forwards + 2p backwards of a chunk and one send per
    # crossing between ranks: 2 (p - 1) forward crossings and as many backward ones
    assert run.makespan_s == pytest.approx(8 * 3 + 2 * 3 * 0.5 * 2)
    assert len(run.sends) == 2 * 2 * 3 * 2


def test_validator_rejects_a_micro_batch_on_the_other_pipeline():
    good = bitpipe(2, 2)
    ranks = [list(acts) for acts in good.ranks]
    i = ranks[0].index(Action("F", 0, 0))
    ranks[0][i] = Action("F", 2, 0)   # micro-batch 0 is down; chunk 2 is the up pipeline's
    bad = Schedule("bitpipe", 2, 4, 2, "bitpipe", tuple(map(tuple, ranks)), good.pipelines)
    with pytest.raises(ScheduleError, match="pipeline down.*pipeline up"):
        validate(bad)


@pytest.mark.parametrize("p,m,v,match", [(3, 4, 4, "even number of ranks"), (4, 3, 4, "even m"),
                                         (4, 4, 2, "4 chunks")])
def test_bad_knobs(p, m, v, match):
    with pytest.raises(ScheduleError, match=match):
        generate("bitpipe", p, m, v)


def test_pipelines_must_partition_the_micro_batches():
    with pytest.raises(ScheduleError, match="pipelines"):
        Schedule("x", 2, 4, 4, "bitpipe", ((), ()), ((0, 1), (1, 2)))
    with pytest.raises(ScheduleError, match="4 chunks"):
        Schedule("x", 2, 2, 4, "bitpipe", ((), ()), pipelines(4))
