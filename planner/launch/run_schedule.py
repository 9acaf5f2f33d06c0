"""What the reference runner executes: a plan's pipeline schedule as action lists
(``planner.simulate.actions.Schedule``), and the model cut into that schedule's stages.

Torch-free (the parent process checks plans without importing torch).

Where the lists come from is a registry, ``SOURCES``, tried in order: a source returns the
plan's ``Schedule`` or None.  ``stored`` reads a plan's own
``pipeline_actions`` (a latency-aware schedule); ``generated`` is ``actions.generate(plan.schedule,
stages, micro-batches, virtual_stages)``, so every name the generators know (gpipe, 1f1b,
interleaved-1f1b, zb-h1, zb-v, dualpipev, and whatever is added to ``actions.GENERATORS``) runs
with no change here or in the worker.  BitPipe's two-pipeline map is refused by
``runner.check_plan`` (its duplicated weights need a pair all-reduce the worker lacks).  ``run_plan(..., schedule=...)`` overrides all of them.
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
    return generate(plan.schedule, plan.num_stages, plan.num_micro_batches, plan.virtual_stages)


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
    covers ``virtual_stages``; an override may ask for other chunk counts)."""
    if sched.chunks == plan.virtual_stages:
        return []
    return [f"stages[{s.index}].blocks: {s.num_blocks} blocks do not split into the schedule's "
            f"{sched.chunks} chunks" for s in plan.stages if s.num_blocks % sched.chunks]


def model_chunks(plan: Plan, sched: Schedule) -> list[dict]:
    """The model's pieces in pipeline order: entry ``k`` is global stage ``k`` of ``sched``, held
    by plan stage ``owner(k)``.  With one chunk per stage a stage is its blocks.  With ``v``
    chunks each stage keeps its block *count*, cut into ``v`` equal chunks, and the model's
    blocks are dealt out along the global stages: on the loop map that is Megatron-LM's
    interleaved layout (``planner.launch.common.chunks``), on the v map stage ``r`` holds the
    ``r``-th piece and the ``(2p-1-r)``-th.  The embedding goes with global stage 0 and the head
    with the last one (on the v map both on plan stage 0)."""
    v = sched.chunks
    if v == 1:
        return [{"stage": s.index, "chunk": 0, "blocks": list(s.blocks), "embedding": s.embedding,
                 "head": s.head} for s in plan.stages]
    out, first, last = [], 0, sched.num_stages - 1
    for k in range(sched.num_stages):
        rank, chunk = sched.owner(k)
        size = plan.stages[rank].num_blocks // v
        out.append({"stage": rank, "chunk": chunk, "blocks": [first, first + size],
                    "embedding": k == 0, "head": k == last})
        first += size
    return out


def peak_in_flight(sched: Schedule) -> list[float]:
    """Per rank, the most micro-batches whose activations it holds at once, in whole-stage
    units: a (chunk, micro-batch) counts ``1 / chunks`` from its F until its B or W (the runner
    keeps a micro-batch's graph until its W)."""
    out = []
    for acts in sched.ranks:
        held = top = 0
        for a in acts:
            held += 1 if a.kind == "F" else -1 if a.kind in ("B", "W") else 0
            top = max(top, held)
        out.append(top / sched.chunks)
    return out


def schedule_to_json(sched: Schedule) -> dict:
    return {"name": sched.name, "num_ranks": sched.num_ranks, "chunks": sched.chunks,
            "num_micro_batches": sched.num_micro_batches, "stage_map": sched.stage_map,
            "ranks": [[[a.kind, a.chunk, a.micro_batch] for a in acts] for acts in sched.ranks]}


def schedule_from_json(data: dict) -> Schedule:
    ranks = tuple(tuple(Action(k, c, m) for k, c, m in acts) for acts in data["ranks"])
    return Schedule(data["name"], data["num_ranks"], data["chunks"], data["num_micro_batches"],
                    data["stage_map"], ranks)
