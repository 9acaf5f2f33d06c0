"""Latency-aware schedules (CrossPipe, issue 17): the evaluator's link model, the greedy rule,
the exact MILP, and the gap between them."""

from __future__ import annotations

import itertools
import random

import pytest

from planner.simulate.actions import Action, Schedule, ScheduleError, StageTimes, execute, generate, validate
from planner.simulate.latency import (
    LatencyProblem,
    Link,
    lower_bound_s,
    make_problem,
    over_cap,
    peak_in_flight,
    retime,
)
from planner.simulate.latency_gap import greedy_gap
from planner.simulate.latency_greedy import RULES, _one, greedy
from planner.simulate.latency_milp import exact

UNIT = StageTimes(forward_s=1, backward_input_s=1, backward_weight_s=1)


def _latency_only(rng: random.Random, p: int, m: int):
    """Random stage times whose sends are pure latency (no bandwidth term)."""
    lat = [rng.uniform(0, 3) for _ in range(p - 1)]
    sts = [StageTimes(rng.uniform(0.2, 2), rng.uniform(0.2, 2), rng.uniform(0, 2),
                      send_forward_s=lat[i] if i < p - 1 else 0.0,
                      send_backward_s=lat[i - 1] if i > 0 else 0.0) for i in range(p)]
    return sts, lat


def _random_problem(rng: random.Random, p: int, m: int, cap: int | None = None) -> LatencyProblem:
    sts = []
    for _ in range(p):
        sts.append(StageTimes(rng.uniform(0.5, 2), rng.uniform(0.5, 2), rng.uniform(0.2, 1.5),
                              send_forward_s=rng.uniform(0, 4), send_backward_s=rng.uniform(0, 4)))
    lat = [min(sts[b].send_forward_s, sts[b + 1].send_backward_s) * rng.uniform(0.3, 1) for b in range(p - 1)]
    return make_problem(sts, m, lat, cap if cap is not None else rng.randint(1, min(m, p) + 1))


# --------------------------------------------------------------------------- evaluator

def test_retime_is_the_non_blocking_executor_when_sends_are_latency_only():
    rng = random.Random(7)
    for _ in range(30):
        p, m = rng.randint(1, 5), rng.randint(1, 8)
        sts, lat = _latency_only(rng, p, m)
        prob = make_problem(sts, m, lat)
        for name in ("gpipe", "1f1b", "zb-h1"):
            sched = generate(name, p, m)
            got = retime(prob, sched)
            want = execute(sched, sts, blocking_sends=False)
            assert got.makespan_s == pytest.approx(want.makespan_s, abs=1e-12)
            assert [(a.kind, a.start_s) for a in got.actions] == \
                [(a.kind, pytest.approx(a.start_s, abs=1e-12)) for a in want.actions]


def test_sends_on_one_link_serialise_on_its_bandwidth():
    # p = 2, forwards of 1 s, a forward link busy 2 s per send with 0.5 s latency: sends leave
    # at 1, 3, 5 (not 1, 2, 3) and arrive 2.5 s after leaving; the sender never waits.
    st = [StageTimes(1, 0.1, 0.1, send_forward_s=2.5), StageTimes(1, 0.1, 0.1, send_backward_s=0.0)]
    prob = make_problem(st, 3, [0.5], memory_cap=3)
    rank0 = tuple(Action("F", 0, j) for j in range(3)) + \
        tuple(x for j in range(3) for x in (Action("I", 0, j), Action("W", 0, j)))
    rank1 = tuple(x for j in range(3) for x in (Action("F", 0, j), Action("I", 0, j), Action("W", 0, j)))
    run = retime(prob, Schedule("by-hand", 2, 1, 3, "loop", (rank0, rank1)))
    fwd = [e for e in run.sends if e.kind == "send-F"]
    assert [(e.start_s, e.end_s) for e in fwd] == [(1, 3.5), (2, 5.5), (3, 7.5)]   # posted at, arrives
    rank0_f = [a.end_s for a in run.rank_actions(0) if a.kind == "F"]
    assert rank0_f == [1, 2, 3]                                                   # non-blocking
    rank1_f = [a.start_s for a in run.rank_actions(1) if a.kind == "F"]
    assert rank1_f == [3.5, 5.5, 7.5]


