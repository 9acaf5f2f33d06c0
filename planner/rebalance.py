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

import statistics
from dataclasses import dataclass

from planner.launch.measurements import ReplicaTimes


@dataclass(frozen=True)
class ReplicaSpeed:
    stage: int
    replica: int
    fixed_s: float
    per_sequence_s: float

    def time_s(self, share: int) -> float:
        return self.fixed_s + self.per_sequence_s * share

    @property
    def sequences_per_s(self) -> float:
        return 1.0 / self.per_sequence_s


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


def fit_speed(t: ReplicaTimes, skip_first: bool) -> ReplicaSpeed:
    n0 = 1 if skip_first and len(t.shares) > 1 else 0
    xs, ys = t.shares[n0:], t.compute_s[n0:]
    if len(set(xs)) > 1:
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        fixed = my - slope * mx
        if slope > 0 and fixed >= 0:
            return ReplicaSpeed(t.stage, t.replica, fixed, slope)
    per_seq = statistics.median(y / x for x, y in zip(xs, ys))
    return ReplicaSpeed(t.stage, t.replica, 0.0, per_seq)


def solve_shares(speeds: list[ReplicaSpeed], total: int, min_share: int = 1) -> list[int]:
    shares = [min_share] * len(speeds)
    for _ in range(total - min_share * len(speeds)):
        j = min(range(len(speeds)), key=lambda j: (speeds[j].time_s(shares[j] + 1), j))
        shares[j] += 1
    return shares


def rebalance(plan, times: dict[tuple[int, int], ReplicaTimes], step_time_s: list[float],
              min_share: int = 1) -> Rebalanced:
    steps = len(step_time_s)
    skip = steps > 1
    used = range(1 if skip else 0, steps)
    speeds = {k: fit_speed(t, skip) for k, t in times.items()}
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
    return Rebalanced(shares=new, old_shares=old, speeds=speeds,
                      measured_step_s=statistics.median(step_time_s[i] for i in used),
                      predicted_step_s=outside + bottleneck(new.__getitem__),
                      predicted_old_step_s=outside + bottleneck(old.__getitem__))


def rebalanced_plan(plan, result: Rebalanced):
    """``plan`` with the new shares; its ``predicted`` block (the cost model's, for the old
    shares) is dropped rather than left stale."""
    stages = []
    for s in plan.stages:
        reps = tuple(r.model_copy(update={"micro_batch_share": result.shares[(s.index, j)]})
                     for j, r in enumerate(s.replicas))
        stages.append(s.model_copy(update={"replicas": reps}))
    data = plan.model_copy(update={"stages": tuple(stages), "predicted": None}).to_json()
    return type(plan).from_json(data)
