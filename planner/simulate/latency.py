"""Latency-aware pipeline schedules for stage boundaries over slow links (CrossPipe, issue 17).

CrossPipe (Chen, Kubicek, Huang, Hoefler, USENIX ATC '25, arXiv 2507.00217) orders each rank's
forward (F), input-gradient (I) and weight-gradient (W) work so that sends over a 30-100 ms
cross-datacenter link are hidden behind other work, under a memory cap.  This module holds the
problem, its timing model and the evaluator that re-times any order under it; the solvers are
``latency_greedy`` (list scheduling, any size) and ``latency_milp`` (exact, small cases), and
``latency_gap`` sets them side by side.

Timing model (one chunk per rank; rank r runs stage r):

- an action runs when its rank is free and its inputs are there, for its stage's F / I / W
  (or B = I + W) time, without pre-emption;
- a send does not block its sender (it is posted and the rank moves on), but the sends on one
  directed link go one after another: the k-th send starts when its action ends and the link
  has finished the previous one, occupies the link for ``transfer_s`` (bytes / bandwidth) and
  arrives ``latency_s`` after it leaves the link.  Each directed link has one sender (stage b
  sends activations on forward link b, stage b + 1 gradients on backward link b), so the
  sends go in the sender's list order: first posted, first sent;
- memory: a micro-batch occupies its rank from its F until its W (or B).  The cap counts
  these, not just F-until-I, because the W still needs the layer inputs the F stored, and the
  cost model's activation memory (planner.cost.memory, as for zb-h1) counts until W.

``retime`` applies the model to any ``actions.Schedule`` (F / B / I / W, one chunk): starts as
early as the order allows (a semi-active schedule), so for a given order its makespan is the
least any solver could claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.simulate.actions import (
    Execution,
    Schedule,
    ScheduleError,
    StageTimes,
    execute,
)

SCHEDULE_NAME = "latency-aware"


@dataclass(frozen=True)
class Link:
    """One directed link between neighbouring stages, per micro-batch message."""

    latency_s: float = 0.0
    transfer_s: float = 0.0       # bytes / bandwidth: how long the link is busy with one send

    def __post_init__(self) -> None:
        if not (self.latency_s >= 0 and self.transfer_s >= 0):
            raise ValueError(f"link latency and transfer must be >= 0, got {self.latency_s}, {self.transfer_s}")

    @property
    def total_s(self) -> float:
        return self.latency_s + self.transfer_s


@dataclass(frozen=True)
class LatencyProblem:
    """Stage times (F, I, W per stage), links per boundary and a memory cap per rank."""

    stages: tuple[StageTimes, ...]
    forward: tuple[Link, ...]        # boundary b: stage b -> b + 1 (activations)
    backward: tuple[Link, ...]       # boundary b: stage b + 1 -> b (gradients)
    num_micro_batches: int
    memory_cap: tuple[int, ...]      # per rank: micro-batches held from F until W

    def __post_init__(self) -> None:
        p = len(self.stages)
        if p < 1 or self.num_micro_batches < 1:
            raise ValueError("a latency problem needs at least one stage and one micro-batch")
        if len(self.forward) != p - 1 or len(self.backward) != p - 1:
            raise ValueError(f"{p} stages need {p - 1} forward and backward links")
        if len(self.memory_cap) != p or min(self.memory_cap) < 1:
            raise ValueError(f"memory_cap needs one value >= 1 per rank ({p}), got {list(self.memory_cap)}")

    @property
    def num_ranks(self) -> int:
        return len(self.stages)

    def send_link(self, stage: int, kind: str) -> tuple[str, int] | None:
        """(direction, boundary) of the link the output of ``kind`` on ``stage`` goes over."""
        if kind == "F" and stage < self.num_ranks - 1:
            return "fwd", stage
        if kind in ("B", "I") and stage > 0:
            return "bwd", stage - 1
        return None

    def link(self, key: tuple[str, int]) -> Link:
        return (self.forward if key[0] == "fwd" else self.backward)[key[1]]


def make_problem(stage_times: Sequence[StageTimes], num_micro_batches: int,
                 latencies_s: Sequence[float] | None = None,
                 memory_cap: int | Sequence[int] | None = None) -> LatencyProblem:
    """A problem from per-stage ``StageTimes`` whose ``send_*_s`` are whole send times
    (latency + bytes / bandwidth, as planner.cost prices them) and the latency part of each
    boundary (``latencies_s[b]``, both directions; default 0).  ``memory_cap``: one for all
    ranks or one per rank; default min(m, p), 1F1B's peak over ranks."""
    st = tuple(stage_times)
    p, m = len(st), num_micro_batches
    lat = [0.0] * (p - 1) if latencies_s is None else [float(x) for x in latencies_s]
    if len(lat) != p - 1:
        raise ValueError(f"{p} stages need {p - 1} boundary latencies, got {len(lat)}")
    fwd = tuple(Link(min(lat[b], st[b].send_forward_s), max(0.0, st[b].send_forward_s - lat[b]))
                for b in range(p - 1))
    bwd = tuple(Link(min(lat[b], st[b + 1].send_backward_s), max(0.0, st[b + 1].send_backward_s - lat[b]))
                for b in range(p - 1))
    if memory_cap is None:
        memory_cap = min(m, p)
    caps = (int(memory_cap),) * p if isinstance(memory_cap, int) else tuple(int(c) for c in memory_cap)
    # a rank never holds more than the m micro-batches there are (a cap of 100 was reported as
    # 100 on a plan of 16)
    return LatencyProblem(st, fwd, bwd, m, tuple(min(c, m) for c in caps))


