"""BitPipe (Wu et al. 2024, "BitPipe: Bidirectional Interleaved Pipeline Parallelism for
Accelerating Large Models Training", arXiv 2410.19367) as action lists.

The model is cut into 2p stages; two V-shaped interleaved pipelines run over the same p ranks
in opposite directions (stage map ``bitpipe``, planner.simulate.layouts): the "down" pipeline
puts stages r and 2p-1-r on rank r, the "up" pipeline mirrors it, so ranks r and p-1-r hold the
same four stages' weights (one copy per pipeline) and all-reduce their gradients over the pair.
The first m/2 micro-batches go down, the last m/2 up.

The order.  The paper describes the schedule by its figures, not as a rule we could read off
exactly, so this is *not* claimed to be the paper's order: it is a 1F1B-like list schedule on
the bidirectional map, built by running the ranks at the generation times (a chunk's F = 1,
B = 2) and letting each rank, whenever it is free, pick among the actions whose inputs are
there:

1. a backward if any (oldest micro-batch first, then the later stage), as 1F1B does, so
   activations are freed as soon as possible;
2. else a forward (oldest micro-batch first, the two pipelines' micro-batches alternating,
   then the later stage), if the rank holds fewer than ``cap`` chunk activations or the
   forward continues a micro-batch the rank already holds (the V's turn: without it two ranks
   full of each other's micro-batches would wait on each other).

``cap`` bounds the chunk activations a rank holds (a chunk is 1/(2p) of the model for one
micro-batch, as an interleaved chunk with v = 2 is); the continuation rule can exceed it by at
most one per micro-batch held.  The generator builds the order with cap 2p and with cap 3p and
keeps the one with the smaller makespan at the generation times (ties: 2p): 2p wins for m up
to about 2p, 3p for more micro-batches, where with 2p the steady state leaves gaps and the
bubble grows with m (p = 8, m = 64: 59 units against 24).  Measured peaks
(tests/test_simulate_bitpipe.py) stay within 3p + p/2 + 1 chunks; interleaved 1F1B's rank 0
holds 3p - 1, 1F1B's rank 0 the equivalent of 2p.  Other tie-breaks (newest backward first,
backward by later stage, first-in first-out, strict F/B alternation after a warm-up) were
tried and were not better at every p, m.  Because the lists are the order of a real run, they
are valid (every action follows its inputs) under any durations.

Time at unit chunk times (F = 1, B = 2 per chunk, so 6 units of work per micro-batch per
rank), against interleaved 1F1B (m + (p - 1) / 2) x 6 at equal work, bubble = makespan - 6m:
p=4, m=8: 53 (bubble 5, interleaved 9); p=8, m=16: 115 (19 against 21); p=8, m=32: 218 (26
against 21); p=8, m=64: 408 (24 against 21); p=16, m=16: 126 (30 against 45); p=16, m=64: 418
(34 against 45).  So this order's bubble is near interleaved's for m >= 2p and about half of
it or less for m <= p, not the constant fraction of interleaved's a bidirectional schedule can
reach: the paper's own order is not reproduced (docs/schedules.md).
"""

from __future__ import annotations

from dataclasses import replace

from planner.simulate.actions import Action, Schedule, ScheduleError, StageTimes

GEN_FORWARD_S, GEN_BACKWARD_S = 1.0, 2.0


def check_knobs(p: int, m: int) -> str | None:
    """Why BitPipe cannot run p ranks and m micro-batches, or None."""
    if p < 2 or p % 2:
        return f"bitpipe pairs rank r with rank p-1-r, so it needs an even number of ranks >= 2, not {p}"
    if m < 2 or m % 2:
        return f"bitpipe sends half of the micro-batches down and half up: it needs an even m >= 2, not {m}"
    return None


