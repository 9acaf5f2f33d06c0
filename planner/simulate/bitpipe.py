"""BitPipe (Wu et al. 2024, "BitPipe: Bidirectional Interleaved Pipeline Parallelism for
Accelerating Large Models Training", arXiv 2410.19367) as action lists.

The model is cut into 2p stages; two V-shaped interleaved pipelines run over the same p ranks
in opposite directions (stage map ``bitpipe``, planner.simulate.layouts): the "down" pipeline
puts stages r and 2p-1-r on rank r, the "up" pipeline mirrors it, so ranks r and p-1-r hold the
same four stages' weights (one copy per pipeline) and all-reduce their gradients over the pair.
The first m/2 micro-batches go down, the last m/2 up.

The order is the authors' (for m a multiple of p).  Sources: their runtime,
github.com/wuhouming/BitPipe megatron/core/pipeline_parallel/bitpipe_schedule.py (commit
c66cb12; read for the order, none of its code used here), and the two schedule figures of their
README, docs/BitPipe_images/BitPipe-v.svg (p = 4, m = 4) and scale-moreb.svg (p = 4, m = 8,
"direct concatenation"), both at commit ea6f6bb, read by scripts/bitpipe_figure.py into
tests/bitpipe/figure_p4_m4.json and figure_p4_m8.json.  The rule, with h = p/2:

- micro-batches go in units of h per pipeline (the runtime refuses m not a multiple of p);
- a rank's "own" pipeline is the one entering nearer to it (down for r < h); with
  ``lead = h - min(r, p-1-r)``, a unit's forwards on rank r are: ``lead`` own first-leg
  forwards; then the other pipeline's first leg and the own first leg alternating; then the
  other pipeline's first and second legs alternating (its V turns here or nearby); then the
  own second leg and the other's second leg alternating; then the last ``lead`` own second-leg
  forwards (``_unit``).  The backwards are the same order with the two legs swapped;
- a rank runs ``warm = 3h + min(r, p-1-r)`` forwards, then forward-backward pairs; between
  two units it runs ``steady = 2p - warm`` pairs, ``warm - steady + 1`` backwards, ``steady - 1``
  pairs and ``warm - steady + 1`` forwards (the next unit's forwards fill this unit's drain);
  after the last unit's pairs, the remaining backwards.

The p = 4, m = 4 lists are the figure's exactly (tests/test_simulate_bitpipe.py), and at unit
times the executor reproduces its 28-unit makespan.  For m = 8 the runtime's order and the
scale-moreb figure differ in one place on ranks 0 and 3: where units meet, the figure runs the
next unit's second forward before the pending backward (F F B), the runtime F B F; this module
follows the runtime (what the paper's measurements ran), which at unit times costs one unit
per unit boundary at p = 4 (54 against the figure's 53).  For other even m (not a multiple of
p) the authors give no order, and ``bitpipe`` falls back to a list schedule of ours (below;
``paper_order_applies`` says which one a (p, m) gets, the schedule's name shows it:
"bitpipe" or "bitpipe (list order)").

Time at unit chunk times (F = 1, B = 2 per chunk, 6 units of work per micro-batch per rank):
the makespan is 6m + (p - 2)(m/p + 1) over p = 2 .. 16, m/p = 1 .. 5 (measured, not derived),
against interleaved 1F1B's 6m + 3(p - 1) at equal work: p=4, m=4: 28 (interleaved 33); m=8:
54 (57); m=16: 106 (105); p=8, m=8: 60 (69); m=16: 114 (117); m=32: 222 (213); m=64: 438
(405); p=16, m=16: 124 (141); m=64: 454 (429).  Each unit boundary adds p - 2 units of bubble,
so the authors' order beats interleaved 1F1B's bubble for m <= 2p and loses to it from m = 3p
on (p >= 6).  Peak activations: rank r holds 3h + 1 + min(r, p-1-r) chunks (planner.cost.bitpipe).

The fallback list schedule (m not a multiple of p) runs the ranks at the generation times (a
chunk's F = 1, B = 2) and lets each rank, whenever it is free, pick among the actions whose
inputs are there:

1. a backward if any (oldest micro-batch first, then the later stage), as 1F1B does, so
   activations are freed as soon as possible;
2. else a forward (oldest micro-batch first, the two pipelines' micro-batches alternating,
   then the later stage), if the rank holds fewer than ``cap`` chunk activations or the
   forward continues a micro-batch the rank already holds (the V's turn: without it two ranks
   full of each other's micro-batches would wait on each other).

It is built with cap 2p and with cap 3p and the one with the smaller makespan at the
generation times is kept (ties: 2p); its peaks stay within 3p + p/2 + 1 chunks.  Because its
lists are the order of a real run, they are valid under any durations.  Unit-time makespans:
p=4, m=6: 49; p=8, m=12: 106; p=8, m=20: 146.  ``bitpipe(p, m, cap=...)`` builds it for any
even m (the tests compare the two).
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


def paper_order_applies(p: int, m: int) -> bool:
    """Whether ``bitpipe(p, m)`` is the authors' order: their runtime takes m a multiple of p
    (units of p/2 micro-batches per pipeline); other even m get the list schedule."""
    return check_knobs(p, m) is None and m % p == 0


def _unit(p: int, r: int, legs: tuple[int, int]) -> list[tuple[int, int, int]]:
    """One unit's order on rank ``r`` as (pipeline, leg, i): i-th micro-batch of the unit in
    that pipeline, ``legs`` = (the leg met first, the other); forwards meet leg 0 first,
    backwards leg 1.  The rank's "own" pipeline is the one whose entry rank is nearer (down for
    r < p/2); ``lead`` own micro-batches go before the other pipeline's first one arrives."""
    h = p // 2
    own = 0 if r < h else 1
    other = 1 - own
    lead = h - min(r, p - 1 - r)
    first, second = legs
    out = [(own, first, i) for i in range(lead)]
    for i in range(h - lead):
        out += [(other, first, i), (own, first, i + lead)]
    for i in range(lead):
        out += [(other, first, i + h - lead), (other, second, i)]
    for i in range(h - lead):
        out += [(own, second, i), (other, second, i + lead)]
    out += [(own, second, i + h - lead) for i in range(lead)]
    return out


