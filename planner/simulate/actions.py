"""Pipeline schedules as per-rank action lists (the executor that runs them: executor.py).

This is the first step of issue 17: the schedule becomes data.  A ``Schedule`` is, for each of
``num_ranks`` ranks, the ordered list of actions that rank runs; an action is

- ``F``: forward of one stage chunk on one micro-batch,
- ``B``: full backward (input and weight gradients together),
- ``I``: backward with respect to the input only (the gradient the previous stage waits on),
- ``W``: backward with respect to the weights only (nobody waits on it; it can be deferred),

on ``(chunk, micro_batch)``, where ``chunk`` is the rank-local model chunk.  Which global
stage a chunk is comes from the stage-to-rank map:

- ``loop`` (Megatron's interleaving): chunk ``c`` of rank ``r`` is stage ``c * p + r``;
- ``v`` (the V shape of ZB-V / DualPipeV, two chunks per rank): chunk 0 of rank ``r`` is stage
  ``r``, chunk 1 is stage ``2p - 1 - r``, so the last rank holds the two middle stages and the
  first rank the first and the last.

``validate`` checks a schedule: every (stage, micro-batch) has exactly one F and either one B
or one I and one W, and the lists can run to the end under the data dependencies
F(s, m) after F(s-1, m); B/I(s, m) after F(s, m) and B/I(s+1, m); W(s, m) after I(s, m).

``GENERATORS`` holds the named schedules (``generate(name, p, m, v)``).  ``gpipe``, ``1f1b`` and
``interleaved-1f1b`` are ``planner.simulate.schedules.stage_orders`` written as actions (one
source of truth for the orders the closed forms and the plan-level simulator use); ``zb-h1``
is Qi et al. 2024's handcrafted ZB-H1, in the order torch's ``ScheduleInterleavedZeroBubble``
gives with one stage per rank (tests/test_simulate_actions.py compares them).

The executor (``execute``, ``StageTimes``, ``Execution``) lives in planner/simulate/executor.py
and is reachable from here too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.simulate import layouts

STAGE_MAPS = layouts.STAGE_MAPS

KINDS = ("F", "B", "I", "W")


class ScheduleError(ValueError):
    """An action list that is malformed or cannot run (missing, duplicated or deadlocked actions)."""


@dataclass(frozen=True, order=True)
class Action:
    kind: str          # F, B, I or W
    chunk: int         # rank-local chunk index
    micro_batch: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ScheduleError(f"action kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    def __str__(self) -> str:
        return f"{self.kind}{self.chunk}.{self.micro_batch}"


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered action lists with the stage-to-rank map (planner.simulate.layouts).

    ``pipelines`` lists, for a map with more than one pipeline (``bitpipe``), the micro-batches
    each pipeline carries (a partition of 0 .. m-1); empty means every micro-batch goes through
    the one pipeline.  Dependencies link the stages of a micro-batch's own pipeline."""

    name: str
    num_ranks: int
    chunks: int
    num_micro_batches: int
    stage_map: str
    ranks: tuple[tuple[Action, ...], ...]
    pipelines: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.num_ranks < 1 or self.chunks < 1 or self.num_micro_batches < 1:
            raise ScheduleError("ranks, chunks and micro-batches must be at least 1")
        problem = layouts.check_map(self.stage_map, self.num_ranks, self.chunks)
        if problem:
            raise ScheduleError(problem)
        if len(self.ranks) != self.num_ranks:
            raise ScheduleError(f"{len(self.ranks)} action lists for {self.num_ranks} ranks")
        n = layouts.num_pipelines(self.stage_map)
        if n > 1 or self.pipelines:
            carried = sorted(mb for pipe in self.pipelines for mb in pipe)
            if len(self.pipelines) != n or carried != list(range(self.num_micro_batches)):
                raise ScheduleError(f"the {self.stage_map} map needs its {n} pipelines' micro-batches, "
                                    f"together 0..{self.num_micro_batches - 1} once each; got "
                                    f"{[list(pipe) for pipe in self.pipelines]}")
        pipe_of = {mb: i for i, pipe in enumerate(self.pipelines) for mb in pipe}
        object.__setattr__(self, "_pipe_of", pipe_of)

    @property
    def num_stages(self) -> int:
        """Stages of one pipeline."""
        return layouts.num_stages(self.stage_map, self.num_ranks, self.chunks)

    @property
    def num_pipelines(self) -> int:
        return layouts.num_pipelines(self.stage_map)

    @property
    def num_slots(self) -> int:
        """(pipeline, stage) pairs; per-stage times are indexed ``pipe * num_stages + stage``."""
        return self.num_pipelines * self.num_stages

    def pipe_of(self, micro_batch: int) -> int:
        """The pipeline ``micro_batch`` runs through."""
        return self._pipe_of.get(micro_batch, 0)

    def pipe(self, rank: int, chunk: int) -> int:
        return layouts.locate(self.stage_map, self.num_ranks, rank, chunk)[0]

    def stage(self, rank: int, chunk: int) -> int:
        """The stage (of its pipeline) of ``chunk`` on ``rank``."""
        return layouts.locate(self.stage_map, self.num_ranks, rank, chunk)[1]

    def owner(self, stage: int, micro_batch: int = 0) -> tuple[int, int]:
        """(rank, chunk) holding ``stage`` of the pipeline ``micro_batch`` runs through."""
        return layouts.owner(self.stage_map, self.num_ranks, self.pipe_of(micro_batch), stage)

    def slot(self, rank: int, chunk: int) -> int:
        pipe, stage = layouts.locate(self.stage_map, self.num_ranks, rank, chunk)
        return pipe * self.num_stages + stage

    def table(self) -> list[list[str]]:
        """Per rank, the actions as ``<stage><kind><micro-batch>`` strings (torch's notation)."""
        return [[f"{self.stage(r, a.chunk)}{a.kind}{a.micro_batch}" for a in acts]
                for r, acts in enumerate(self.ranks)]


