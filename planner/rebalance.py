"""``planner rebalance``: measured times -> per-replica speeds -> new shares on the same devices
(issue 21). Torch-free.

Each replica's compute time per step is modelled as ``fixed_s + per_sequence_s * share``,
fitted over the measured steps (the first left out when there are more: it carries one-off
start-up costs). When the shares never changed (a static run) the fixed part cannot be told
apart and is taken as zero: time proportional to share. The new shares of a stage minimise its
slowest replica's predicted compute time: starting from ``min_share`` each, the next sequence
goes to the replica that would finish it soonest (greedy is exact for a min-max over increasing
per-replica costs). The predicted step time keeps what the measured step spent outside the
slowest replica's compute (the gradient all-reduce, pipeline fill and drain) and swaps the
bottleneck stage's compute for its predicted value: exact in form for data parallelism, a
first-order estimate for pipelines.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from planner.errors import InputError
from planner.launch.measurements import ReplicaTimes


@dataclass(frozen=True)
class ReplicaSpeed:
    """A replica's compute time per step against its share: ``fixed_s + per_sequence_s x
    share``.  The share is sequences of each micro-batch, so a step computes ``share x
    num_micro_batches`` sequences and ``per_sequence_s`` is the step's time per unit of share
    (``num_micro_batches`` sequences), not one sequence's."""

    stage: int
    replica: int
    fixed_s: float
    per_sequence_s: float
    num_micro_batches: int = 1

    def time_s(self, share: int) -> float:
        return self.fixed_s + self.per_sequence_s * share

    @property
    def sequences_per_s(self) -> float:
        """Sequences a second of compute beyond the fixed part: ``num_micro_batches`` a unit of
        share over its time (with ``fixed_s`` 0, ``share x num_micro_batches / compute_s``)."""
        return self.num_micro_batches / self.per_sequence_s


@dataclass(frozen=True)
class Rebalanced:
    shares: dict[tuple[int, int], int]  # (stage, replica) -> new share
    old_shares: dict[tuple[int, int], int]  # the shares of the plan file
    speeds: dict[tuple[int, int], ReplicaSpeed]
    measured_step_s: float  # median over the steps used
    predicted_step_s: float
    predicted_old_step_s: float  # the same model at the plan file's shares

    @property
    def predicted_gain(self) -> float:
        """Measured median step time over the predicted one (> 1: faster)."""
        return self.measured_step_s / self.predicted_step_s


def fit_speed(t: ReplicaTimes, skip_first: bool, num_micro_batches: int = 1) -> ReplicaSpeed:
    n0 = 1 if skip_first and len(t.shares) > 1 else 0
    xs, ys = t.shares[n0:], t.compute_s[n0:]
    if len(set(xs)) > 1:
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        fixed = my - slope * mx
        if slope > 0 and fixed >= 0:
            return ReplicaSpeed(t.stage, t.replica, fixed, slope, num_micro_batches)
    per_seq = statistics.median(y / x for x, y in zip(xs, ys))
    return ReplicaSpeed(t.stage, t.replica, 0.0, per_seq, num_micro_batches)


# slack on "a replica's compute fits in its step": both are perf_counter spans of the same step,
# the compute nested in the step (planner.launch.worker, measure_worker), each written rounded
# to 1e-9 s
_NESTED_SLACK, _ROUNDING_S = 1e-6, 1e-9
# No measured training step takes longer (11.6 days); 1e308 s would print as "inf ms".
MAX_STEP_S = 1e6


def check_measured(plan, times: dict[tuple[int, int], ReplicaTimes], step_time_s: list[float],
                   path: str = "measurements") -> None:
    """What ``planner.launch.measurements.load`` leaves to the reader, checked before any fit:
    each step measures each replica once, the shares of each stage's replicas in a step are
    whole sequences of the plan's micro-batch and add up to it, and a replica's compute (and
    gradient-sync wait) within a step is no longer than the step itself.  ``InputError``
    naming ``path`` and the field."""
    steps = len(step_time_s)

    def bad(field: str, why: str):
        return InputError(f"{path}: {field}: {why}")

    for (s, r), t in sorted(times.items()):
        if len(t.compute_s) != steps:
            raise bad("steps[*].replicas", f"stage/replica {s}/{r} is measured {len(t.compute_s)} times "
                      f"in {steps} steps; each step measures each replica once")
    mbs = plan.micro_batch_size
    for i, step_s in enumerate(step_time_s):
        if step_s > MAX_STEP_S:
            raise bad(f"steps[{i}].step_time_s", f"{step_s:g} s is no measured step; a step takes "
                      f"seconds, at most {MAX_STEP_S:g} s")
        for st in plan.stages:
            keys = [(st.index, j) for j in range(len(st.replicas))]
            shares = [times[k].shares[i] for k in keys]
            if sum(shares) != mbs:
                listed = ", ".join(f"{s}/{r} {x}" for (s, r), x in zip(keys, shares))
                raise bad(f"steps[{i}].replicas", f"the shares of stage {st.index} ({listed}) sum to "
                          f"{sum(shares)}, but the plan's micro_batch_size is {mbs}: each step splits "
                          f"every micro-batch whole over the stage's replicas")
        for (s, r), t in sorted(times.items()):
            for field, value in (("compute_s", t.compute_s[i]), ("sync_wait_s", t.sync_wait_s[i])):
                if value > step_s * (1 + _NESTED_SLACK) + _ROUNDING_S:
                    raise bad(f"steps[{i}].replicas", f"stage/replica {s}/{r} {field} {value:g} s is "
                              f"longer than its step (step_time_s {step_s:g} s): a replica's {field} "
                              "is spent within the step, so it is at most step_time_s")


