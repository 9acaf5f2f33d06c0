"""What the reference runner executes: a plan's pipeline schedule as action lists
(``planner.simulate.actions.Schedule``), and the model cut into that schedule's stages.

Torch-free (the parent process checks plans without importing torch).

Where the lists come from is a registry, ``SOURCES``, tried in order: a source returns the
plan's ``Schedule`` or None.  ``stored`` reads a plan's own
``pipeline_actions`` (a latency-aware schedule); ``generated`` is ``actions.generate(plan.schedule,
stages, micro-batches, virtual_stages)``, so every name the generators know (gpipe, 1f1b,
interleaved-1f1b, zb-h1, zb-v, dualpipev, and whatever is added to ``actions.GENERATORS``) runs
with no change here or in the worker.  BitPipe's two pipelines (stage map ``bitpipe``) run
too: ``model_chunks`` lists the stages of both pipelines, and ranks r and p-1-r all-reduce the
two weight copies' gradients (``planner.launch.bitpipe_worker``).  ``run_plan(...,
schedule=...)`` overrides all of them.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.plan import Plan
from planner.simulate.actions import Action, Schedule, ScheduleError, generate, validate


def stored(plan: Plan) -> Schedule | None:
    """The plan's own ``pipeline_actions`` (a latency-aware schedule), where it has them."""
    if not plan.pipeline_actions:
        return None
    from planner.simulate.latency_plan import plan_schedule as from_plan

    return from_plan(plan)


def generated(plan: Plan) -> Schedule:
    # A bitpipe plan keeps virtual_stages = 1 (its generator cuts each stage into the V's
    # chunks itself), so its generator takes its own chunk count.
    chunks = None if plan.schedule == "bitpipe" else plan.virtual_stages
    return generate(plan.schedule, plan.num_stages, plan.num_micro_batches, chunks)


SOURCES: list[Callable[[Plan], Schedule | None]] = [stored, generated]


def plan_schedule(plan: Plan, override: Schedule | None = None) -> Schedule:
    """The validated action lists the runner follows for ``plan``; ``ScheduleError`` says why not."""
    sched = override
    for source in ([] if override is not None else SOURCES):
        sched = source(plan)
        if sched is not None:
            break
    if sched is None:
        raise ScheduleError(f"no action lists for schedule {plan.schedule!r}")
    if sched.num_ranks != plan.num_stages:
        raise ScheduleError(f"{sched.name}: {sched.num_ranks} action lists for the plan's "
                            f"{plan.num_stages} stages")
    if sched.num_micro_batches != plan.num_micro_batches:
        raise ScheduleError(f"{sched.name}: {sched.num_micro_batches} micro-batches, the plan has "
                            f"{plan.num_micro_batches}")
    validate(sched)
    return sched


def chunk_problems(plan: Plan, sched: Schedule) -> list[str]:
    """Stages whose block count does not cut into the schedule's chunks (the plan's own check
    covers ``virtual_stages``; an override may ask for other chunk counts).  On a map with
    several pipelines a stage is cut into ``chunks_per_pipeline`` pieces, one per chunk of a
    pipeline; the rank's other pipelines hold copies of other stages' pieces."""
    per_pipe = chunks_per_pipeline(sched)
    if per_pipe == plan.virtual_stages and sched.num_pipelines == 1:
        return []
    return [f"stages[{s.index}].blocks: {s.num_blocks} blocks do not split into the schedule's "
            f"{per_pipe} chunks per pipeline" for s in plan.stages if s.num_blocks % per_pipe]


def chunks_per_pipeline(sched: Schedule) -> int:
    return sched.chunks // sched.num_pipelines


def weight_stages(sched: Schedule, rank: int) -> tuple[int, ...]:
    """The plan stages whose blocks ``rank`` holds a copy of: its own, and on the bitpipe map
    also its mirror ``p - 1 - rank``'s (the up pipeline runs them there)."""
    return tuple(sorted({sched.owner(sched.stage(rank, c), 0)[0] for c in range(sched.chunks)}))


