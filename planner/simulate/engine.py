"""Event-driven execution of a pipeline schedule.

Each stage runs its ops (``schedules.stage_orders``) one at a time, in order; an op starts
when the stage is free and its input has arrived.  Model:

- A forward of virtual stage ``k`` needs the forward of ``k - 1`` for the same micro-batch,
  delivered over the link; a backward of ``k`` needs the backward of ``k + 1`` (the last
  virtual stage's backward needs only its own forward).
- Sends block the sender by default (``blocking_sends``): Megatron-LM's schedules wait on
  their p2p ops, so a stage is busy for its op and then its send.  This is the model of the
  closed forms in ``planner.cost.schedule``, which the simulator must match where they are
  exact.  With ``blocking_sends=False`` sends run beside compute (a separate stream), and
  each direction of each stage-to-stage link carries one transfer at a time, first come first
  served (``serialize_links``; off: sends are pure delays).
- Per-stage times are for one micro-batch through the whole stage; with ``v`` virtual stages
  a chunk takes ``1/v`` of them.  A send from stage ``s`` to ``s + 1`` takes that stage's
  ``send_forward_s`` and a gradient from ``s`` to ``s - 1`` its ``send_backward_s``; in the
  interleaved schedule the wrap-around from the last stage to the first uses the last stage's
  ``send_forward_s`` and the first stage's ``send_backward_s``.
- Shared cores (``core_shares``, planner.simulate.sharing): when a node's processes outnumber
  its cores, each running op advances at ``min(1, C/k)`` of its alone speed while ``k`` of
  them compute, and ``busy_s`` and the timeline hold the stretched times.  Without an
  oversubscribed share the ops keep their fixed end times (the closed forms' model, exactly).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from planner.simulate.schedules import stage_orders
from planner.simulate.sharing import CoreShare, SharedCores


@dataclass(frozen=True)
class SimStage:
    """One stage's times for one micro-batch (seconds)."""

    forward_s: float
    backward_s: float
    send_forward_s: float = 0.0   # activations to the next stage
    send_backward_s: float = 0.0  # gradients to the previous stage


@dataclass(frozen=True)
class SimEvent:
    """One op or transfer on the timeline. ``kind``: fwd, bwd, send-fwd, send-bwd."""

    stage: int
    chunk: int
    micro_batch: int
    kind: str
    start_s: float
    end_s: float
    virtual_stage: int

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class SimResult:
    makespan_s: float
    timeline: list[SimEvent]      # forward and backward ops, by start time then stage
    transfers: list[SimEvent]     # sends, by start time; ``stage`` is the sender
    schedule: str
    num_stages: int
    num_micro_batches: int
    virtual_stages: int
    busy_s: list[float] = field(default_factory=list)          # compute per stage
    max_in_flight: list[int] = field(default_factory=list)     # micro-batches holding activations
    pair_syncs: list = field(default_factory=list)   # BitPipe's pair all-reduces (executor.PairSync)

    @property
    def bubble_s(self) -> list[float]:
        """Idle time of each stage within the makespan."""
        return [self.makespan_s - b for b in self.busy_s]

    @property
    def bubble_fraction(self) -> float:
        total = self.makespan_s * self.num_stages
        return (total - sum(self.busy_s)) / total if total > 0 else 0.0

    def stage_events(self, stage: int) -> list[SimEvent]:
        return [e for e in self.timeline if e.stage == stage]


def as_sim_stages(stages) -> list[SimStage]:
    """Accept ``SimStage`` or anything with the same four attributes (cost's StageTiming)."""
    out = []
    for s in stages:
        if isinstance(s, SimStage):
            out.append(s)
        else:
            out.append(SimStage(float(s.forward_s), float(s.backward_s),
                                float(getattr(s, "send_forward_s", 0.0) or 0.0),
                                float(getattr(s, "send_backward_s", 0.0) or 0.0)))
    return out