def check_finite(path: str, speeds: dict[tuple[int, int], ReplicaSpeed], **values: float) -> None:
    """Fitted speeds and predictions that under- or overflowed (times near the float range's
    ends) are no answer: ``InputError`` rather than a plan of ``inf`` or a division by zero."""
    for (s, r), sp in sorted(speeds.items()):
        if not (sp.per_sequence_s > 0 and math.isfinite(sp.sequences_per_s)):
            raise InputError(f"{path}: steps[*].replicas: stage/replica {s}/{r} compute_s is too small "
                             f"to compute with (a time per sequence of {sp.per_sequence_s:g} s); "
                             "give the times in seconds")
    for name, v in values.items():
        if not math.isfinite(v):
            raise InputError(f"{path}: steps: the measured times are out of range ({name} came out "
                             f"{v}); times are seconds")


def solve_shares(speeds: list[ReplicaSpeed], total: int, min_share: int = 1) -> list[int]:
    shares = [min_share] * len(speeds)
    for _ in range(total - min_share * len(speeds)):
        j = min(range(len(speeds)), key=lambda j: (speeds[j].time_s(shares[j] + 1), j))
        shares[j] += 1
    return shares


def rebalance(plan, times: dict[tuple[int, int], ReplicaTimes], step_time_s: list[float],
              min_share: int = 1, path: str = "measurements") -> Rebalanced:
    """``path`` names the measurements in errors (``check_measured``)."""
    check_measured(plan, times, step_time_s, path)
    steps = len(step_time_s)
    skip = steps > 1
    used = range(1 if skip else 0, steps)
    speeds = {k: fit_speed(t, skip, plan.num_micro_batches) for k, t in times.items()}
    check_finite(path, speeds)
    new, old = {}, {}
    for s in plan.stages:
        keys = [(s.index, j) for j in range(len(s.replicas))]
        for k, r in zip(keys, s.replicas):
            old[k] = r.micro_batch_share
        for k, share in zip(keys, solve_shares([speeds[k] for k in keys], plan.micro_batch_size, min_share)):
            new[k] = share

    def bottleneck(shares_of) -> float:
        return max(speeds[k].time_s(shares_of(k)) for k in speeds)

    # Outside the slowest replica's compute, per measured step: all-reduce, fill and drain.
    outside = statistics.median(step_time_s[i] - max(times[k].compute_s[i] for k in times) for i in used)
    outside = max(0.0, outside)
    result = Rebalanced(shares=new, old_shares=old, speeds=speeds,
                        measured_step_s=statistics.median(step_time_s[i] for i in used),
                        predicted_step_s=outside + bottleneck(new.__getitem__),
                        predicted_old_step_s=outside + bottleneck(old.__getitem__))
    check_finite(path, {}, predicted_step_s=result.predicted_step_s,
                 predicted_old_step_s=result.predicted_old_step_s)
    return result


# What a plan file says about the shares it was searched with and no longer holds after a
# rebalance: the cost model's prediction and the search's report (its status, objective and
# bound were proved for the old shares).  ``planner evaluate`` re-predicts the new plan.
STALE_AFTER_REBALANCE = {"predicted": None, "solver": None}


def rebalanced_plan(plan, result: Rebalanced):
    """``plan`` with the new shares; its ``predicted`` and ``solver`` blocks (the cost model's
    and the search's, for the old shares) are dropped rather than left stale."""
    stages = []
    for s in plan.stages:
        reps = tuple(r.model_copy(update={"micro_batch_share": result.shares[(s.index, j)]})
                     for j, r in enumerate(s.replicas))
        stages.append(s.model_copy(update={"replicas": reps}))
    data = plan.model_copy(update={"stages": tuple(stages), **STALE_AFTER_REBALANCE}).to_json()
    return type(plan).from_json(data)
