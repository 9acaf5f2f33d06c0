"""``planner rebalance --blocks``: the contiguous block split re-solved from measured times, on
the same stages, devices, tp and schedule, and the micro-batch shares after it (issue 21).
Torch-free.

Per replica. Its measured compute per micro-batch (each step's ``compute_s`` over the number of
micro-batches) is turned into layer times by the conversion ``planner profile --from-run``
uses (``planner.profile.from_run.layer_prices``): the cost model's TP collectives and
per-micro-batch overhead come off, and the rest is split over the stage's embedding, blocks and
head in the cost model's ratio, one factor ``k`` (the median over the steps used) scaling them
all. That makes the replica's time per micro-batch a line in its block count ``nb``:
``fixed_s + per_block_s * nb``, ``per_block_s`` one block's measured forward + backward (its TP
collectives in), ``fixed_s`` the embedding / head the stage keeps wherever its blocks go plus
the non-layer part.

Per stage. At ``nb`` blocks each replica's speed line of ``planner.rebalance`` (time against
share, fitted on the measured steps) is scaled by ``line(nb) / line(nb_now)``, the stage's
shares are re-solved as ``planner rebalance`` does (``solve_shares``), and the stage's time per
micro-batch ``c_s(nb)`` is its slowest replica's. A stage whose replicas would not fit in memory
at ``nb`` blocks with those shares (``planner.cost.memory.replica_memory``, the schedule's
in-flight micro-batches) is ``inf`` there: the split is never chosen.

The pipeline's time on stage times ``c_s`` is the action-list executor's makespan
(``planner.simulate``: the schedule's generated lists, each stage's micro-batch split into
forward and backward in its line's ratio). Not the closed form: 1F1B's ``(m - 1) max_s c_s +
sum_s c_s`` is an upper bound that is exact when the last stage is the slowest, and moving
blocks off a slow late stage makes an early stage the slowest, where its warm-up forwards
overlap the fill (a 2-stage run on the reference runner: the form 10% over the measured step,
the executor 2% over).

The split. Where the contiguous splits are few (``SPLITS_ENUMERATED``) each is run through
the executor and the fastest kept. Else the search's exact DP
(``planner.search.core.dp.dp_partition``) minimises the closed form, 1F1B's or interleaved
1F1B's ``(m - 1/v) max_s c_s + (1/v) sum_s c_s`` over chunks of v blocks (one max plus a sum),
over the cost table ``cost[s][i][j] = c_s(j - i)``, and its split is kept if the executor
prices it faster. Other schedules price forward and backward maxima apart (GPipe) or carry
their own W / V / latency terms (zero-bubble, V, BitPipe, latency-aware): refused. A split
that ties the current one keeps the current one.

Prediction. The executor's time on the ``c_s`` plus what the measured steps spent beyond the
executor's time on their measured stage times (the median over the steps used of step time
less it: sends, DP sync, optimizer), taken as fixed and floored at zero. Sends do not depend
on the split; a stage's DP sync and optimizer step grow with its blocks, which this leaves out
(a first-order estimate, as ``planner rebalance`` is for pipelines).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from dataclasses import dataclass

from planner.errors import InputError
from planner.rebalance import (
    STALE_AFTER_REBALANCE,
    ReplicaSpeed,
    check_finite,
    check_measured,
    fit_speed,
    solve_shares,
)

SCHEDULES = ("1f1b", "interleaved-1f1b")
# Up to this many contiguous splits each is priced by the executor (a 2-stage plan of 64
# blocks: 63; 4 stages of 16: 455), milliseconds each; beyond, the closed form's DP chooses.
SPLITS_ENUMERATED = 512


@dataclass(frozen=True)
class ReplicaLine:
    """One replica's time per micro-batch against its block count, at the plan's share."""

    stage: int
    replica: int
    fixed_s: float       # embedding / head, TP collectives of those, per-micro-batch overhead
    per_block_s: float   # one block's measured forward + backward (its TP collectives in)
    k: float             # measured / cost-model layer time (planner.profile.from_run)
    forward_fixed_s: float       # the forward's part of fixed_s (the overhead counted here,
    forward_per_block_s: float   # as replica_compute does) and of per_block_s

    def time_s(self, num_blocks: int) -> float:
        return self.fixed_s + self.per_block_s * num_blocks

    def forward_share(self, num_blocks: int) -> float:
        total = self.time_s(num_blocks)
        return (self.forward_fixed_s + self.forward_per_block_s * num_blocks) / total if total > 0 else 0.5


@dataclass(frozen=True)
class StageAt:
    """One stage at a block count: its slowest replica's time per micro-batch and forward share."""

    per_micro_batch_s: float
    forward_share: float
    shares: list[int]
    speeds: list[ReplicaSpeed]