def pipelines(m: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The down pipeline carries micro-batches 0 .. m/2-1, the up one the rest."""
    return tuple(range(m // 2)), tuple(range(m // 2, m))


CAPS_PER_RANK = (2, 3)   # the caps tried, in chunk activations per rank, times p


def _generation_makespan(ranks: tuple[tuple[Action, ...], ...], sched: Schedule) -> float:
    from planner.simulate.actions import execute

    run = execute(replace(sched, ranks=ranks), StageTimes(forward_s=GEN_FORWARD_S, backward_s=GEN_BACKWARD_S),
                  check=False)
    return run.makespan_s


def bitpipe(p: int, m: int, v: int = 4, cap: int | None = None) -> Schedule:
    """The BitPipe action lists (module docstring); ``v`` must be 4 (chunks per rank)."""
    if v != 4:
        raise ScheduleError(f"bitpipe runs 4 chunks per rank (2 per pipeline), not {v}")
    problem = check_knobs(p, m)
    if problem:
        raise ScheduleError(problem)
    if cap is not None and cap < 1:
        raise ScheduleError(f"bitpipe's cap on chunk activations per rank must be >= 1, not {cap}")
    shell = Schedule("bitpipe", p, 4, m, "bitpipe", tuple(() for _ in range(p)), pipelines(m))
    if cap is not None:
        return replace(shell, ranks=_list_schedule(shell, cap))
    tried = [(k * p, _list_schedule(shell, k * p)) for k in CAPS_PER_RANK]
    _, ranks = min(tried, key=lambda t: (_generation_makespan(t[1], shell), t[0]))
    return replace(shell, ranks=ranks)


def _order_key(sched: Schedule, mb: int) -> int:
    """Micro-batches in admission order: the two pipelines alternate."""
    pipe = sched.pipe_of(mb)
    return 2 * sched.pipelines[pipe].index(mb) + pipe


def _list_schedule(sched: Schedule, cap: int) -> tuple[tuple[Action, ...], ...]:
    """Run the ranks at the generation times and record what each picks (module docstring).
    Each rank keeps the actions whose inputs are done, with the time they are there."""
    p, S = sched.num_ranks, sched.num_stages
    done: dict[tuple[str, int, int], float] = {}       # (kind, stage, mb) -> end time
    ready: list[dict[Action, float]] = [{} for _ in range(p)]
    free = [0.0] * p
    held: list[dict[int, int]] = [{} for _ in range(p)]   # micro-batch -> chunk activations held
    out: list[list[Action]] = [[] for _ in range(p)]
    stale = set(range(p))   # ranks whose ready set or state changed since their last pick

    def offer(kind: str, stage: int, mb: int) -> None:
        deps = ([("F", stage - 1, mb)] if stage > 0 else []) if kind == "F" else \
            [("F", stage, mb)] + ([("B", stage + 1, mb)] if stage < S - 1 else [])
        if all(d in done for d in deps):
            r, c = sched.owner(stage, mb)
            ready[r][Action(kind, c, mb)] = max([done[d] for d in deps], default=0.0)
            stale.add(r)

    for mb in range(sched.num_micro_batches):
        offer("F", 0, mb)

    def pick(r: int) -> tuple[float, Action] | None:
        cands = [(t, a) for a, t in ready[r].items()
                 if a.kind == "B" or a.micro_batch in held[r] or sum(held[r].values()) < cap]
        if not cands:
            return None
        start = max(free[r], min(t for t, _ in cands))
        now = [a for t, a in cands if t <= start]
        pool = [a for a in now if a.kind == "B"] or now
        return start, min(pool, key=lambda a: (_order_key(sched, a.micro_batch), -sched.stage(r, a.chunk)))

    remaining = 2 * sched.num_micro_batches * S
    picks: list[tuple[float, Action] | None] = [None] * p
    while remaining:
        for r in stale:
            picks[r] = pick(r)
        stale.clear()
        choices = [(c[0], r, c[1]) for r, c in enumerate(picks) if c is not None]
        if not choices:
            raise ScheduleError(f"bitpipe p={p} m={sched.num_micro_batches}: the list schedule stalls "
                                f"at cap {cap}")
        start, r, a = min(choices, key=lambda c: (c[0], c[1]))
        stage, mb = sched.stage(r, a.chunk), a.micro_batch
        free[r] = start + (GEN_FORWARD_S if a.kind == "F" else GEN_BACKWARD_S)
        done[(a.kind, stage, mb)] = free[r]
        count = held[r].get(mb, 0) + (1 if a.kind == "F" else -1)
        if count:
            held[r][mb] = count
        else:
            held[r].pop(mb, None)
        del ready[r][a]
        stale.add(r)
        out[r].append(a)
        remaining -= 1
        if a.kind == "F":
            if stage < S - 1:
                offer("F", stage + 1, mb)
            else:
                offer("B", stage, mb)
        elif stage > 0:
            offer("B", stage - 1, mb)
        if a.kind == "F" and stage < S - 1 and ("B", stage + 1, mb) in done:
            offer("B", stage, mb)
    return tuple(tuple(acts) for acts in out)


def rank_stage_times(stages) -> list[StageTimes]:
    """``StageTimes`` per (pipeline, stage) slot from per-rank timings of the plan's p stages
    (``StageTiming`` / ``SimStage``: forward_s, backward_s, sends, for the rank's whole share
    of one micro-batch in one pipeline).

    The plan's stage r is rank r's share in the down pipeline, cut into its two chunks of equal
    time.  In the up pipeline rank r runs the blocks of plan stage p-1-r (the same weights), at
    that stage's priced times (exact when the pair's GPUs are of one type; docs/internals.md).
    Sends: a chunk whose output goes to rank r+1 pays the link r -> r+1 (the plan stage's
    ``send_forward_s``), one whose output goes to rank r-1 the link r -> r-1
    (``send_backward_s``); down chunk 0 and up chunk 1 pass forwards to r+1, the other two to
    r-1, gradients the other way.  The V's turn stays on the rank (no send).
    """
    p = len(stages)
    shell = Schedule("map", p, 4, 2, "bitpipe", tuple(() for _ in range(p)), pipelines(2))
    out: list[StageTimes] = []
    for slot in range(shell.num_slots):
        pipe, stage = divmod(slot, shell.num_stages)
        r, c = shell.owner(stage, 0 if pipe == 0 else 1)
        share, own = stages[r if pipe == 0 else p - 1 - r], stages[r]
        b = float(share.backward_s) / 2
        w = min(max(float(getattr(share, "backward_weight_s", 0.0) or 0.0) / 2, 0.0), b)
        up_rank = c in (0, 3)          # forwards travel to r + 1
        to_next = float(getattr(own, "send_forward_s", 0.0) or 0.0)
        to_prev = float(getattr(own, "send_backward_s", 0.0) or 0.0)
        out.append(StageTimes(
            forward_s=float(share.forward_s) / 2, backward_input_s=b - w, backward_weight_s=w, backward_s=b,
            send_forward_s=to_next if up_rank else to_prev,
            send_backward_s=to_prev if up_rank else to_next))
    return out