# --------------------------------------------------------------------------- dependencies

def _deps(sched: Schedule, stage: int, a: Action) -> list[tuple[str, int, int]]:
    """The (kind, stage, micro-batch) keys ``a`` waits on; "G" is the input gradient (B or I)."""
    mb, last = a.micro_batch, sched.num_stages - 1
    if a.kind == "F":
        return [("F", stage - 1, mb)] if stage > 0 else []
    if a.kind in ("B", "I"):
        out = [("F", stage, mb)]
        if stage < last:
            out.append(("G", stage + 1, mb))
        return out
    return [("I", stage, mb)]


def _keys(a: Action, stage: int) -> list[tuple[str, int, int]]:
    """The keys an action completes."""
    if a.kind == "B":
        return [("G", stage, a.micro_batch), ("B", stage, a.micro_batch)]
    if a.kind == "I":
        return [("G", stage, a.micro_batch), ("I", stage, a.micro_batch)]
    return [(a.kind, stage, a.micro_batch)]


def validate(sched: Schedule) -> None:
    """Raise ``ScheduleError`` unless every (stage, micro-batch) has exactly one F and one B or
    one I and one W, and the lists run to the end under the data dependencies."""
    S, m = sched.num_stages, sched.num_micro_batches
    seen: dict[tuple[str, int, int], int] = {}
    for r, acts in enumerate(sched.ranks):
        for a in acts:
            if not 0 <= a.chunk < sched.chunks:
                raise ScheduleError(f"rank {r}: {a} names chunk {a.chunk}; chunks are 0..{sched.chunks - 1}")
            if not 0 <= a.micro_batch < m:
                raise ScheduleError(f"rank {r}: {a} names micro-batch {a.micro_batch}; there are {m}")
            if sched.pipe(r, a.chunk) != sched.pipe_of(a.micro_batch):
                raise ScheduleError(
                    f"rank {r}: {a} runs micro-batch {a.micro_batch} (pipeline "
                    f"{layouts.pipeline_name(sched.stage_map, sched.pipe_of(a.micro_batch))}) on a chunk of "
                    f"pipeline {layouts.pipeline_name(sched.stage_map, sched.pipe(r, a.chunk))}")
            key = (a.kind, sched.stage(r, a.chunk), a.micro_batch)
            if key in seen:
                raise ScheduleError(f"rank {r}: {a} (stage {key[1]}) appears twice")
            seen[key] = r
    for s in range(S):
        for mb in range(m):
            has = {k for k in KINDS if (k, s, mb) in seen}
            where = f"stage {s} (rank {sched.owner(s, mb)[0]}), micro-batch {mb}"
            if "F" not in has:
                raise ScheduleError(f"{where}: no F")
            if "B" in has and has & {"I", "W"}:
                raise ScheduleError(f"{where}: both B and I/W")
            if "B" not in has and not {"I", "W"} <= has:
                missing = "B" if not has & {"I", "W"} else ("W" if "I" in has else "I")
                raise ScheduleError(f"{where}: no {missing}")
    # Dependencies: run the lists with zero durations; a rank stuck on an input is a deadlock.
    done: set[tuple[str, int, int]] = set()
    pos = [0] * sched.num_ranks
    progress = True
    while progress:
        progress = False
        for r, acts in enumerate(sched.ranks):
            while pos[r] < len(acts):
                a = acts[pos[r]]
                s = sched.stage(r, a.chunk)
                if not all(d in done for d in _deps(sched, s, a)):
                    break
                done.update(_keys(a, s))
                pos[r] += 1
                progress = True
    stuck = [(r, sched.ranks[r][pos[r]]) for r in range(sched.num_ranks) if pos[r] < len(sched.ranks[r])]
    if stuck:
        waits = "; ".join(f"rank {r} waits at {a} (stage {sched.stage(r, a.chunk)})" for r, a in stuck)
        raise ScheduleError(f"{sched.name}: the action lists deadlock: {waits}")