def test_make_problem_splits_sends_into_latency_and_transfer():
    st = [StageTimes(1, 1, 1, send_forward_s=0.08), StageTimes(1, 1, 1, send_backward_s=0.07)]
    prob = make_problem(st, 4, [0.05])
    assert (prob.forward[0].latency_s, prob.forward[0].transfer_s) == (0.05, pytest.approx(0.03))
    assert (prob.backward[0].latency_s, prob.backward[0].transfer_s) == (0.05, pytest.approx(0.02))
    assert isinstance(prob.forward[0], Link)
    assert prob.memory_cap == (2, 2)
    with pytest.raises(ValueError, match="boundary latencies"):
        make_problem(st, 4, [0.05, 0.1])


def test_peak_in_flight_counts_until_w():
    assert peak_in_flight(generate("1f1b", 4, 8)) == [4, 3, 2, 1]
    assert peak_in_flight(generate("zb-h1", 4, 8)) == [4, 4, 4, 4]


# --------------------------------------------------------------------------- greedy

def test_greedy_lists_are_valid_keep_the_cap_and_time_as_the_evaluator():
    rng = random.Random(3)
    for _ in range(40):
        p, m = rng.randint(1, 6), rng.randint(1, 12)
        prob = _random_problem(rng, p, m)
        for rule in RULES:
            sched, span = _one(prob, RULES[rule])
            validate(sched)
            assert not over_cap(prob, sched)
            assert retime(prob, sched).makespan_s == pytest.approx(span, abs=1e-9)
        g = greedy(prob)
        assert g.schedule.name == "latency-aware"
        assert g.makespan_s == pytest.approx(retime(prob, g.schedule).makespan_s)
        assert g.makespan_s >= lower_bound_s(prob) - 1e-9
        assert not over_cap(prob, g.schedule)


def test_greedy_hides_a_slow_link_that_1f1b_waits_on():
    # 4 stages, unit compute, a 3 s link between stages 1 and 2, 1F1B's peak memory (4) on
    # every rank: 1F1B (B as I then W) idles through round trips the greedy fills.
    st = [StageTimes(1, 1, 1, send_forward_s=3 if i == 1 else 0, send_backward_s=3 if i == 2 else 0)
          for i in range(4)]
    prob = make_problem(st, 8, [0, 3, 0], memory_cap=4)
    one_f_one_b = retime(prob, generate("1f1b", 4, 8)).makespan_s
    g = greedy(prob, seeds=False)
    assert g.makespan_s < 0.9 * one_f_one_b


def test_greedy_scales_to_64_ranks_256_micro_batches():
    st = [StageTimes(1, 1, 1, send_forward_s=0.4, send_backward_s=0.4)] * 64
    prob = make_problem(st, 256, [0.3] * 63)
    g = greedy(prob)
    assert sum(len(a) for a in g.schedule.ranks) == 3 * 64 * 256
    assert not over_cap(prob, g.schedule)
    assert g.makespan_s >= lower_bound_s(prob)


# --------------------------------------------------------------------------- exact

def _orders(m: int):
    """Every order of one rank's F / I / W actions with F < I < W per micro-batch."""
    items = [(k, j) for j in range(m) for k in "FIW"]
    for perm in itertools.permutations(items):
        seen = {}
        ok = True
        for k, j in perm:
            if "FIW".index(k) != seen.get(j, 0):
                ok = False
                break
            seen[j] = seen.get(j, 0) + 1
        if ok:
            yield tuple(Action(k, 0, j) for k, j in perm)


def _brute_force_s(prob: LatencyProblem) -> float:
    p, m = prob.num_ranks, prob.num_micro_batches
    per_rank = [list(_orders(m)) for _ in range(p)]
    best = float("inf")
    for combo in itertools.product(*per_rank):
        sched = Schedule("all", p, 1, m, "loop", combo)
        if over_cap(prob, sched):
            continue
        try:
            best = min(best, retime(prob, sched).makespan_s)
        except ScheduleError:
            continue
    return best


