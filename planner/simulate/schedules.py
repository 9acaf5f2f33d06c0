"""The order in which each pipeline stage runs its forward and backward passes.

An op is ``(kind, chunk, micro_batch)`` with kind ``"fwd"`` or ``"bwd"``; ``chunk`` is the
model chunk on that stage (always 0 unless the schedule is interleaved).  These orders are
what Megatron-LM's schedules do (``megatron/core/pipeline_parallel/schedules.py``), written
down from its documented behaviour:

- GPipe: every forward, then every backward, both in micro-batch order.
- 1F1B (PipeDream-Flush): stage ``s`` of ``p`` runs ``min(p - s - 1, m)`` warm-up forwards,
  then alternates one forward and one backward, then drains the remaining backwards.
- Interleaved 1F1B: each stage holds ``v`` chunks; virtual stage ``c * p + s`` is chunk ``c``
  of stage ``s``.  Micro-batches go in groups of ``p``: for each group, chunk 0 of all of them,
  then chunk 1, and so on (backwards walk the chunks in reverse).  Warm-up is
  ``(p - s - 1) * 2 + (v - 1) * p`` forwards.  Like Megatron, ``m`` must be a multiple of
  ``p``: with a shorter last group these fixed orders can deadlock.
"""

from __future__ import annotations

Op = tuple[str, int, int]

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


def gpipe(stage: int, num_stages: int, num_micro_batches: int) -> list[Op]:
    m = num_micro_batches
    return [("fwd", 0, i) for i in range(m)] + [("bwd", 0, i) for i in range(m)]


def one_f_one_b(stage: int, num_stages: int, num_micro_batches: int) -> list[Op]:
    m = num_micro_batches
    warmup = min(num_stages - stage - 1, m)
    ops: list[Op] = [("fwd", 0, i) for i in range(warmup)]
    for i in range(m - warmup):
        ops.append(("fwd", 0, warmup + i))
        ops.append(("bwd", 0, i))
    ops.extend(("bwd", 0, i) for i in range(m - warmup, m))
    return ops


def _chunk_order(num_stages: int, num_micro_batches: int, chunks: list[int]) -> list[tuple[int, int]]:
    order = []
    for first in range(0, num_micro_batches, num_stages):
        group = range(first, min(first + num_stages, num_micro_batches))
        for c in chunks:
            order.extend((c, mb) for mb in group)
    return order


def interleaved(stage: int, num_stages: int, num_micro_batches: int, virtual_stages: int) -> list[Op]:
    p, v = num_stages, virtual_stages
    forwards = _chunk_order(p, num_micro_batches, list(range(v)))
    backwards = _chunk_order(p, num_micro_batches, list(reversed(range(v))))
    total = len(forwards)
    warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    ops: list[Op] = [("fwd", c, mb) for c, mb in forwards[:warmup]]
    for i in range(total - warmup):
        c, mb = forwards[warmup + i]
        ops.append(("fwd", c, mb))
        c, mb = backwards[i]
        ops.append(("bwd", c, mb))
    ops.extend(("bwd", c, mb) for c, mb in backwards[total - warmup:])
    return ops


def stage_orders(schedule: str, num_stages: int, num_micro_batches: int,
                 virtual_stages: int = 1) -> list[list[Op]]:
    """The op order of every stage; ValueError on an unknown schedule or bad knobs."""
    if num_stages < 1 or num_micro_batches < 1 or virtual_stages < 1:
        raise ValueError("stages, micro-batches and virtual stages must be at least 1")
    if schedule == "interleaved-1f1b":
        if virtual_stages < 2:
            raise ValueError("interleaved-1f1b needs virtual_stages >= 2")
        if num_micro_batches % num_stages:
            raise ValueError(f"interleaved-1f1b needs num_micro_batches ({num_micro_batches}) to be "
                             f"a multiple of the number of stages ({num_stages})")
        return [interleaved(s, num_stages, num_micro_batches, virtual_stages) for s in range(num_stages)]
    if virtual_stages != 1:
        raise ValueError(f"virtual_stages > 1 needs the interleaved-1f1b schedule, not {schedule!r}")
    if schedule == "gpipe":
        return [gpipe(s, num_stages, num_micro_batches) for s in range(num_stages)]
    if schedule == "1f1b":
        return [one_f_one_b(s, num_stages, num_micro_batches) for s in range(num_stages)]
    raise ValueError(f"unknown schedule {schedule!r}; one of {', '.join(SCHEDULES)}")