# --------------------------------------------------------------------------- generators

def _from_ops(name: str, p: int, m: int, v: int, orders) -> Schedule:
    kind = {"fwd": "F", "bwd": "B"}
    ranks = tuple(tuple(Action(kind[k], c, mb) for k, c, mb in ops) for ops in orders)
    return Schedule(name, p, v, m, "loop", ranks)


def _need_one_chunk(name: str, v: int) -> None:
    if v != 1:
        raise ScheduleError(f"{name} runs one chunk per rank, not {v}")


def gpipe(p: int, m: int, v: int = 1) -> Schedule:
    from planner.simulate.schedules import stage_orders

    _need_one_chunk("gpipe", v)
    return _from_ops("gpipe", p, m, 1, stage_orders("gpipe", p, m))


def one_f_one_b(p: int, m: int, v: int = 1) -> Schedule:
    from planner.simulate.schedules import stage_orders

    _need_one_chunk("1f1b", v)
    return _from_ops("1f1b", p, m, 1, stage_orders("1f1b", p, m))


def interleaved_1f1b(p: int, m: int, v: int = 2) -> Schedule:
    from planner.simulate.schedules import stage_orders

    try:
        orders = stage_orders("interleaved-1f1b", p, m, v)
    except ValueError as e:
        raise ScheduleError(str(e)) from None
    return _from_ops("interleaved-1f1b", p, m, v, orders)


def zb_h1(p: int, m: int, v: int = 1) -> Schedule:
    """ZB-H1 (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §3.1).

    1F1B with each B split into I and W: rank ``r`` runs ``min(p - 1 - r, m)`` warm-up forwards,
    then F / I pairs, then the remaining I's, as 1F1B runs F / B; the W of micro-batch ``j``
    follows the I of micro-batch ``j + r``, and the last ``min(r, m)`` W's close the list.  So
    the last rank, which would idle while the input gradients walk back to rank 0, fills that
    cool-down with its deferred W's, and rank 0 defers none.

    At F = I = W = 1 (B = 2) the makespan is m (F + I + W) + (p - 1)(F + I - W): for p = 4,
    m = 8, 24 + 3 = 27 against 1F1B's 33.  Memory: a micro-batch is in flight from F until W
    (a split backward keeps its saved tensors through I: planner.cost.memory), so rank ``r``
    holds up to ``min(m, p)`` micro-batches, the same peak as 1F1B's rank 0 (the paper's "same
    peak memory as 1F1B" is over ranks), and ``min(m, r + 1)`` of them also hold their weight
    ops' input gradients (``deferred_w_micro_batches``).
    """
    _need_one_chunk("zb-h1", v)
    ranks = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        acts: list[Action] = [Action("F", 0, i) for i in range(warmup)]
        for j in range(m):  # the j-th input gradient, with the forward that precedes it in 1F1B
            if warmup + j < m:
                acts.append(Action("F", 0, warmup + j))
            acts.append(Action("I", 0, j))
            if j >= r:  # the W of micro-batch j - r follows the I of micro-batch j
                acts.append(Action("W", 0, j - r))
        acts.extend(Action("W", 0, j) for j in range(max(0, m - r), m))
        ranks.append(tuple(acts))
    return Schedule("zb-h1", p, 1, m, "loop", tuple(ranks))