@dataclass(frozen=True)
class BlockRebalanced:
    old_blocks: tuple[tuple[int, int], ...]    # the plan file's [first, last) per stage
    blocks: tuple[tuple[int, int], ...]        # the new split (the old one when it is as good)
    shares: dict[tuple[int, int], int]         # (stage, replica) -> share after the new split
    old_shares: dict[tuple[int, int], int]
    speeds: dict[tuple[int, int], ReplicaSpeed]  # per replica as measured (at the old split)
    lines: dict[tuple[int, int], ReplicaLine]
    measured_step_s: float                     # median over the steps used
    predicted_old_step_s: float                # the plan as it is (old split, old shares)
    predicted_shares_step_s: float             # old split, shares re-solved: rebalance without --blocks
    predicted_step_s: float                    # new split, shares re-solved

    @property
    def predicted_gain(self) -> float:
        """Measured median step time over the predicted one (> 1: faster), as ``Rebalanced``."""
        return self.measured_step_s / self.predicted_step_s

    @property
    def moved(self) -> bool:
        return self.blocks != self.old_blocks


def schedule_form(plan) -> tuple[float, float, int]:
    """(alpha, beta, block unit): the pipeline time is ``alpha max_s c_s + beta sum_s c_s``."""
    m, v = plan.num_micro_batches, plan.virtual_stages
    if plan.schedule == "1f1b":
        return m - 1.0, 1.0, 1
    if plan.schedule == "interleaved-1f1b":
        return m - 1.0 / v, 1.0 / v, v
    raise InputError(f"rebalance --blocks: schedule {plan.schedule!r} is not one max plus a sum of "
                     f"stage times; the block split is re-solved for {', '.join(SCHEDULES)} only "
                     "(rebalance without --blocks re-solves the shares of any schedule)")


def executor_pipeline_s(sched, stages: list[tuple[float, float]]) -> float:
    """The makespan of the action lists ``sched`` (the plan's schedule, generated once) on
    (time per micro-batch, forward share) per stage, sends left out (module docstring); a
    rank's chunks each take an equal part of its time."""
    from planner.simulate.engine import SimStage
    from planner.simulate.executor import execute, stage_times_from_ranks

    ranks = [SimStage(forward_s=c * f, backward_s=c * (1 - f)) for c, f in stages]
    times = stage_times_from_ranks(ranks, sched.chunks, sched.stage_map)
    return execute(sched, times, check=False).makespan_s


def replica_lines(ctx, cluster, plan, times, used: range, path: str) -> dict[tuple[int, int], ReplicaLine]:
    from planner.profile.from_run import layer_prices

    nodes, m = cluster.node_by_name, plan.num_micro_batches
    out = {}
    for st in plan.stages:
        for j, rep in enumerate(st.replicas):
            node = nodes[rep.node]
            gpu, intra = node.gpu, node.group.intra_Bps
            t = times[(st.index, j)]
            k = statistics.median(
                layer_prices(ctx, gpu, intra, rep.tp, t.shares[i], st.num_blocks, st.embedding, st.head)
                .scale(t.compute_s[i] / m, path, f"steps[{i}] stage {st.index} replica {j} compute_s")
                for i in used)
            one = layer_prices(ctx, gpu, intra, rep.tp, rep.micro_batch_share, 1, st.embedding, st.head)
            per_block = fixed = forward_per_block = 0.0
            forward_fixed = one.overhead_s
            for kind, _, lt in one.layers:
                layer_s = k * (lt.forward_s + lt.backward_s) + lt.tp_comm_s
                forward_s = k * lt.forward_s + lt.tp_comm_forward_s
                if kind == "block":
                    per_block, forward_per_block = layer_s, forward_s
                else:
                    fixed += layer_s
                    forward_fixed += forward_s
            out[(st.index, j)] = ReplicaLine(st.index, j, fixed + one.overhead_s, per_block, k,
                                             forward_fixed, forward_per_block)
    return out


