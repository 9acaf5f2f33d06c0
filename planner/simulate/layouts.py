"""Stage-to-rank maps of the action-list engine (planner.simulate.actions).

A map says, for each rank-local chunk, which pipeline it belongs to and which stage of that
pipeline it is, and back.  Every pipeline has the same ``num_stages`` stages 0 .. S-1 (the
model cut into S pieces); a schedule with more than one pipeline runs each micro-batch through
one of them (``Schedule.pipelines`` says which micro-batches each carries).

- ``loop`` (Megatron's interleaving), one pipeline: chunk ``c`` of rank ``r`` is stage
  ``c * p + r``;
- ``v`` (ZB-V / DualPipeV), one pipeline, two chunks: chunk 0 of rank ``r`` is stage ``r``,
  chunk 1 is stage ``2p - 1 - r`` (the last rank holds the two middle stages);
- ``bitpipe`` (Wu et al. 2024), two V-shaped pipelines in opposite directions, four chunks:
  chunks 0 and 1 are the "down" pipeline's V (stages ``r`` and ``2p - 1 - r``), chunks 2 and 3
  the "up" pipeline's, which is the down V mirrored: rank ``r`` holds there the stages rank
  ``p - 1 - r`` holds in the down pipeline (``p - 1 - r`` and ``p + r``).  So ranks ``r`` and
  ``p - 1 - r`` hold the same four stages' weights, once per pipeline.
"""

from __future__ import annotations

STAGE_MAPS = ("loop", "v", "bitpipe")
PIPELINE_NAMES = {"bitpipe": ("down", "up")}


def check_map(stage_map: str, num_ranks: int, chunks: int) -> str | None:
    """Why ``stage_map`` cannot hold ``chunks`` chunks per rank, or None."""
    if stage_map not in STAGE_MAPS:
        return f"stage map must be one of {', '.join(STAGE_MAPS)}, got {stage_map!r}"
    if stage_map == "v" and chunks != 2:
        return f"the v stage map needs exactly 2 chunks per rank, got {chunks}"
    if stage_map == "bitpipe" and chunks != 4:
        return f"the bitpipe stage map needs exactly 4 chunks per rank (2 per pipeline), got {chunks}"
    return None


def num_pipelines(stage_map: str) -> int:
    return 2 if stage_map == "bitpipe" else 1


def num_stages(stage_map: str, num_ranks: int, chunks: int) -> int:
    """Stages of one pipeline."""
    return 2 * num_ranks if stage_map == "bitpipe" else num_ranks * chunks


def pipeline_name(stage_map: str, pipe: int) -> str:
    names = PIPELINE_NAMES.get(stage_map)
    return names[pipe] if names else str(pipe)


def locate(stage_map: str, num_ranks: int, rank: int, chunk: int) -> tuple[int, int]:
    """(pipeline, stage) of ``chunk`` on ``rank``."""
    p = num_ranks
    if stage_map == "bitpipe":
        pipe, half = divmod(chunk, 2)
        q = rank if pipe == 0 else p - 1 - rank      # the rank's place in the down V
        return pipe, (q if half == 0 else 2 * p - 1 - q)
    if stage_map == "v" and chunk == 1:
        return 0, 2 * p - 1 - rank
    return 0, chunk * p + rank


def owner(stage_map: str, num_ranks: int, pipe: int, stage: int) -> tuple[int, int]:
    """(rank, chunk) holding ``stage`` of pipeline ``pipe``."""
    p = num_ranks
    if stage_map == "bitpipe":
        half = 0 if stage < p else 1
        q = stage if half == 0 else 2 * p - 1 - stage
        return (q if pipe == 0 else p - 1 - q), 2 * pipe + half
    chunk, rank = divmod(stage, p)
    if stage_map == "v" and chunk == 1:
        rank = 2 * p - 1 - stage
    return rank, chunk