def simulate_pipeline(stages, num_micro_batches: int, schedule: str = "1f1b",
                      virtual_stages: int = 1, blocking_sends: bool = True,
                      serialize_links: bool = True, core_shares: Sequence[CoreShare] = ()) -> SimResult:
    """Run the schedule event by event; returns the makespan and the timeline."""
    st = as_sim_stages(stages)
    p, v, m = len(st), virtual_stages, num_micro_batches
    for i, s in enumerate(st):
        for name in ("forward_s", "backward_s", "send_forward_s", "send_backward_s"):
            value = getattr(s, name)
            if not value >= 0:
                raise ValueError(f"stage {i}: {name} must be a non-negative number, got {value!r}")
    orders = stage_orders(schedule, p, m, v)
    last_vs = p * v - 1
    cores = SharedCores(core_shares, p) if any(sh.oversubscribed for sh in core_shares) else None

    # "input of op (kind, vs, mb) is available" -> time; forwards of vs 0 start ready.
    ready: dict[tuple[str, int, int], float] = {("fwd", 0, mb): 0.0 for mb in range(m)}
    next_op = [0] * p
    busy = [False] * p
    channel_free: dict[tuple[int, int, str], float] = {}
    timeline: list[SimEvent] = []
    transfers: list[SimEvent] = []
    in_flight = [0] * p
    max_in_flight = [0] * p
    busy_s = [0.0] * p
    heap: list[tuple[float, int, str, tuple]] = []
    seq = 0

    def push(t: float, what: str, payload: tuple) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, seq, what, payload))
        seq += 1

    def send(t: float, src: int, dst: int, direction: str, secs: float, key: tuple, chunk: int,
             mb: int, vs: int) -> None:
        if src == dst or secs <= 0:
            push(t, "arrive", key)
            busy[src] = False
            return
        if blocking_sends:  # the sender stays busy; its link is free since it sends alone
            transfers.append(SimEvent(src, chunk, mb, f"send-{direction}", t, t + secs, vs))
            push(t + secs, "arrive", key)
            push(t + secs, "free", (src,))
            return
        busy[src] = False
        chan = (src, dst, direction)
        start = max(t, channel_free.get(chan, 0.0)) if serialize_links else t
        end = start + secs
        if serialize_links:
            channel_free[chan] = end
        transfers.append(SimEvent(src, chunk, mb, f"send-{direction}", start, end, vs))
        push(end, "arrive", key)

    def try_start(stage: int, now: float) -> None:
        if busy[stage] or next_op[stage] >= len(orders[stage]):
            return
        kind, chunk, mb = orders[stage][next_op[stage]]
        vs = chunk * p + stage
        arrived = ready.get((kind, vs, mb))
        if arrived is None or arrived > now:
            return
        secs = (st[stage].forward_s if kind == "fwd" else st[stage].backward_s) / v
        busy[stage] = True
        next_op[stage] += 1
        if kind == "fwd":
            in_flight[stage] += 1
            max_in_flight[stage] = max(max_in_flight[stage], in_flight[stage])
        if cores is not None:  # its end depends on what else computes meanwhile
            cores.start(stage, now, secs, (stage, kind, chunk, mb, vs))
            return
        busy_s[stage] += secs
        timeline.append(SimEvent(stage, chunk, mb, kind, now, now + secs, vs))
        push(now + secs, "done", (stage, kind, chunk, mb, vs))

    now = 0.0
    for s in range(p):
        try_start(s, now)
    while heap or (cores is not None and cores.running):
        now = heap[0][0] if heap else math.inf
        if cores is not None:
            now = min(now, cores.next_finish_s())
            for start, op in cores.advance(now):
                stage, kind, chunk, mb, vs = op
                busy_s[stage] += now - start
                timeline.append(SimEvent(stage, chunk, mb, kind, start, now, vs))
                push(now, "done", op)
        touched: set[int] = set()  # only these stages can start something now
        while heap and heap[0][0] == now:
            _, _, what, payload = heapq.heappop(heap)
            if what == "arrive":
                ready[payload] = now
                touched.add(payload[1] % p)
                continue
            if what == "free":
                busy[payload[0]] = False
                touched.add(payload[0])
                continue
            stage, kind, chunk, mb, vs = payload
            touched.add(stage)
            if kind == "fwd":
                if vs == last_vs:
                    ready[("bwd", vs, mb)] = now
                    busy[stage] = False
                else:
                    dst = (vs + 1) % p
                    send(now, stage, dst, "fwd", st[stage].send_forward_s,
                         ("fwd", vs + 1, mb), chunk, mb, vs)
            else:
                in_flight[stage] -= 1
                if vs > 0:
                    dst = (vs - 1) % p
                    send(now, stage, dst, "bwd", st[stage].send_backward_s,
                         ("bwd", vs - 1, mb), chunk, mb, vs)
                else:
                    busy[stage] = False
        for s in sorted(touched):
            try_start(s, now)

    stuck = [s for s in range(p) if next_op[s] < len(orders[s])]
    if stuck:  # a schedule bug, never a user error: the orders above must not deadlock
        s = stuck[0]
        raise RuntimeError(f"pipeline simulation deadlocked: stage {s} waits on "
                           f"{orders[s][next_op[s]]} ({schedule}, p={p}, m={m}, v={v})")
    makespan = max((e.end_s for e in timeline), default=0.0)
    timeline.sort(key=lambda e: (e.start_s, e.stage))
    transfers.sort(key=lambda e: (e.start_s, e.stage))
    return SimResult(makespan_s=makespan, timeline=timeline, transfers=transfers, schedule=schedule,
                     num_stages=p, num_micro_batches=m, virtual_stages=v, busy_s=busy_s,
                     max_in_flight=max_in_flight)