class _Stage:
    """One stage's time per micro-batch and shares at any block count (module docstring)."""

    def __init__(self, ctx, cluster, plan, stage, speeds, lines, min_share: int):
        self.ctx, self.plan, self.stage = ctx, plan, stage
        self.gpus = [cluster.node_by_name[r.node].gpu for r in stage.replicas]
        self.keys = [(stage.index, j) for j in range(len(stage.replicas))]
        self.speeds = [speeds[k] for k in self.keys]
        self.lines = [lines[k] for k in self.keys]
        self.min_share = min_share

    def speeds_at(self, nb: int) -> list[ReplicaSpeed]:
        out = []
        for sp, ln in zip(self.speeds, self.lines):
            rho = ln.time_s(nb) / ln.time_s(self.stage.num_blocks)
            out.append(dataclasses.replace(sp, fixed_s=sp.fixed_s * rho, per_sequence_s=sp.per_sequence_s * rho))
        return out

    def at(self, nb: int, shares: list[int] | None = None) -> StageAt:
        """The stage at ``nb`` blocks; ``shares`` None: re-solved."""
        speeds = self.speeds_at(nb)
        if shares is None:
            shares = solve_shares(speeds, self.plan.micro_batch_size, self.min_share)
        step, slowest = max((sp.time_s(x), j) for j, (sp, x) in enumerate(zip(speeds, shares)))
        forward_share = self.lines[slowest].forward_share(nb)
        return StageAt(step / self.plan.num_micro_batches, forward_share, shares, speeds)

    def measured(self, times, step: int) -> tuple[float, float]:
        """(time per micro-batch, forward share) of the measured ``step``: its slowest replica."""
        c, slowest = max((times[k].compute_s[step], j) for j, k in enumerate(self.keys))
        return c / self.plan.num_micro_batches, self.lines[slowest].forward_share(self.stage.num_blocks)

    def fits(self, nb: int, shares: list[int]) -> bool:
        from planner.cost.memory import logits_in_flight, replica_memory, stage_holds

        plan, st = self.plan, self.stage
        inflight, deferred = stage_holds(plan.schedule, len(plan.stages), st.index, plan.num_micro_batches,
                                         plan.virtual_stages)
        return all(replica_memory(self.ctx, gpu, r.tp, x, nb, st.embedding, st.head, len(st.replicas),
                                  inflight, logits_in_flight(plan.schedule), deferred).total_bytes
                   <= gpu.memory_bytes
                   for gpu, r, x in zip(self.gpus, st.replicas, shares))


