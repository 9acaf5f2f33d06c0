"""Dynamic batching: a controller that moves whole sequences of each micro-batch from slow
replicas to fast ones within a stage, between steps (issue 21).

Torch-free and deterministic: the runner's rank 0 calls it once per stage after every step
with each replica's measured compute time, and broadcasts the integer shares it returns.

The idea follows "Taming Resource Heterogeneity in Distributed ML Training with Dynamic
Batching" (Tyagi & Sharma, 2020): a replica's throughput is the sequences it took divided by
its compute time; all replicas finish together when shares are proportional to throughput.
Here:

- target share ``T_j = B * v_j / sum(v)``, ``v_j = share_j / time_j`` (sequences per second);
- error ``e_j = T_j - x_j`` on a continuous share ``x_j`` the controller keeps between steps
  (the integer share is ``x_j`` rounded, largest remainder, so the shares always sum to B;
  the shares in use stay while each is still within one sequence of ``x_j``, so noise does not
  flip sequences back and forth);
- move ``u_j = kp * e_j + ki * I_j`` with ``I_j`` the sum of past errors (the integral term
  removes a steady offset when time is not proportional to share, e.g. a fixed per-step cost);
- dead band: when the replicas' compute times differ by less than ``dead_band`` of the slowest,
  nothing moves and the integral is left alone (noise alone should not shuffle sequences);
- bounds: one scalar ``alpha`` in [0, 1] scales every move, so the shares still sum to B, keeps
  every share at least ``min_share`` and moves none by more than
  ``max(1, max_step_fraction * share)`` sequences (after rounding: at most the ceiling of it).
  When the bound bites, the integral does not accumulate (anti-windup).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ControllerSettings:
    kp: float = 0.6
    ki: float = 0.15
    dead_band: float = 0.05  # relative spread of compute times below which nothing moves
    max_step_fraction: float = 0.5  # of a replica's share, per step (at least one sequence)
    min_share: int = 1  # sequences; a replica never drops to zero

    def check(self, micro_batch_size: int, replicas: int) -> list[str]:
        """Problems with these settings for a stage of ``replicas`` replicas, as sentences."""
        out = []
        if not 0 < self.kp <= 1:
            out.append(f"kp must be in (0, 1], got {self.kp}")
        if not 0 <= self.ki <= 1:
            out.append(f"ki must be in [0, 1], got {self.ki}")
        if not 0 <= self.dead_band < 1:
            out.append(f"dead_band must be in [0, 1), got {self.dead_band}")
        if not 0 < self.max_step_fraction <= 1:
            out.append(f"max_step_fraction must be in (0, 1], got {self.max_step_fraction}")
        if self.min_share < 1:
            out.append(f"min_share must be at least 1 sequence, got {self.min_share}")
        elif self.min_share * replicas > micro_batch_size:
            out.append(f"min_share {self.min_share} x {replicas} replicas exceeds the micro-batch "
                       f"size {micro_batch_size}")
        return out


def largest_remainder(x: list[float], total: int, floor_at: int) -> list[int]:
    """Integers summing to ``total``, each the floor or ceiling of ``x_j`` (which sum to
    ``total``) and at least ``floor_at``; the largest fractional parts round up."""
    base = [max(floor_at, math.floor(v + 1e-9)) for v in x]
    left = total - sum(base)
    order = sorted(range(len(x)), key=lambda j: (-(x[j] - base[j]), j))
    for j in order[:max(0, left)]:
        base[j] += 1
    for j in sorted(range(len(x)), key=lambda j: (x[j] - base[j], j)):  # only if floors overshot
        if sum(base) <= total:
            break
        if base[j] > floor_at:
            base[j] -= 1
    return base


def proportional_shares(speeds: list[float], total: int, min_share: int = 1) -> list[int]:
    """Integer shares summing to ``total`` closest to proportional to ``speeds``."""
    s = sum(speeds)
    return largest_remainder([total * v / s for v in speeds], total, min_share)


@dataclass
class ShareController:
    """One stage's controller. ``update(times_s)`` takes each replica's compute time of the
    step that just ran (with ``shares``) and returns the shares for the next step."""

    shares: list[int]
    settings: ControllerSettings = field(default_factory=ControllerSettings)
    x: list[float] = field(init=False)
    integral: list[float] = field(init=False)

    def __post_init__(self):
        self.total = sum(self.shares)
        problems = self.settings.check(self.total, len(self.shares))
        if problems:
            raise ValueError("; ".join(problems))
        if min(self.shares) < self.settings.min_share:
            raise ValueError(f"a share below min_share {self.settings.min_share}: {self.shares}")
        self.x = [float(s) for s in self.shares]
        self.integral = [0.0] * len(self.shares)

    def target(self, times_s: list[float]) -> list[float]:
        speeds = [s / t for s, t in zip(self.shares, times_s)]
        total_speed = sum(speeds)
        return [self.total * v / total_speed for v in speeds]

    def update(self, times_s: list[float]) -> list[int]:
        if len(times_s) != len(self.shares):
            raise ValueError(f"{len(times_s)} times for {len(self.shares)} replicas")
        if any(not (t > 0 and math.isfinite(t)) for t in times_s):
            raise ValueError(f"compute times must be positive and finite, got {times_s}")
        if len(self.shares) == 1 or (max(times_s) - min(times_s)) < self.settings.dead_band * max(times_s):
            return list(self.shares)
        err = [t - x for t, x in zip(self.target(times_s), self.x)]
        integral = [i + e for i, e in zip(self.integral, err)]
        move = [self.settings.kp * e + self.settings.ki * i for e, i in zip(err, integral)]
        mean = sum(move) / len(move)  # exactly zero in exact arithmetic; keep the sum at B
        move = [m - mean for m in move]
        alpha = self._alpha(move)
        if alpha >= 1.0:
            self.integral = integral
        self.x = [x + alpha * m for x, m in zip(self.x, move)]
        # Sticky rounding: while the shares in use are still a rounding of x (each within one
        # sequence), keep them; re-rounding on every small move of x flips sequences back and
        # forth on measurement noise.
        if any(abs(x - s) >= 1.0 for x, s in zip(self.x, self.shares)):
            self.shares = largest_remainder(self.x, self.total, self.settings.min_share)
        return list(self.shares)

    def _alpha(self, move: list[float]) -> float:
        """The largest scale in [0, 1] keeping every bound (see the module docstring)."""
        alpha = 1.0
        st = self.settings
        for x, s, m in zip(self.x, self.shares, move):
            limit = max(1.0, st.max_step_fraction * s)
            if m > 0:
                alpha = min(alpha, (s + limit - x) / m)
            elif m < 0:
                floor_at = max(float(st.min_share), s - limit)
                alpha = min(alpha, (x - floor_at) / -m)
        return max(0.0, alpha)
