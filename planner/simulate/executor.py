"""An event-driven executor for any pipeline schedule written as per-rank action lists
(planner.simulate.actions).

``execute`` runs any schedule on per-stage durations (``StageTimes``): each rank runs its list in
order; an action starts when the rank is free and its inputs have arrived, an input from a
stage on another rank arriving the sender's send time after the producing action ends.  Sends
block the sender by default (Megatron's schedules wait on their p2p ops; the closed forms in
``planner.cost.schedule`` assume it), or run beside compute (``blocking_sends=False``: a pure
delay).  There is no other contention, so each action's start is fixed by the ends of the
actions it waits on: the executor walks the ranks' lists as a worklist (an action runs once its
inputs' times are known) and the times are those of a discrete-event run, exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.simulate.actions import Action, Schedule, ScheduleError, _deps, _keys, validate


@dataclass(frozen=True)
class StageTimes:
    """One stage (chunk), one micro-batch (seconds).  ``backward_s`` (a full B) defaults to
    ``backward_input_s + backward_weight_s``; ``send_forward_s`` is this stage's activation
    send to the next stage, ``send_backward_s`` its gradient send to the previous one."""

    forward_s: float
    backward_input_s: float = 0.0
    backward_weight_s: float = 0.0
    backward_s: float | None = None
    send_forward_s: float = 0.0
    send_backward_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("forward_s", "backward_input_s", "backward_weight_s", "backward_s",
                     "send_forward_s", "send_backward_s"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")

    @property
    def full_backward_s(self) -> float:
        return self.backward_input_s + self.backward_weight_s if self.backward_s is None else self.backward_s

    def duration_s(self, kind: str) -> float:
        return {"F": self.forward_s, "B": self.full_backward_s, "I": self.backward_input_s,
                "W": self.backward_weight_s}[kind]


def stage_times_from_ranks(stages, chunks: int = 1, stage_map: str = "loop",
                           weight_fraction: float = 0.5) -> list[StageTimes]:
    """Per-stage ``StageTimes`` from per-rank timings (``planner.cost`` StageTiming or
    ``planner.simulate.SimStage``: forward_s, backward_s, send_forward_s, send_backward_s for the
    whole rank and one micro-batch).  A chunk computes ``1/chunks`` of its rank's time and sends
    with its rank's send times (as ``planner.simulate.engine`` does); a backward splits into I
    and W by ``weight_fraction`` (W's share; the profiles do not yet give the split).  On the
    ``v`` map a rank's second chunk runs the pipeline the other way, so its activation goes
    over the link its rank's ``send_backward_s`` prices and its gradient over
    ``send_forward_s``'s (as ``zero_bubble.v_stage_times``)."""
    p = len(stages)
    sched = Schedule("map", p, chunks, 1, stage_map, tuple(() for _ in range(p)))
    out = []
    for s in range(p * chunks):
        rank, chunk = sched.owner(s)
        st = stages[rank]
        b = float(st.backward_s) / chunks
        sf = float(getattr(st, "send_forward_s", 0.0) or 0.0)
        sb = float(getattr(st, "send_backward_s", 0.0) or 0.0)
        if stage_map == "v" and chunk % 2:
            sf, sb = sb, sf
        out.append(StageTimes(forward_s=float(st.forward_s) / chunks,
                              backward_input_s=b * (1 - weight_fraction), backward_weight_s=b * weight_fraction,
                              backward_s=b, send_forward_s=sf, send_backward_s=sb))
    return out


@dataclass(frozen=True)
class ActionRun:
    """One action or send on the timeline; for a send ``kind`` is ``send-F`` or ``send-B`` and
    ``rank``/``stage`` are the sender's."""

    rank: int
    stage: int
    chunk: int
    micro_batch: int
    kind: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class PairSync:
    """A gradient all-reduce between the two ranks that hold the same weights (BitPipe's pair
    r, p-1-r) for one ``stage`` of a pipeline, both pipelines' copies.  It runs on the pair's
    link beside compute, so it is drawn and traced apart from the ranks' actions."""

    ranks: tuple[int, int]
    stage: int
    start_s: float
    end_s: float


@dataclass
class Execution:
    schedule: Schedule
    makespan_s: float                             # the last action, send or pair sync to end
    actions: list[ActionRun]                      # compute, by rank then list order
    sends: list[ActionRun]                        # between ranks, by start time
    busy_s: list[float] = field(default_factory=list)            # compute per rank
    peak_in_flight: list[int] = field(default_factory=list)      # F done, B / W not yet
    peak_before_input_grad: list[int] = field(default_factory=list)  # F done, B / I not yet
    pair_syncs: list[PairSync] = field(default_factory=list)     # BitPipe only, by start time

    @property
    def idle_s(self) -> list[float]:
        return [self.makespan_s - b for b in self.busy_s]

    @property
    def bubble_fraction(self) -> float:
        total = self.makespan_s * self.schedule.num_ranks
        return (total - sum(self.busy_s)) / total if total > 0 else 0.0

    def rank_actions(self, rank: int) -> list[ActionRun]:
        return [a for a in self.actions if a.rank == rank]


class FixedSends:
    """The cost model's sends: a cross-rank output takes its stage's ``send_forward_s`` /
    ``send_backward_s`` (latency + bytes / bandwidth) to arrive; ``blocking``: the sender
    waits for it (a blocking P2P send), else it is posted and the rank moves on."""

    def __init__(self, blocking: bool = True):
        self.blocking = blocking

    def arrival_s(self, sched: Schedule, rank: int, stage: int, a: Action, end_s: float,
                  times: StageTimes) -> float:
        """When ``a``'s output reaches its consumer on another rank (``end_s``: none to send)."""
        if a.kind == "F" and stage < sched.num_stages - 1:
            target, send_s = stage + 1, times.send_forward_s
        elif a.kind in ("B", "I") and stage > 0:
            target, send_s = stage - 1, times.send_backward_s
        else:
            return end_s
        if send_s <= 0 or sched.owner(target, a.micro_batch)[0] == rank:
            return end_s
        return end_s + send_s


def execute(sched: Schedule, times: StageTimes | Sequence[StageTimes], blocking_sends: bool = True,
            check: bool = True, transport=None) -> Execution:
    """Run ``sched`` on per-stage ``times`` (one ``StageTimes`` for all stages, or one per global
    stage): each action as early as its rank's order and its inputs allow.  ``transport``
    times the sends (``FixedSends(blocking_sends)`` by default; the latency-aware model's
    shared links: planner.simulate.latency).  ``ScheduleError`` if the lists are invalid
    (``check``) or deadlock."""
    if check:
        validate(sched)
    transport = transport or FixedSends(blocking_sends)
    S, p = sched.num_stages, sched.num_ranks
    slots = sched.num_slots
    st = [times] * slots if isinstance(times, StageTimes) else list(times)
    if len(st) != slots:
        raise ValueError(f"{len(st)} stage times for {slots} stages" + (
            f" ({sched.num_pipelines} pipelines of {S})" if sched.num_pipelines > 1 else ""))
    # key -> time the output is available to its consumer on the same rank ("end") and to the
    # neighbouring stage (after the send); the consumer picks by whether it shares the rank.
    end: dict[tuple[str, int, int], float] = {}
    arrive: dict[tuple[str, int, int], float] = {}
    pos = [0] * p
    free = [0.0] * p
    runs: list[list[ActionRun]] = [[] for _ in range(p)]
    sends: list[ActionRun] = []
    busy = [0.0] * p
    waiting: dict[tuple[str, int, int], list[int]] = {}
    work = list(range(p))
    while work:
        r = work.pop()
        acts = sched.ranks[r]
        while pos[r] < len(acts):
            a = acts[pos[r]]
            s, times_s = sched.stage(r, a.chunk), st[sched.slot(r, a.chunk)]
            ready = free[r]
            blocked = None
            for d in _deps(sched, s, a):
                if d not in end:
                    blocked = d
                    break
                same_rank = sched.owner(d[1], d[2])[0] == r
                ready = max(ready, end[d] if same_rank else arrive[d])
            if blocked is not None:
                waiting.setdefault(blocked, []).append(r)
                break
            secs = times_s.duration_s(a.kind)
            t_end = ready + secs
            runs[r].append(ActionRun(r, s, a.chunk, a.micro_batch, a.kind, ready, t_end))
            busy[r] += secs
            free[r] = t_end
            t_arrive = transport.arrival_s(sched, r, s, a, t_end, times_s)
            if t_arrive > t_end:
                label = "send-F" if a.kind == "F" else "send-B"
                sends.append(ActionRun(r, s, a.chunk, a.micro_batch, label, t_end, t_arrive))
                if transport.blocking:
                    free[r] = t_arrive
            for k in _keys(a, s):
                end[k] = t_end
                arrive[k] = t_arrive
                work.extend(waiting.pop(k, []))
            pos[r] += 1
    stuck = [r for r in range(p) if pos[r] < len(sched.ranks[r])]
    if stuck:
        r = stuck[0]
        raise ScheduleError(f"{sched.name}: rank {r} deadlocks at {sched.ranks[r][pos[r]]}")
    peak, peak_g = [], []
    for r in range(p):
        held = held_g = top = top_g = 0
        for a in runs[r]:
            if a.kind == "F":
                held += 1
                held_g += 1
                top, top_g = max(top, held), max(top_g, held_g)
            elif a.kind == "B":
                held -= 1
                held_g -= 1
            elif a.kind == "I":
                held_g -= 1
            else:
                held -= 1
        peak.append(top)
        peak_g.append(top_g)
    actions = [a for rr in runs for a in rr]
    makespan = max((a.end_s for a in actions), default=0.0)
    sends.sort(key=lambda e: (e.start_s, e.rank))
    return Execution(sched, makespan, actions, sends, busy, peak, peak_g)
