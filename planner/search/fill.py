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


class PositionLP:
    """LP relaxations of choosing one option per pipeline position, each position with its
    own limits (``most[o, s]`` blocks of option o at position s; below 1: not there), within
    every class's capacity in units.  Any plan is one integer choice, so the LP optimum bounds
    it.  The positionless knapsack (pieces.most_speed) must give every stage its option's best
    position; here the first stages of a 1F1B pipeline, with the most micro-batches in flight,
    hold fewer blocks of the memory-bound options, and the ends pay for embedding and head.
    One HiGHS instance, reused (an LP of a few thousand columns takes milliseconds)."""

    def __init__(self):
        import highspy

        from planner.search.core.guard import solver_output_silenced
        with solver_output_silenced():          # HiGHS's banner on its first use
            self._h = highspy.Highs()
        self._h.setOptionValue("output_flag", False)
        # HiGHS's thread pool is process-wide and fixed by its first run: the MILPs run with
        # one thread (core/milp.py), and a pool started with more makes them fail
        self._h.setOptionValue("threads", 1)
        self._hs = highspy
        self.fill_duals: tuple | None = None     # (lam, {class: mu}) of the last least_fill

    def most_blocks(self, most: np.ndarray, units: np.ndarray, cls: np.ndarray, capacity: list[int]) -> float:
        """max sum most[o, s] z[o, s] s.t. sum_o z[o, s] = 1 per s, capacities, z >= 0: the
        most blocks the positions can hold (-inf when no choice fits)."""
        cols = self._columns(most)
        if cols is None:
            return -math.inf
        o_idx, s_idx = cols
        n, p = len(o_idx), most.shape[1]
        class_rows, class_of = self._class_rows(cls, o_idx, capacity, p)
        index = np.stack([s_idx, class_of], axis=1).ravel().astype(np.int32)
        value = np.stack([np.ones(n), units[o_idx]], axis=1).ravel()
        value_ = self._solve(-most[o_idx, s_idx].astype(float), np.zeros(n), np.ones(n),
                             np.arange(0, 2 * n + 1, 2), index, value,
                             np.concatenate([np.ones(p), class_rows[0]]), np.concatenate([np.ones(p), class_rows[1]]))
        if value_ is None:
            return math.inf                     # unsure: claim nothing
        if not math.isfinite(value_):
            return -math.inf                    # infeasible: no choice fits
        return -value_ + 1e-6 * max(1.0, float(most.max()))

    def least_fill(self, most: np.ndarray, slope: np.ndarray, icpt: np.ndarray, units: np.ndarray,
                   cls: np.ndarray, capacity: list[int], L: int) -> float:
        """min sum_{o,s} slope[o] y[o, s] + icpt[o, s] z[o, s] over the same choices z with
        blocks z <= y <= most z summing to L: the least a summed row (affine in a stage's
        blocks) can total over the positions (inf when no choice holds the blocks)."""
        cols = self._columns(most)
        if cols is None:
            return math.inf
        o_idx, s_idx = cols
        n, p = len(o_idx), most.shape[1]
        class_rows, class_of = self._class_rows(cls, o_idx, capacity, p)
        # rows: positions [0, p), classes [p, p + C), blocks p + C, then per column pair
        # y - most z <= 0 and y - z >= 0
        blocks_row = p + len(class_rows[0])
        pair = blocks_row + 1 + 2 * np.arange(n)
        z_index = np.stack([s_idx, class_of, pair, pair + 1], axis=1).ravel()
        z_value = np.stack([np.ones(n), units[o_idx], -most[o_idx, s_idx], -np.ones(n)], axis=1).ravel()
        y_index = np.stack([np.full(n, blocks_row), pair, pair + 1], axis=1).ravel()
        y_value = np.ones(3 * n)
        index = np.concatenate([z_index, y_index]).astype(np.int32)
        value = np.concatenate([z_value, y_value])
        start = np.concatenate([np.arange(0, 4 * n, 4), 4 * n + np.arange(0, 3 * n + 1, 3)])
        inf = self._hs.kHighsInf
        lower = np.concatenate([np.ones(p), class_rows[0], [L], np.tile([-inf, 0.0], n)])
        upper = np.concatenate([np.ones(p), class_rows[1], [L], np.tile([0.0, inf], n)])
        cost = np.concatenate([icpt[o_idx, s_idx], slope[o_idx]]).astype(float)
        col_upper = np.concatenate([np.ones(n), most[o_idx, s_idx].astype(float)])
        value_ = self._solve(cost, np.zeros(2 * n), col_upper, start, index, value, lower, upper)
        if value_ is None:
            return -math.inf                    # unsure: claim nothing
        if not math.isfinite(value_):
            return value_                       # infeasible: no choice holds the blocks
        duals = np.asarray(self._h.getSolution().row_dual)
        classes = sorted({int(c) for c in cls[o_idx]})
        self.fill_duals = (float(duals[blocks_row]), {c: float(duals[p + i]) for i, c in enumerate(classes)})
        return value_ - 1e-6 * max(1.0, abs(value_))

    def fill_dual_bound(self, most: np.ndarray, slope: np.ndarray, icpt: np.ndarray, units: np.ndarray,
                        cls: np.ndarray, capacity: list[int], L: int) -> float:
        """A lower bound on ``least_fill`` without an LP: its Lagrangian dual at the prices of
        the last LP solved (a block's price lam, each class's unit price mu >= 0),

            lam L - sum_c mu_c cap_c + sum_s min_o [icpt[o, s] + mu_c(o) units_o
                                                    + min(slope_o - lam, (slope_o - lam) most[o, s])],

        which bounds it for any prices (weak duality) and reaches it at the LP's own; the fill
        of a nearby bottleneck has nearly the same prices.  Both signs of HiGHS's duals are
        tried (any choice is valid)."""
        if self.fill_duals is None:
            return -math.inf
        ok = most >= 1
        if not ok.any(axis=0).all():
            return math.inf                     # some position takes no option: no plan
        lam0, mu0 = self.fill_duals
        best = -math.inf
        for lam in (lam0, -lam0):
            for sign in (1.0, -1.0):
                mu = np.array([max(0.0, sign * mu0.get(int(c), 0.0)) for c in range(len(capacity))])
                per = slope[:, None] - lam
                col = icpt + (mu[cls] * units)[:, None] + np.minimum(per, per * most)
                col = np.where(ok, col, math.inf)
                value = lam * L - float(mu @ np.asarray(capacity, dtype=float)) + float(col.min(axis=0).sum())
                best = max(best, value)
        return best - 1e-6 * max(1.0, abs(best))

    @staticmethod
    def _columns(most: np.ndarray):
        o_idx, s_idx = np.nonzero(most >= 1)
        if len(set(s_idx.tolist())) < most.shape[1]:
            return None                         # some position takes no option
        return o_idx, s_idx

    @staticmethod
    def _class_rows(option_class, o_idx, capacity, p):
        classes = sorted({int(c) for c in option_class[o_idx]})
        row_of = {c: p + i for i, c in enumerate(classes)}
        lower = np.full(len(classes), -np.inf)
        upper = np.array([float(capacity[c]) for c in classes])
        return (lower, upper), np.array([row_of[int(c)] for c in option_class[o_idx]])

    def _solve(self, cost, col_lower, col_upper, start, index, value, row_lower, row_upper) -> float | None:
        """Minimise; the optimum's value, inf when infeasible, None when HiGHS is unsure."""
        hs = self._hs
        lp = hs.HighsLp()
        lp.num_col_, lp.num_row_ = len(cost), len(row_lower)
        lp.col_cost_ = np.asarray(cost, dtype=float)
        lp.col_lower_, lp.col_upper_ = np.asarray(col_lower, dtype=float), np.asarray(col_upper, dtype=float)
        lp.row_lower_ = np.where(np.isfinite(row_lower), row_lower, -hs.kHighsInf)
        lp.row_upper_ = np.where(np.isfinite(row_upper), row_upper, hs.kHighsInf)
        lp.a_matrix_.format_ = hs.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.asarray(start, dtype=np.int32)
        lp.a_matrix_.index_ = np.asarray(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.asarray(value, dtype=float)
        self._h.clearModel()
        self._h.passModel(lp)
        self._h.run()
        status = self._h.getModelStatus()
        if status == hs.HighsModelStatus.kInfeasible:
            return math.inf
        if status != hs.HighsModelStatus.kOptimal:
            return None
        return float(self._h.getInfo().objective_function_value)
