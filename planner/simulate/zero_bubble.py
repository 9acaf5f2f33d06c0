"""V-shaped zero-bubble schedules as action lists: ZB-V and DualPipeV (issue 17).

Both run two chunks per rank on the ``v`` stage map (planner.simulate.actions: chunk 0 of rank
``r`` is stage ``r``, chunk 1 is stage ``2p - 1 - r``), so the last rank turns a micro-batch
around locally and the first rank holds the first and the last stage.

- ``zb-v``: ZB-V of Qi et al. 2024 ("Pipeline Parallelism with Controllable Memory", and §6
  of "Zero Bubble Pipeline Parallelism"), in the order torch 2.13's ``ScheduleZBVZeroBubble``
  runs.  Rank ``r`` warms up with ``2(p - r) - 1`` chunk-0 forwards, ``r`` forward pairs
  (chunk 1, chunk 0) and ``p - r`` chunk-1 triples F I W; the steady state alternates the
  chunks, each step a forward, an input gradient and at once its weight gradient; the
  cool-down runs ``r`` input-gradient pairs, then chunk 0's I / W pairs, then the deferred W's.
  The lists are built for ``max(m, 2p - 1)`` micro-batches and the actions on micro-batches
  ``>= m`` dropped, as torch does, so any ``m >= 1`` works.  At F = I = W = 1 per chunk the
  makespan is ``6m + max(p - 1, 4p - 2m - 2)``, and from ``m >= 2p - 1`` no rank idles between
  its first and last action (the p - 1 left is the skew before the last rank's first
  forward); rank r holds at most ``min(2p, m + r + 1, 2m)`` chunk micro-batches, so at most
  ``p`` whole-stage ones, 1F1B's peak (the paper's "same memory as 1F1B").  Measured for
  the p <= 8 and m the tests cover (tests/test_simulate_zero_bubble.py).
- ``dualpipev``: DeepSeek's DualPipe (DeepSeek-V3 report, arXiv 2412.19437, §3.2.1) cut in
  half into a V, as torch 2.13's ``ScheduleDualPipeV`` runs it (needs ``m >= 2p``, torch's
  ``n_microbatches >= num_stages``).  Eight phases per rank: chunk-0 forwards, forward pairs,
  zero-bubble I W F steps on chunk 1, the main phase of forward-backward pairs
  (F0 B1, F1 B0), B1 F1 B0 steps, the drain's backwards (the second half of them split into
  I with the W queued), and the queued W's.  torch runs each forward-backward pair as one
  ``OVERLAP_F_B`` action whose two sub-actions run one after the other (its
  ``_PipelineScheduleRuntime`` has no overlap of its own unless a custom function is
  registered); here such a pair is the F followed by the B, the order torch executes them in.
  DeepSeek's overlap of one pair's communication with the other's compute is not modelled.
  At F = I = W = 1 per chunk the makespan is ``6m + p - 1`` for every ``m >= 2p``, and every
  rank holds ``2p + 1`` chunk micro-batches at its peak.

The generators below follow the phase descriptions above; tests compare every list with
torch's ``pipeline_order`` (tests/test_simulate_zero_bubble.py).
"""

from __future__ import annotations

from collections import deque

from planner.simulate.actions import Action, Schedule, ScheduleError


def _need_two_chunks(name: str, v: int) -> None:
    if v != 2:
        raise ScheduleError(f"{name} runs two chunks per rank in a V (virtual_stages 2), not {v}")


class _Ranklist:
    """One rank's list under construction: next micro-batch per (kind, chunk), the W queue."""

    def __init__(self) -> None:
        self.acts: list[Action] = []
        self.next: dict[tuple[str, int], int] = {}
        self.queued_w: deque[tuple[int, int]] = deque()

    def add(self, kind: str, chunk: int) -> None:
        # B and I share one counter: each micro-batch gets one or the other
        key = ("I" if kind == "B" else kind, chunk)
        mb = self.next.get(key, 0)
        self.next[key] = mb + 1
        self.acts.append(Action(kind, chunk, mb))

    def input_grad_queued(self, chunk: int) -> None:
        """I now, its W onto the queue (DualPipeV)."""
        mb = self.next.get(("I", chunk), 0)
        self.add("I", chunk)
        self.queued_w.append((chunk, mb))

    def pop_w(self) -> None:
        if self.queued_w:
            chunk, mb = self.queued_w.popleft()
            self.acts.append(Action("W", chunk, mb))

    def count(self, kind: str, chunk: int) -> int:
        return self.next.get((kind, chunk), 0)