@pytest.mark.parametrize("seed,p,m,cap", [(1, 2, 2, 1), (2, 2, 2, 2), (3, 3, 2, 1), (4, 3, 2, 2),
                                        pytest.param(5, 2, 3, 2, marks=pytest.mark.slow)])  # 1680^2 orders: ~50 s
def test_exact_equals_brute_force_on_tiny_cases(seed, p, m, cap):
    prob = _random_problem(random.Random(seed), p, m, cap)
    res = exact(prob, greedy(prob).makespan_s, time_limit_s=60)
    assert res.status == "optimal"
    assert res.makespan_s == pytest.approx(_brute_force_s(prob), abs=1e-6)


def test_exact_on_random_small_cases_bounds_the_greedy():
    rng = random.Random(11)
    for _ in range(6):
        p, m = rng.randint(2, 4), rng.randint(2, 5)
        prob = _random_problem(rng, p, m)
        gap = greedy_gap(prob, time_limit_s=30)
        e = gap.exact
        assert e.schedule is not None
        validate(e.schedule)
        assert not over_cap(prob, e.schedule)
        run = retime(prob, e.schedule)
        assert run.makespan_s == pytest.approx(e.makespan_s)
        assert run.makespan_s <= e.objective_s + 1e-6          # the evaluator never adds time
        if e.status == "optimal":
            assert run.makespan_s == pytest.approx(e.objective_s, rel=1e-6)
        assert gap.greedy_s >= e.bound_s - 1e-6
        assert e.makespan_s <= gap.greedy_s + 1e-6
        assert gap.gap >= -1e-6


def test_exact_refuses_large_cases():
    prob = make_problem([UNIT] * 8, 16)
    with pytest.raises(ValueError, match="use the greedy"):
        exact(prob, 100.0)


def test_whole_backward_ranks_solve_as_a_w_of_no_time_and_run_as_b():
    """A rank the split backward would overflow runs B (planner.simulate.latency_rewrite): the
    solvers order it with I taking the whole B and W no time, and the lists written with B
    there re-time to the same makespan, hold no micro-batch between I and W on that rank, and
    beat no optimum the brute force over B orders finds."""
    from planner.simulate.latency import peak_waiting_w, whole_backwards, with_whole_backwards

    rng = random.Random(5)
    for _ in range(4):
        prob = _random_problem(rng, 3, 3)
        whole = {rng.randrange(3)}
        solved = with_whole_backwards(prob, whole)
        g = greedy(solved)
        sched = whole_backwards(g.schedule, whole)
        validate(sched)
        assert {a.kind for r in whole for a in sched.ranks[r]} == {"F", "B"}
        assert all(peak_waiting_w(sched)[r] == 0 for r in whole)
        assert retime(prob, sched).makespan_s == pytest.approx(g.makespan_s, rel=1e-12)
        assert not over_cap(prob, sched)
    prob = _random_problem(random.Random(3), 2, 2, 1)
    solved = with_whole_backwards(prob, {1})
    e = exact(solved, greedy(solved).makespan_s, time_limit_s=60)
    assert e.status == "optimal"
    best = retime(prob, whole_backwards(e.schedule, {1})).makespan_s
    assert best == pytest.approx(e.makespan_s, abs=1e-9)
    # brute force over the orders of rank 0 (split) and of rank 1 (F / B)
    orders_b = [o for o in itertools.permutations([Action(k, 0, j) for j in range(2) for k in "FB"])
                if all(o.index(Action("F", 0, j)) < o.index(Action("B", 0, j)) for j in range(2))]
    brute = min(retime(prob, s).makespan_s for s in
                (Schedule("all", 2, 1, 2, "loop", (a, b)) for a in _orders(2) for b in orders_b)
                if not over_cap(prob, s) and _runs(prob, s))
    assert best == pytest.approx(brute, abs=1e-6)


def _runs(prob: LatencyProblem, sched: Schedule) -> bool:
    try:
        retime(prob, sched)
    except ScheduleError:
        return False
    return True