def rebalance_blocks(cluster, plan, doc: dict, times, path: str, min_share: int = 1,
                     profiles=None) -> BlockRebalanced:
    """The split and shares re-solved from the measurements ``doc`` / ``times`` of ``plan``
    (``planner.launch.measurements.load``), read from ``path`` (named in errors)."""
    from planner.cost.evaluate import context_for_plan
    from planner.profile.from_run import check_trained, run_context
    from planner.simulate.actions import generate

    p = len(plan.stages)
    if p < 2:
        raise InputError("rebalance --blocks moves blocks between pipeline stages; the plan has one "
                         "stage (rebalance without --blocks re-solves its shares)")
    alpha, beta, unit = schedule_form(plan)
    steps = doc["steps"]
    check_measured(plan, times, [s["step_time_s"] for s in steps], path)
    trained = check_trained(path, doc, plan)  # times of another model (a --tiny run) price nothing here
    skip = len(steps) > 1            # the first step carries one-off start-up costs (rebalance)
    used = range(1 if skip else 0, len(steps))
    speeds = {k: fit_speed(t, skip, plan.num_micro_batches) for k, t in times.items()}
    check_finite(path, speeds)
    ctx = context_for_plan(plan, None, profiles)     # the plan's memory, as it will run
    # the measured times split as the runner computed them, as profile --from-run does
    lines = replica_lines(run_context(plan, path, trained, None, profiles), cluster, plan, times, used, path)
    stages = [_Stage(ctx, cluster, plan, st, speeds, lines, min_share) for st in plan.stages]
    total = plan.stages[-1].blocks[1]
    units = total // unit
    sched = generate(plan.schedule, p, plan.num_micro_batches, plan.virtual_stages)

    # each stage at every block count, its shares re-solved there; None where it does not fit
    table: list[list[StageAt | None]] = []
    for stage in stages:
        row = [None]
        for n in range(1, units + 1):
            at = stage.at(n * unit)
            row.append(at if stage.fits(n * unit, at.shares) else None)
        table.append(row)

    def executor_s(split_units) -> float:
        ats = [table[s][n] for s, n in enumerate(split_units)]
        if any(at is None for at in ats):
            return math.inf
        return executor_pipeline_s(sched, [(at.per_micro_batch_s, at.forward_share) for at in ats])

    old_nb = [st.num_blocks for st in plan.stages]
    old_units = [n // unit for n in old_nb]
    best_units, best_s = old_units, executor_s(old_units)
    for cand in _candidate_splits(table, units, alpha, beta):
        t = executor_s(cand)
        if t < best_s * (1 - 1e-9):      # as good: keep what runs now
            best_units, best_s = cand, t
    if not math.isfinite(best_s):
        raise InputError("rebalance --blocks: no split of the blocks over these stages fits in memory "
                         "with the measured shares")
    new_nb = [n * unit for n in best_units]

    def predicted(nbs, fixed_shares: bool) -> tuple[float, dict, dict]:
        ats, shares, sp = [], {}, {}
        for stage, nb in zip(stages, nbs):
            old = [r.micro_batch_share for r in stage.stage.replicas] if fixed_shares else None
            at = stage.at(nb, old)
            ats.append((at.per_micro_batch_s, at.forward_share))
            shares.update(zip(stage.keys, at.shares))
            sp.update(zip(stage.keys, at.speeds))
        return executor_pipeline_s(sched, ats), shares, sp

    outside = max(0.0, statistics.median(
        doc["steps"][i]["step_time_s"]
        - executor_pipeline_s(sched, [stage.measured(times, i) for stage in stages])
        for i in used))
    pipe_old, old_shares, _ = predicted(old_nb, True)
    pipe_shares, _, _ = predicted(old_nb, False)
    pipe_new, new_shares, _ = predicted(new_nb, False)
    check_finite(path, {}, predicted_old_step_s=outside + pipe_old, predicted_step_s=outside + pipe_new,
                 predicted_shares_only_step_s=outside + pipe_shares)
    bounds, first = [], 0
    for nb in new_nb:
        bounds.append((first, first + nb))
        first += nb
    return BlockRebalanced(
        old_blocks=tuple(st.blocks for st in plan.stages), blocks=tuple(bounds),
        shares=new_shares, old_shares=old_shares, speeds=speeds, lines=lines,
        measured_step_s=statistics.median(doc["steps"][i]["step_time_s"] for i in used),
        predicted_old_step_s=outside + pipe_old, predicted_shares_step_s=outside + pipe_shares,
        predicted_step_s=outside + pipe_new)


def _candidate_splits(table, units: int, alpha: float, beta: float):
    """Block counts per stage (in units) to price: every contiguous split where they are few,
    else the closed form's DP optimum (module docstring)."""
    import numpy as np

    from planner.search.core.dp import dp_partition

    p = len(table)
    if math.comb(units - 1, p - 1) <= SPLITS_ENUMERATED:
        for cuts in itertools.combinations(range(1, units), p - 1):
            edges = (0, *cuts, units)
            yield [b - a for a, b in itertools.pairwise(edges)]
        return
    c = np.array([[math.inf if at is None else at.per_micro_batch_s for at in row] for row in table])
    i, j = np.indices((units + 1, units + 1))
    cost = np.where(j > i, c[:, np.where(j > i, j - i, 0)], np.inf)
    _, split, _ = dp_partition(cost, alpha, beta)
    if split:
        yield [b - a for a, b in split]


def block_rebalanced_plan(plan, result: BlockRebalanced):
    """``plan`` with the new split and shares; its ``predicted`` and ``solver`` blocks (the cost
    model's and the search's, for the old ones) dropped rather than left stale."""
    stages = []
    for s, (st, blocks) in enumerate(zip(plan.stages, result.blocks)):
        reps = tuple(r.model_copy(update={"micro_batch_share": result.shares[(s, j)]})
                     for j, r in enumerate(st.replicas))
        stages.append(st.model_copy(update={"blocks": blocks, "replicas": reps}))
    data = plan.model_copy(update={"stages": tuple(stages), **STALE_AFTER_REBALANCE}).to_json()
    return type(plan).from_json(data)