def _paper_ranks(sched: Schedule) -> tuple[tuple[Action, ...], ...]:
    """The authors' per-rank order (module docstring): each rank's forwards and backwards, unit
    by unit, merged by the warm-up / steady / concatenation pattern of their runtime."""
    p, m = sched.num_ranks, sched.num_micro_batches
    h, units = p // 2, m // p

    def actions(r: int, kind: str, legs: tuple[int, int]) -> list[Action]:
        return [Action(kind, 2 * pipe + leg, sched.pipelines[pipe][j * h + i])
                for j in range(units) for pipe, leg, i in _unit(p, r, legs)]

    out = []
    for r in range(p):
        fwd, bwd = iter(actions(r, "F", (0, 1))), iter(actions(r, "B", (1, 0)))
        warm = 3 * h + min(r, p - 1 - r)       # forwards before the first backward
        steady = 2 * p - warm                  # F-B pairs before a unit's backwards run on
        pattern = "F" * warm
        for _ in range(units - 1):            # the next unit's forwards fill this one's drain
            pattern += "FB" * steady + "B" * (warm - steady + 1) + "FB" * (steady - 1) + "F" * (warm - steady + 1)
        pattern += "FB" * steady
        pattern += "B" * (2 * m - pattern.count("B"))
        out.append(tuple(next(fwd if k == "F" else bwd) for k in pattern))
    return tuple(out)


LIST_ORDER_NAME = "bitpipe (list order)"   # the fallback's Schedule.name; the authors' order is "bitpipe"
CAPS_PER_RANK = (2, 3)   # the caps tried, in chunk activations per rank, times p


def _generation_makespan(ranks: tuple[tuple[Action, ...], ...], sched: Schedule) -> float:
    from planner.simulate.actions import execute

    run = execute(replace(sched, ranks=ranks), StageTimes(forward_s=GEN_FORWARD_S, backward_s=GEN_BACKWARD_S),
                  check=False)
    return run.makespan_s


def bitpipe(p: int, m: int, v: int = 4, cap: int | None = None) -> Schedule:
    """The BitPipe action lists (module docstring): the authors' order where m is a multiple
    of p, else the list schedule, which ``cap`` (chunk activations per rank) also asks for;
    ``v`` must be 4 (chunks per rank)."""
    if v != 4:
        raise ScheduleError(f"bitpipe runs 4 chunks per rank (2 per pipeline), not {v}")
    problem = check_knobs(p, m)
    if problem:
        raise ScheduleError(problem)
    if cap is not None and cap < 1:
        raise ScheduleError(f"bitpipe's cap on chunk activations per rank must be >= 1, not {cap}")
    shell = Schedule("bitpipe", p, 4, m, "bitpipe", tuple(() for _ in range(p)), pipelines(m))
    if cap is None and paper_order_applies(p, m):
        return replace(shell, ranks=_paper_ranks(shell))
    # the name says which order a timeline or trace shows
    shell = replace(shell, name=LIST_ORDER_NAME)
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