def zb_v(p: int, m: int, v: int = 2) -> Schedule:
    """ZB-V (module docstring), torch's ``ScheduleZBVZeroBubble`` order."""
    _need_two_chunks("zb-v", v)
    n = max(m, 2 * p - 1)   # padded so the phases below fill; actions past m dropped at the end
    ranks = []
    for r in range(p):
        lst = _Ranklist()
        for _ in range(2 * (p - r) - 1):
            lst.add("F", 0)
        for _ in range(r):
            lst.add("F", 1)
            lst.add("F", 0)
        for _ in range(p - r):
            for kind in "FIW":
                lst.add(kind, 1)
        while lst.count("F", 1) < lst.count("F", 0) or lst.count("F", 0) < n:
            if lst.count("F", 0) < n:
                lst.add("F", 0)
            for chunk, kinds in ((0, "IW"), (1, "FIW")):
                for kind in kinds:
                    lst.add(kind, chunk)
        for _ in range(r):
            lst.add("I", 0)
            lst.add("I", 1)
        for _ in range(p - r):
            lst.add("I", 0)
            lst.add("W", 0)
        for chunk in (1, 0):
            while lst.count("W", chunk) < lst.count("I", chunk):
                lst.add("W", chunk)
        ranks.append(tuple(a for a in lst.acts if a.micro_batch < m))
    return Schedule("zb-v", p, 2, m, "v", tuple(ranks))


def dualpipev_min_micro_batches(p: int) -> int:
    """torch 2.13's ``ScheduleDualPipeV`` refuses ``n_microbatches < num_stages`` (= 2p)."""
    return 2 * p


def dualpipev(p: int, m: int, v: int = 2) -> Schedule:
    """DualPipeV (module docstring), torch's ``ScheduleDualPipeV`` order with each overlapped
    forward-backward pair as its F then its B."""
    _need_two_chunks("dualpipev", v)
    if m < dualpipev_min_micro_batches(p):
        raise ScheduleError(f"dualpipev needs at least 2 x {p} ranks = {2 * p} micro-batches "
                            f"(torch's ScheduleDualPipeV: n_microbatches >= stages), got {m}")
    ranks = []
    for r in range(p):
        lst = _Ranklist()
        for _ in range(2 * (p - r - 1)):
            lst.add("F", 0)
        for _ in range(r + 1):
            lst.add("F", 0)
            lst.add("F", 1)
        for _ in range(p - r - 1):
            lst.input_grad_queued(1)
            lst.pop_w()
            lst.add("F", 1)
        for _ in range(m - 2 * p + r + 1):   # main phase: (F0, B1), (F1, B0)
            for fwd, bwd in ((0, 1), (1, 0)):
                lst.add("F", fwd)
                lst.add("B", bwd)
        for _ in range(p - r - 1):
            lst.add("B", 1)
            lst.add("F", 1)
            lst.add("B", 0)
        # Drain: the later half of the backwards run as I with W queued, from the middle step
        # on (before chunk 1's backward on odd ranks, between the two on even ones).
        split = False
        for i in range(r + 1):
            for chunk in (1, 0):
                if i == (r + 1) // 2 and (r % 2 == 1) == (chunk == 1):
                    split = True
                lst.input_grad_queued(chunk) if split else lst.add("B", chunk)
        for _ in range(p - r - 1):
            lst.pop_w()
            lst.input_grad_queued(0) if split else lst.add("B", 0)
        for _ in range(r + 1):
            lst.pop_w()
        ranks.append(tuple(lst.acts))
    return Schedule("dualpipev", p, 2, m, "v", tuple(ranks))


def v_stage_times(stages) -> list:
    """Per-chunk ``StageTimes`` (2p of them, by global stage) for a V schedule from per-rank
    timings (cost ``StageTiming``: one micro-batch through the rank's whole share of the model).

    Each chunk computes half of its rank's forward, input gradient and weight gradient
    (W = ``backward_weight_s``, 0 where the timing has none; I the rest of the backward): the
    plan cuts each stage's blocks into two equal chunks, and the embedding and head are not
    placed apart (rank 0 holds both in the V; their time is split with the blocks').  Sends
    follow the V: chunk 0 of rank r sends its activation to rank r + 1 and its gradient to
    rank r - 1, as in 1F1B, while chunk 1 runs the other way, so its activation goes over the
    link the rank's ``send_backward_s`` prices and its gradient over ``send_forward_s``'s.
    The last rank's hand-off from chunk 0 to chunk 1 stays on the rank (the executor sends
    nothing between chunks of one rank)."""
    from planner.simulate.actions import StageTimes

    p = len(stages)
    per_rank = []
    for st in stages:
        b = float(st.backward_s)
        w = min(max(float(getattr(st, "backward_weight_s", 0.0) or 0.0), 0.0), b)
        sf = float(getattr(st, "send_forward_s", 0.0) or 0.0)
        sb = float(getattr(st, "send_backward_s", 0.0) or 0.0)
        per_rank.append((float(st.forward_s) / 2, (b - w) / 2, w / 2, b / 2, sf, sb))
    out = []
    for g in range(2 * p):
        rank, chunk0 = (g, True) if g < p else (2 * p - 1 - g, False)
        f, i, w, b, sf, sb = per_rank[rank]
        out.append(StageTimes(forward_s=f, backward_input_s=i, backward_weight_s=w, backward_s=b,
                              send_forward_s=sf if chunk0 else sb, send_backward_s=sb if chunk0 else sf))
    return out
