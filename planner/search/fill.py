"""How L blocks can fill p stages: pure array bounds the knob bound (bound.py) combines.

Each takes plain numbers and arrays, so the tests check it against enumeration directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Slots:
    """Per option prefix j (options in slope order) and class, the most blocks one stage can
    hold and how many stages the class allows (``class_slots``), each row sorted once by those
    blocks, largest first: ``blocks(p)`` is then a clip and a sum for every p."""
    most: np.ndarray        # [J, C] blocks per stage, each row sorted largest first
    count: np.ndarray       # [J, C] stages the class allows, in the same order
    before: np.ndarray      # [J, C] stages of the classes ahead in that order

    def blocks(self, p: int) -> np.ndarray:
        """Per prefix j, the most blocks that stages using options among the first j can
        hold: at most p stages, at most ``count`` of each class, each at most ``most``
        blocks; filled from the class whose stages hold the most (a greedy that is exact for
        this bound)."""
        take = np.clip(p - self.before, 0.0, self.count)
        return (take * self.most).sum(axis=1)


def class_slots(u_sorted: np.ndarray, units_sorted: np.ndarray, cls_sorted: np.ndarray,
                capacity: list[int]) -> Slots:
    """For the options in slope order, per prefix j and class c: the most blocks one stage of
    class c can hold with an option among the first j, and how many stages of class c such
    options allow at most (its capacity over their fewest units)."""
    classes = np.unique(cls_sorted)
    most = np.zeros((len(u_sorted), len(classes)))
    count = np.zeros_like(most)
    for i, c in enumerate(classes):
        mine = cls_sorted == c
        most[:, i] = np.maximum.accumulate(np.where(mine, u_sorted, 0.0))
        fewest = np.minimum.accumulate(np.where(mine, units_sorted, np.inf))
        count[:, i] = np.floor(capacity[int(c)] / fewest)       # 0 before the class's first option
    by = np.argsort(-most, axis=1, kind="stable")
    most, count = np.take_along_axis(most, by, axis=1), np.take_along_axis(count, by, axis=1)
    return Slots(most, count, np.cumsum(count, axis=1) - count)


def joint_row_bound(L: int, rates: np.ndarray, m_lb: float, fill_lb: float, w_max: float,
                    w_sum: float) -> float:
    """Lower bound on ``w_max max_s t_s + w_sum sum_s t_s`` over stages with t_s = nb_s / r_s
    holding L blocks (intercepts apart), when the top-j stage rates sum to at most
    ``R_j = rates[j-1]`` (most_speed), max_s t_s >= m_lb and sum_s t_s >= fill_lb.

    The two terms pull apart: a small bottleneck M needs blocks spread over slow stages, which
    costs fill.  With the bottleneck M, the least fill puts M on the fastest stages in turn;
    the increments of R, sorted, dominate every real set of rates prefix by prefix, so that
    fill T(M) is a lower bound.  ``w_max M + w_sum max(fill_lb, T(M))`` is piecewise linear
    in M; its least value over M >= m_lb is at a segment end or where T(M) crosses fill_lb.
    All candidates at once (the knob bound asks this tens of thousands of times a search)."""
    if m_lb == math.inf:
        return math.inf             # no bottleneck below it (the scalar form's answer too)
    d = np.sort(np.diff(np.concatenate([[0.0], np.asarray(rates, dtype=float)])))[::-1]
    d = d[d > 0]
    if not len(d):
        return 0.0
    P = np.cumsum(d)
    n = len(d)
    P_before = np.concatenate([[0.0], P[:-1]])           # P_{j-1}, 0 for j = 0
    ends = L / P                                         # segment j: [L / P_j, L / P_{j-1}]
    hi = np.concatenate([[math.inf], ends[:-1]])
    # where j M + (L - M P_{j-1}) / d_j equals fill_lb, inside segment j (j = 0 has slope 0)
    slope = np.arange(n) - P_before / d
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = (fill_lb - L / d) / slope
    inside = (slope != 0) & (ends <= cross) & (cross <= hi)
    M = np.concatenate([[max(m_lb, L / P[-1])], ends, cross[inside]])
    M = M[M >= m_lb]
    # j stages full (time M each), the next takes the rest (slack: M = L / P exactly)
    j = (M[:, None] * P[None, :] * (1 + 1e-12) < L).sum(axis=1)
    full = j >= n
    jj = np.minimum(j, n - 1)
    done = np.minimum(L, M * P_before[jj])               # 0 for j = 0
    fill = np.where(full, math.inf, j * M + (L - done) / d[jj])
    return float(np.min(w_max * M + w_sum * np.maximum(fill_lb, fill)))


def sum_bound(L: int, p: int, a_min: float, speed: float) -> float:
    """Lower bound on sum_s a(o_s) nb_s over p stages holding L blocks: at least L a_min, and,
    with w_s = 1 / a(o_s) the stages' speeds (their total at most ``speed``), by
    Cauchy-Schwarz at least (sum_s sqrt(nb_s))^2 / speed >= (p - 1 + sqrt(L - p + 1))^2 / speed
    (the sum of square roots is least when all blocks but p - 1 sit on one stage).  This is
    what a long pipeline's fill costs."""
    out = L * a_min
    if speed > 0 and a_min > 0:
        out = max(out, (p - 1 + math.sqrt(L - p + 1)) ** 2 / speed)
    return out