def _zbv(p: int, m: int, v: int = 2) -> Schedule:
    from planner.simulate.zero_bubble import zb_v

    return zb_v(p, m, v)


def _dualpipev(p: int, m: int, v: int = 2) -> Schedule:
    from planner.simulate.zero_bubble import dualpipev

    return dualpipev(p, m, v)
def _bitpipe(p: int, m: int, v: int = 4) -> Schedule:
    from planner.simulate.bitpipe import bitpipe

    return bitpipe(p, m, v)


@dataclass(frozen=True)
class Generator:
    name: str
    help: str
    build: Callable[[int, int, int], Schedule]
    default_chunks: int = 1


GENERATORS: dict[str, Generator] = {g.name: g for g in (
    Generator("gpipe", "GPipe (Huang et al. 2019): every forward, then every backward; holds all m "
                       "micro-batches' activations.", gpipe),
    Generator("1f1b", "1F1B / PipeDream-Flush (Narayanan et al. SC21): p - 1 - r warm-up forwards on "
                      "rank r, then one forward, one backward; at most p - r micro-batches in flight.",
              one_f_one_b),
    Generator("interleaved-1f1b", "Megatron-LM's interleaved 1F1B: v chunks per rank on the loop map "
                                  "(chunk c of rank r is stage c*p + r), micro-batches in groups of p; "
                                  "needs v >= 2 and m a multiple of p, as Megatron does.",
              interleaved_1f1b, 2),
    Generator("zb-h1", "ZB-H1 (Qi et al. 2024): 1F1B with B split into I and W, rank r deferring r W's "
                       "into the cool-down; bubble (p-1)(F+I-W) instead of (p-1)(F+B).", zb_h1),
    Generator("zb-v", "ZB-V (Qi et al. 2024): two chunks per rank in a V, F / I / W interleaved so "
                      "that at F = I = W the bubble nearly vanishes; 1F1B's peak activations.", _zbv, 2),
    Generator("dualpipev", "DualPipeV (DeepSeek-V3's DualPipe cut into a V, torch's ScheduleDualPipeV): "
                           "two chunks per rank, forward-backward pairs; needs m >= 2p.", _dualpipev, 2),
    Generator("bitpipe", "BitPipe (Wu et al. 2024): two V-shaped interleaved pipelines in opposite "
                         "directions over p ranks (p even, m even; 4 chunks per rank), the authors' order for m "
                         "a multiple of p, a list order otherwise (planner.simulate.bitpipe).", _bitpipe, 4),
)}


def generate(name: str, num_ranks: int, num_micro_batches: int, chunks: int | None = None) -> Schedule:
    """The named schedule's action lists (validated); ``ScheduleError`` on unknown names or bad knobs."""
    gen = GENERATORS.get(name)
    if gen is None:
        raise ScheduleError(f"unknown schedule {name!r}; one of {', '.join(GENERATORS)}")
    if num_ranks < 1 or num_micro_batches < 1:
        raise ScheduleError("ranks and micro-batches must be at least 1")
    sched = gen.build(num_ranks, num_micro_batches, gen.default_chunks if chunks is None else chunks)
    validate(sched)
    return sched


# the executor's names, from where they were first defined (imported on first use: executor.py
# imports this module)
_EXECUTOR = ("StageTimes", "stage_times_from_ranks", "ActionRun", "Execution", "FixedSends", "execute")


def __getattr__(name: str):
    if name in _EXECUTOR:
        from planner.simulate import executor
        return getattr(executor, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
