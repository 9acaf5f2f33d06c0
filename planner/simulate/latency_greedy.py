"""Greedy latency-aware schedule: list scheduling under planner.simulate.latency's model.

Time runs forward over events (a rank becoming free, an input arriving).  Whenever a rank is
free it picks, among the actions it can start now, by a fixed priority of kinds:

- ``I`` (the oldest micro-batch whose gradient has arrived): the previous stage waits on it,
  over a link that may take tens of milliseconds, so it goes first;
- ``F`` (the next micro-batch whose activation has arrived) if the rank holds fewer than its
  cap: it feeds the next stage and keeps the pipeline full;
- ``W`` (the oldest pending weight gradient): nobody waits on it, so it fills the time the
  rank would otherwise idle while a send crosses the slow link;

and when nothing is ready it waits for the next arrival.  Rules are a registry (``RULES``);
``greedy`` runs each, and also the handcrafted orders in ``SEEDS`` (ZB-H1, and 1F1B with each
B as I then W) where they keep to the memory cap, and keeps the shortest under the evaluator
(the greedy's own times are the evaluator's: both start each action at the same earliest
moment).  The seeds are there because a non-delay list rule never idles on purpose, and at
equal times with no latency ZB-H1's handcrafted order is shorter (p = 4, m = 8: 27 against
the rules' 29).

F and I run in micro-batch order on every rank (the activations and gradients arrive in that
order, since each link is first-in first-out and every rank takes the oldest), so one counter
per kind and rank suffices: O(actions log ranks) per rule.  At p = 64, m = 256 one rule takes
about 0.3 s CPU here, ``greedy`` with both rules and the seeds (built and re-timed) about 2 s.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from planner.simulate.actions import GENERATORS, Action, Schedule
from planner.simulate.latency import SCHEDULE_NAME, LatencyProblem, over_cap, retime

# name -> kinds in the order a free rank tries them.  (A third rule, ifw but skipping a W when
# the next gradient lands before the W would end, never won on the random cases of
# docs/schedules.md nor at p = 64, so it is not here.)
RULES: dict[str, tuple[str, ...]] = {
    "ifw": ("I", "F", "W"),   # hide latency: gradients first, then keep the pipe fed, W fills
    "fiw": ("F", "I", "W"),   # fill first: more in flight early (up to the cap)
}


@dataclass
class GreedyResult:
    schedule: Schedule
    makespan_s: float
    rule: str
    by_rule_s: dict[str, float]


def _one(problem: LatencyProblem, order: tuple[str, ...]) -> tuple[Schedule, float]:
    p, m, st = problem.num_ranks, problem.num_micro_batches, problem.stages
    inf = float("inf")
    act_at = [[0.0] * m] + [[inf] * m for _ in range(p - 1)]   # activation arrival per rank, mb
    grad_at = [[inf] * m for _ in range(p)]                     # gradient arrival per rank, mb
    link_free = {}
    nf, ni = [0] * p, [0] * p
    wq: list[list[int]] = [[] for _ in range(p)]
    wq_head = [0] * p
    held, free = [0] * p, [0.0] * p
    lists: list[list[Action]] = [[] for _ in range(p)]
    heap = [(0.0, r) for r in range(p)]
    total = 3 * m * p
    done = 0

    def send(r: int, kind: str, mb: int, t_end: float) -> None:
        key = problem.send_link(r, kind)
        if key is None:
            if kind == "F":          # the last stage's own F: its I may start at once
                grad_at[r][mb] = t_end
                heapq.heappush(heap, (max(t_end, free[r]), r))
            return
        link = problem.link(key)
        leave = max(t_end, link_free.get(key, 0.0))
        link_free[key] = leave + link.transfer_s
        arrive = leave + link.transfer_s + link.latency_s
        target = r + 1 if kind == "F" else r - 1
        (act_at if kind == "F" else grad_at)[target][mb] = arrive
        heapq.heappush(heap, (max(arrive, free[target]), target))

    while heap and done < total:
        t, r = heapq.heappop(heap)
        if t < free[r]:
            continue        # stale: the rank is busy until free[r], which has its own event
        choice = None
        for kind in order:
            if kind == "I" and ni[r] < nf[r] and grad_at[r][ni[r]] <= t:
                choice = ("I", ni[r])
            elif kind == "F" and nf[r] < m and held[r] < problem.memory_cap[r] and act_at[r][nf[r]] <= t:
                choice = ("F", nf[r])
            elif kind == "W" and wq_head[r] < len(wq[r]):
                choice = ("W", wq[r][wq_head[r]])
            if choice is not None:
                break
        if choice is None:
            continue        # an arrival (or this rank's own progress) pushes the next event
        kind, mb = choice
        t_end = t + st[r].duration_s(kind)
        free[r] = t_end
        lists[r].append(Action(kind, 0, mb))
        done += 1
        if kind == "F":
            nf[r] += 1
            held[r] += 1
        elif kind == "I":
            ni[r] += 1
            wq[r].append(mb)
        else:
            wq_head[r] += 1
            held[r] -= 1
        if kind != "W":
            send(r, kind, mb, t_end)
        heapq.heappush(heap, (t_end, r))
    if done < total:  # cannot happen with caps >= 1 (the last rank always finishes what it holds)
        raise RuntimeError(f"greedy stalled after {done} of {total} actions")
    return Schedule(SCHEDULE_NAME, p, 1, m, "loop", tuple(tuple(acts) for acts in lists)), max(free)


def one_f_one_b_split(p: int, m: int) -> Schedule:
    """1F1B with each B written as I then W at once: 1F1B's order and memory."""
    base = GENERATORS["1f1b"].build(p, m, 1)
    return Schedule("1f1b-iw", p, 1, m, "loop", tuple(
        tuple(x for a in acts for x in ((Action("I", 0, a.micro_batch), Action("W", 0, a.micro_batch))
                                        if a.kind == "B" else (a,))) for acts in base.ranks))


SEEDS: dict[str, Callable[[int, int], Schedule]] = {
    "zb-h1": lambda p, m: GENERATORS["zb-h1"].build(p, m, 1),   # valid by construction (tested)
    "1f1b-iw": one_f_one_b_split,
}


def greedy(problem: LatencyProblem, rules: tuple[str, ...] | None = None,
           seeds: bool = True) -> GreedyResult:
    """The best of the ``RULES`` (all by default) and, with ``seeds``, of the ``SEEDS`` that keep
    to the cap, under the evaluator; the schedule is renamed ``latency-aware``."""
    best = None
    by_rule: dict[str, float] = {}
    candidates = [(name, lambda name=name: _one(problem, RULES[name])) for name in rules or tuple(RULES)]
    if seeds:
        for name, build in SEEDS.items():
            def seeded(build=build):
                sched = build(problem.num_ranks, problem.num_micro_batches)
                if over_cap(problem, sched):
                    return None
                return sched, retime(problem, sched, check=False).makespan_s
            candidates.append((name, seeded))
    for name, run in candidates:
        got = run()
        if got is None:
            continue
        sched, span = got
        by_rule[name] = span
        if best is None or span < best[1] - 1e-12:
            best = (sched, span, name)
    sched = best[0]
    if sched.name != SCHEDULE_NAME:
        sched = Schedule(SCHEDULE_NAME, sched.num_ranks, 1, sched.num_micro_batches, "loop", sched.ranks)
    return GreedyResult(sched, best[1], best[2], by_rule)
