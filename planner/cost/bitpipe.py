"""Pricing a BitPipe plan (planner.simulate.bitpipe): pipeline time from the action-list
executor on the plan's stage timings plus the exposed part of the pair gradient all-reduce,
the pair's sync time on its real link, and the activations each rank holds at its peak.

Plan stage r is rank r's share of one pipeline (its blocks, run as the V's two chunks); rank r
also holds the share of stage p-1-r (the up pipeline runs it there), so the two ranks of a pair
hold the same weights and all-reduce their gradients.  BitPipe syncs eagerly: a chunk's
all-reduce starts once both ranks have run its last backward, the pair's all-reduces queue on
their one link, and only what runs past the end of the pipeline is exposed.
"""

from __future__ import annotations

from functools import lru_cache

from planner.cost.comm import dp_sync_time_s


@lru_cache(maxsize=64)
def _schedule(p: int, m: int):
    from planner.simulate.actions import generate

    return generate("bitpipe", p, m)


def run(stages, num_micro_batches: int):
    """The executor's run of BitPipe on per-plan-stage timings (``StageTiming``)."""
    from planner.simulate.actions import execute
    from planner.simulate.bitpipe import rank_stage_times

    return execute(_schedule(len(stages), num_micro_batches), rank_stage_times(stages), check=False)


def pair_syncs(stages, execution) -> list:
    """Every chunk all-reduce of every pair (r, p-1-r), r < p/2, as ``PairSync``: a chunk of
    plan share q is half of ``stages[q].pair_sync_s``; it is ready when both pipelines' last
    backward of its stage is done, and a pair's all-reduces queue on its one link."""
    from planner.simulate.executor import PairSync

    sched = execution.schedule
    p, S = sched.num_ranks, sched.num_stages
    last_b: dict[int, float] = {}
    for a in execution.actions:
        if a.kind in ("B", "W"):
            last_b[a.stage] = max(last_b.get(a.stage, 0.0), a.end_s)
    out = []
    for r in range(p // 2):
        jobs = []
        for stage in (r, S - 1 - r, p - 1 - r, p + r):     # the four stages the pair holds
            share = stage if stage < p else S - 1 - stage
            jobs.append((last_b.get(stage, 0.0), float(getattr(stages[share], "pair_sync_s", 0.0)) / 2, stage))
        link_free_s = 0.0
        for ready_s, secs, stage in sorted(jobs):
            start_s = max(link_free_s, ready_s)
            link_free_s = start_s + secs
            out.append(PairSync((r, p - 1 - r), stage, start_s, link_free_s))
    return sorted(out, key=lambda s: (s.start_s, s.ranks))


def pair_sync_finish_s(stages, execution) -> list[float]:
    """Per pair (r, p-1-r), r < p/2: when its last chunk all-reduce ends."""
    finish: dict[int, float] = {}
    for sync in pair_syncs(stages, execution):
        finish[sync.ranks[0]] = max(finish.get(sync.ranks[0], 0.0), sync.end_s)
    return [finish[r] for r in sorted(finish)]


def with_pair_syncs(stages, execution):
    """``execution`` with its pair all-reduces and the makespan they extend: the pipeline time
    the cost model prices, so a timeline or trace of it shows what the table reports."""
    from dataclasses import replace

    syncs = pair_syncs(stages, execution)
    return replace(execution, makespan_s=max([execution.makespan_s, *(s.end_s for s in syncs)]),
                   pair_syncs=[s for s in syncs if s.end_s > s.start_s])


def pipeline_time_s(stages, num_micro_batches: int) -> float:
    """Executor makespan plus the exposed pair all-reduce (module docstring)."""
    return with_pair_syncs(stages, run(stages, num_micro_batches)).makespan_s


def in_flight_micro_batches(p: int, m: int) -> list[float]:
    """Per rank, the peak of chunk activations held, in whole-share units (a chunk is half of
    the plan stage's share).

    The authors' order (m a multiple of p; planner.simulate.bitpipe) has a closed form: rank r
    runs 3p/2 + min(r, p-1-r) forwards before its first backward and then one more forward
    before each backward, so it holds 3p/2 + 1 + min(r, p-1-r) chunks at its peak (2p on the
    middle ranks, against 3p/2 + 1 at the ends); where units are concatenated a unit's drain
    runs its extra backwards before the next unit's forwards, so the peak is not exceeded.
    tests/test_simulate_bitpipe.py checks it against the executor's count.  The list-schedule
    fallback (other m) is measured: the executor at unit chunk times (F = 1, B = 2)."""
    from planner.simulate.bitpipe import paper_order_applies

    if paper_order_applies(p, m):
        return [(3 * p // 2 + 1 + min(r, p - 1 - r)) / 2 for r in range(p)]
    from planner.simulate.actions import StageTimes, execute

    return [n / 2 for n in execute(_schedule(p, m), StageTimes(forward_s=1, backward_s=2),
                                   check=False).peak_in_flight]


def pair_sync_s(ctx, paths, plan, i: int, gpu_of) -> float:
    """All-reduce of plan stage ``i``'s share of gradients between the ranks of its pair
    (stage i and stage p-1-i, replica k with replica k), priced by ``dp_sync_time_s`` with two
    members on the ring between their first devices: the slowest replica pair."""
    from planner.cost.memory import stage_params

    p = len(plan.stages)
    own, mirror = plan.stages[i], plan.stages[p - 1 - i]
    params = stage_params(ctx, own.num_blocks, own.embedding, own.head)
    worst = 0.0
    for a, b in zip(own.replicas, mirror.replicas):
        tp = min(a.tp, b.tp)
        ring, _ = paths.ring((a.devices[0], b.devices[0]), tp)
        worst = max(worst, dp_sync_time_s(ctx, params, 2, tp, ring.bandwidth_Bps, ring.latency_s, ring.kind,
                                          gpu_of(a)))
    return worst


def with_pair_copy(ctx, gpu, replica, own, mirror, mem, inflight: float):
    """``mem`` (the replica's own share, activations for ``inflight`` shares) plus the second
    copy BitPipe keeps: the mirror share's weights, gradients and optimizer state, held at the
    replica's tp.  Activations: the peak counts chunks of both shares, so each is charged at
    the larger share's activations per micro-batch (an upper bound where the two differ, e.g.
    embedding on one side and head on the other; exact for equal middle stages)."""
    from dataclasses import replace

    from planner.cost.memory import replica_memory

    other = replica_memory(ctx, gpu, replica.tp, replica.micro_batch_share, mirror.num_blocks,
                           mirror.embedding, mirror.head, len(own.replicas), inflight)
    return replace(mem, weights_bytes=mem.weights_bytes + other.weights_bytes,
                   grads_bytes=mem.grads_bytes + other.grads_bytes,
                   optimizer_bytes=mem.optimizer_bytes + other.optimizer_bytes,
                   activations_bytes=max(mem.activations_bytes, other.activations_bytes))