def model_chunks(plan: Plan, sched: Schedule) -> list[dict]:
    """The model's pieces in pipeline order: entry ``k`` is global stage ``k`` of ``sched``, held
    by plan stage ``owner(k)``.  With one chunk per stage a stage is its blocks.  With ``v``
    chunks each stage keeps its block *count*, cut into ``v`` equal chunks, and the model's
    blocks are dealt out along the global stages: on the loop map that is Megatron-LM's
    interleaved layout (``planner.launch.common.chunks``), on the v map stage ``r`` holds the
    ``r``-th piece and the ``(2p-1-r)``-th.  The embedding goes with global stage 0 and the head
    with the last one (on the v map both on plan stage 0).

    With several pipelines (bitpipe) the list has one entry per slot, ``pipe * num_stages +
    stage``: every pipeline cuts the model the same way (the first pipeline's cut, which on the
    bitpipe map gives stage ``r`` its own blocks), and an entry's ``stage`` is the plan stage
    that runs that pipeline's stage, so the same blocks appear on two ranks."""
    if sched.num_pipelines > 1:
        first = model_chunks_of_pipe(plan, sched, 0)
        return [dict(c, stage=sched.owner(k, mb)[0], chunk=sched.owner(k, mb)[1])
                for pipe in sched.pipelines for mb in pipe[:1] for k, c in enumerate(first)]
    return model_chunks_of_pipe(plan, sched, 0)


def model_chunks_of_pipe(plan: Plan, sched: Schedule, micro_batch: int) -> list[dict]:
    """``model_chunks`` for the pipeline ``micro_batch`` runs through."""
    v = chunks_per_pipeline(sched)
    if v == 1:
        return [{"stage": s.index, "chunk": 0, "blocks": list(s.blocks), "embedding": s.embedding,
                 "head": s.head} for s in plan.stages]
    out, first, last = [], 0, sched.num_stages - 1
    for k in range(sched.num_stages):
        rank, chunk = sched.owner(k, micro_batch)
        size = plan.stages[rank].num_blocks // v
        out.append({"stage": rank, "chunk": chunk, "blocks": [first, first + size],
                    "embedding": k == 0, "head": k == last})
        first += size
    return out


def peak_in_flight(sched: Schedule) -> list[float]:
    """Per rank, the most micro-batches whose activations it holds at once, in whole-stage
    units: a (chunk, micro-batch) counts ``1 / chunks`` from its F until its B or W (the runner
    keeps a micro-batch's graph until its W); with several pipelines a chunk is ``1 / chunks``
    of a pipeline's share, so it counts ``num_pipelines / chunks`` (on the bitpipe map half a
    stage: the rank's own, or in the up pipeline its mirror's)."""
    out = []
    for acts in sched.ranks:
        held = top = 0
        for a in acts:
            held += 1 if a.kind == "F" else -1 if a.kind in ("B", "W") else 0
            top = max(top, held)
        out.append(top / chunks_per_pipeline(sched))
    return out


def schedule_to_json(sched: Schedule) -> dict:
    return {"name": sched.name, "num_ranks": sched.num_ranks, "chunks": sched.chunks,
            "num_micro_batches": sched.num_micro_batches, "stage_map": sched.stage_map,
            "ranks": [[[a.kind, a.chunk, a.micro_batch] for a in acts] for acts in sched.ranks],
            "pipelines": [list(pipe) for pipe in sched.pipelines]}


def schedule_from_json(data: dict) -> Schedule:
    ranks = tuple(tuple(Action(k, c, m) for k, c, m in acts) for acts in data["ranks"])
    return Schedule(data["name"], data["num_ranks"], data["chunks"], data["num_micro_batches"],
                    data["stage_map"], ranks, tuple(tuple(p) for p in data.get("pipelines", ())))
