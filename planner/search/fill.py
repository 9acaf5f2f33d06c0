"""How L blocks can fill p stages: pure array bounds the knob bound (bound.py) combines.

Each takes plain numbers and arrays, so the tests check it against enumeration directly.
"""

from __future__ import annotations

import math

import numpy as np


def class_slots(u_sorted: np.ndarray, units_sorted: np.ndarray, cls_sorted: np.ndarray,
                 capacity: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """For the options in slope order, per prefix j and class c: the most blocks one stage of
    class c can hold with an option among the first j, and how many stages of class c such
    options allow at most (its capacity over their fewest units): arrays [J, C] each."""
    classes = np.unique(cls_sorted)
    most = np.zeros((len(u_sorted), len(classes)))
    count = np.zeros_like(most)
    for i, c in enumerate(classes):
        mine = cls_sorted == c
        most[:, i] = np.maximum.accumulate(np.where(mine, u_sorted, 0.0))
        fewest = np.minimum.accumulate(np.where(mine, units_sorted, np.inf))
        count[:, i] = np.floor(capacity[int(c)] / fewest)       # 0 before the class's first option
    return most, count


def slot_blocks(most: np.ndarray, count: np.ndarray, p: int) -> np.ndarray:
    """Per prefix j, the most blocks that stages using options among the first j can hold: at
    most p stages, at most ``count`` of class c, each at most ``most`` blocks; filled from the
    class whose stages hold the most (a greedy that is exact for this bound)."""
    by = np.argsort(-most, axis=1, kind="stable")
    m = np.take_along_axis(most, by, axis=1)
    n = np.take_along_axis(count, by, axis=1)
    before = np.cumsum(n, axis=1) - n
    take = np.clip(p - before, 0.0, n)
    return (take * m).sum(axis=1)


def joint_row_bound(L: int, rates: np.ndarray, m_lb: float, fill_lb: float, w_max: float,
                    w_sum: float) -> float:
    """Lower bound on ``w_max max_s t_s + w_sum sum_s t_s`` over stages with t_s = nb_s / r_s
    holding L blocks (intercepts apart), when the top-j stage rates sum to at most
    ``R_j = rates[j-1]`` (most_speed), max_s t_s >= m_lb and sum_s t_s >= fill_lb.

    The two terms pull apart: a small bottleneck M needs blocks spread over slow stages, which
    costs fill.  With the bottleneck M, the least fill puts M on the fastest stages in turn;
    the increments of R, sorted, dominate every real set of rates prefix by prefix, so that
    fill T(M) is a lower bound.  ``w_max M + w_sum max(fill_lb, T(M))`` is piecewise linear
    in M; its least value over M >= m_lb is at a segment end or where T(M) crosses fill_lb."""
    d = np.sort(np.diff(np.concatenate([[0.0], np.asarray(rates, dtype=float)])))[::-1]
    d = d[d > 0]
    if not len(d):
        return 0.0
    P = np.cumsum(d)

    def fill(M: float) -> float:
        # j stages full (time M each), the next takes the rest
        j = int(np.searchsorted(M * P * (1 + 1e-12), L, side="left"))   # slack: M = L / P exactly
        if j >= len(d):
            return math.inf
        done = min(L, M * P[j - 1]) if j else 0.0
        return j * M + (L - done) / d[j]

    candidates = {max(m_lb, L / P[-1])}
    for j in range(len(d)):
        lo, hi = L / P[j], (L / P[j - 1] if j else math.inf)      # segment of j full stages
        for M in (lo, hi):
            if math.isfinite(M) and M >= m_lb:
                candidates.add(M)
        # where j M + (L - M P_{j-1}) / d_j equals fill_lb, inside the segment
        slope = j - (P[j - 1] if j else 0.0) / d[j]
        if slope:
            M = (fill_lb - L / d[j]) / slope
            if lo <= M <= hi and M >= m_lb:
                candidates.add(M)
    return min(w_max * M + w_sum * max(fill_lb, fill(M)) for M in candidates)


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