def _peak_held(sched: Schedule, start: str, ends: tuple[str, ...]) -> list[int]:
    """Per rank, the most micro-batches between a ``start`` action and one of ``ends`` at once,
    in list order."""
    out = []
    for acts in sched.ranks:
        held = top = 0
        for a in acts:
            if a.kind == start:
                held += 1
                top = max(top, held)
            elif a.kind in ends:
                held -= 1
        out.append(top)
    return out


def peak_in_flight(sched: Schedule) -> list[int]:
    """Per rank, the most micro-batches held at once from F until W (or B), in list order."""
    return _peak_held(sched, "F", ("W", "B"))


def peak_waiting_w(sched: Schedule) -> list[int]:
    """Per rank, the most micro-batches between their I and their W at once, in list order: each
    keeps the gradients flowing into its weight ops (planner.cost.memory.w_input_grad_bytes)."""
    return _peak_held(sched, "I", ("W",))


def with_whole_backwards(problem: LatencyProblem, ranks) -> LatencyProblem:
    """``problem`` where each of ``ranks`` runs its backward whole: its I takes the whole B and
    its W no time, so any solver's I / W order there is a B order (``whole_backwards`` writes
    it so) at the same times.  A W of no time after its I never costs time or memory a B would
    not, so the solvers need no notion of B."""
    from dataclasses import replace

    whole = set(ranks)
    stages = tuple(replace(st, backward_input_s=st.full_backward_s, backward_weight_s=0.0, backward_s=None)
                   if r in whole else st for r, st in enumerate(problem.stages))
    return replace(problem, stages=stages)


def whole_backwards(sched: Schedule, ranks) -> Schedule:
    """``sched`` with each of ``ranks``' I written as a B and its W dropped (the split
    backward holds its weight-op gradients from I until W; a whole backward does not)."""
    from dataclasses import replace

    from planner.simulate.actions import Action

    whole = set(ranks)
    if not whole:
        return sched
    lists = tuple(tuple(Action("B", a.chunk, a.micro_batch) if a.kind == "I" else a
                        for a in acts if a.kind != "W") if r in whole else acts
                  for r, acts in enumerate(sched.ranks))
    return replace(sched, ranks=lists)


class _LinkSends:
    """The module docstring's links for ``actions.execute``: non-blocking sends, one after
    another on each directed link, arriving ``latency_s`` after they leave it."""

    blocking = False

    def __init__(self, problem: LatencyProblem):
        self.problem = problem
        self.link_free_s: dict[tuple[str, int], float] = {}

    def arrival_s(self, sched: Schedule, rank: int, stage: int, a, end_s: float, times: StageTimes) -> float:
        key = self.problem.send_link(stage, a.kind)
        if key is None:
            return end_s
        link = self.problem.link(key)
        leave = max(end_s, self.link_free_s.get(key, 0.0))
        self.link_free_s[key] = leave + link.transfer_s
        return leave + link.transfer_s + link.latency_s


def retime(problem: LatencyProblem, sched: Schedule, check: bool = True) -> Execution:
    """Run ``sched`` (one chunk per rank, loop map) under the latency model: each action as
    early as its rank's order, its inputs and the links allow.  ``ScheduleError`` if the lists
    are invalid or do not fit ``problem``."""
    p = problem.num_ranks
    if sched.num_ranks != p or sched.chunks != 1 or sched.num_micro_batches != problem.num_micro_batches:
        raise ScheduleError(f"{sched.name}: {sched.num_ranks} ranks x {sched.chunks} chunks, "
                            f"{sched.num_micro_batches} micro-batches; the problem has {p} ranks, one "
                            f"chunk each, {problem.num_micro_batches} micro-batches")
    return execute(sched, list(problem.stages), check=check, transport=_LinkSends(problem))


def over_cap(problem: LatencyProblem, sched: Schedule) -> list[tuple[int, int, int]]:
    """(rank, peak, cap) for every rank whose lists hold more micro-batches than its cap."""
    return [(r, pk, cap) for r, (pk, cap) in enumerate(zip(peak_in_flight(sched), problem.memory_cap))
            if pk > cap]


def lower_bound_s(problem: LatencyProblem) -> float:
    """A bound no order beats: the busiest rank's work after its first input can arrive, or one
    micro-batch's whole path (forwards down, input gradients back, rank 0's W)."""
    p, m, st = problem.num_ranks, problem.num_micro_batches, problem.stages
    head, best = 0.0, 0.0
    for r in range(p):
        work = m * (st[r].forward_s + st[r].backward_input_s + st[r].backward_weight_s)
        best = max(best, head + work)
        head += st[r].forward_s + (problem.forward[r].total_s if r < p - 1 else 0.0)
    back = sum(s.backward_input_s for s in st) + sum(link.total_s for link in problem.backward)
    return max(best, head + back + st[0].backward_weight_s)
