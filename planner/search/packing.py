"""One knob tuple's stage tables with its memory limits applied, and the tests on them
(packed.py's module docstring, steps 1 and 2): whether p stages with bottleneck at most M can
hold all L blocks (the knapsack over whole options, then the LP over positions), the least
such M by bisection, and the least fill of the summed rows under a bottleneck M."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from planner.search import clock
from planner.search.knobs import Knobs
from planner.search.pieces import most_speed
from planner.search.position_lp import Cross, PositionLP, PositionModel
from planner.search.slots import End

FILL_STEP = 0.01            # grid step of the bottleneck M for the bound with the fill, of the objective
FILL_POINTS = 24            # grid points at most (above the last, the fill with no bottleneck)
FILL_REFINE = 4             # halvings of the grid interval that binds
KNAPSACK_STAGES = 128       # stage counts up to which the knob bound packs whole options (all, for the models we know)
BISECT_STEPS = 6            # halvings of the bottleneck's interval once M = need holds (for the reported gap)


class MaxTerms(Enum):
    """Which max terms a stage table sums: all of them, or one of the two groups that apart.py
    bounds apart (every plan pays each group's largest stage, not only the largest sum)."""

    ALL = "all"
    PIPELINE = "pipeline"     # rows with sends: the pipeline's own
    STAGE = "stage"           # rows without: each stage's exposed DP sync and optimizer step

    def takes(self, row) -> bool:
        """Whether a max term on ``row`` is summed: any split of the max terms into two groups
        bounds every plan (each is floored at 0 and paid at its own largest stage); rows with
        sends apart from those without is the split that pays (apart.py)."""
        if self is MaxTerms.ALL:
            return True
        return (any(row.out) or any(row.inn)) == (self is MaxTerms.PIPELINE)


def suffix_min(at: np.ndarray) -> np.ndarray:
    """The suffix minimum over block counts (the last axis): the most blocks under M (the
    largest nb with a value <= M) is then how many entries are at most M.  A memory limit is
    applied after that (the largest nb within it with a value <= M may be smaller where the
    value falls as nb grows: only loosens)."""
    return np.flip(np.minimum.accumulate(np.flip(at, axis=-1), axis=-1), axis=-1)


def position_kinds(p: int) -> list[End]:
    """Each of p >= 2 positions' kind: the first, the middle ones, the last."""
    return [End.FIRST] + [End.MIDDLE] * (p - 2) + [End.LAST]


@dataclass
class Tables:
    """Per option, without memory limits: ``g`` [K, L] the least max-term sum at any
    position; ``first``, ``mid``, ``last`` the same at that position (None for p = 1, mid
    None for p = 2); the summed rows, affine in the blocks: ``r_slope`` [K] and ``r_icpt``
    [K, End] (sends included).  ``sends`` (None for p = 1): the same without sends and what
    each side's send adds, for the crossing variants."""
    g: np.ndarray
    first: np.ndarray | None
    mid: np.ndarray | None
    last: np.ndarray | None
    r_slope: np.ndarray
    r_icpt: np.ndarray
    sends: Sends | None = None


@dataclass
class Sends:
    """A stage's max-term sum and summed-row intercept without its sends (``g`` [End, K, L] and
    ``r`` [K, End]), the sends' weights in each (``w_max``, ``w_sum``: (out, in)) and each
    side's least send within the class (row 0) and to each class of ``partners`` (row j to
    ``partners[j - 1]``; inf to its own class) (``out``, ``inn``: [1 + len(partners), K])."""
    g: np.ndarray
    r: np.ndarray
    w_max: tuple[float, float]
    w_sum: tuple[float, float]
    out: np.ndarray
    inn: np.ndarray
    wraps: bool
    partners: tuple[int, ...] = ()

    def sides(self, k: End) -> tuple[bool, bool]:
        """Whether a stage at position kind k sends out and in."""
        return k != End.LAST or self.wraps, k != End.FIRST or self.wraps

    def priced(self, k: End, out: np.ndarray, inn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([K, L] max-term sums, [K] summed-row intercept) at position kind k with the sends
        ``out`` and ``inn`` [K] on the sides it has."""
        has_out, has_in = self.sides(k)
        o = out if has_out else 0.0
        n = inn if has_in else 0.0
        return (self.g[k] + (self.w_max[0] * o + self.w_max[1] * n)[:, None],
                self.r[:, k] + self.w_sum[0] * o + self.w_sum[1] * n)

    def variants(self, cross: Cross, cls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([End, V, K, L] max-term sums, [End, V, K] summed-row intercepts) per position kind
        and crossing variant (``cross.variants``; ``cls`` [K] the options' classes); inf where
        the variant's crossing side does not exist (the first stage's in side, the last's out
        side, unless it wraps; in an order, out of its last class and into its first)."""
        out, inn = self._crossing_sends(cross, cls)
        g = np.empty((len(End), len(cross.variants)) + self.g.shape[1:])
        r = np.empty((len(End), len(cross.variants), self.g.shape[1]))
        for k in End:
            has_out, has_in = self.sides(k)
            for i, (co, ci) in enumerate(cross.variants):
                if (co and not has_out) or (ci and not has_in):
                    g[k, i], r[k, i] = math.inf, math.inf
                    continue
                # an infinite send (no partner there) rules the option out of the variant,
                # also where the rows weigh sends at 0 (0 x inf is no number)
                gone = (~np.isfinite(out[co]) if has_out else False) | (~np.isfinite(inn[ci]) if has_in else False)
                g[k, i], r[k, i] = self.priced(k, np.where(gone, 0.0, out[co]), np.where(gone, 0.0, inn[ci]))
                g[k, i][gone], r[k, i][gone] = math.inf, math.inf
        return g, r

    def _crossing_sends(self, cross: Cross, cls: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each side's send per variant value (rows as ``cross.variants`` number them), [V, K]."""
        if cross.partners and not cross.order:
            return self.out, self.inn
        if not cross.order:         # a crossing side to any partner: the least over them
            return tuple(np.stack([x[0], x[1:].min(axis=0)]) for x in (self.out, self.inn))
        row = {c: j + 1 for j, c in enumerate(self.partners)}
        after = dict(zip(cross.order, cross.order[1:]))
        before = dict(zip(cross.order[1:], cross.order))
        into = np.array([self.out[row[after[c]], o] if c in after else math.inf for o, c in enumerate(cls.tolist())])
        out_of = np.array([self.inn[row[before[c]], o] if c in before else math.inf for o, c in enumerate(cls.tolist())])
        return np.stack([self.out[0], into]), np.stack([self.inn[0], out_of])


class Packing:
    """One tuple's tables with its memory limits applied: the tests of a bottleneck M.
    ``U_pos`` [K, p]: the blocks each option holds at each position (None for p = 1);
    ``use_lp``: also the LP over positions (the LP level), else the knapsack level's tests."""

    def __init__(self, lp: PositionLP, knobs: Knobs, arrays, caps: list[int], L: int, tables: list,
                 U_pos: np.ndarray | None, t: Tables, cross: Cross | None = None, over=None,
                 deadline: float = math.inf, use_lp: bool = True):
        self.lp, self.p, self.L, self.caps = lp, knobs.num_stages, L, caps
        self.use_lp = use_lp
        self.units, self.cls = arrays.units, arrays.cls
        self.extra = arrays.extra if arrays.extra.any() else None
        self.G, self.first, self.mid, self.last = tables
        self.U_pos, self.t, self.cross = U_pos, t, cross
        self._lp_model = None
        self.deadline = deadline
        self.nbs = np.arange(1, L + 1, dtype=float)
        finite = [x[np.isfinite(x)] for x in tables if x is not None]
        at = None
        if self.p > 1:
            # per position kind (End) [and crossing variant], [K, L]
            if cross is not None:
                g, self.r_var = t.sends.variants(cross, self.cls)
                at = np.where(over[None, None], math.inf, g)
                finite.append(at[np.isfinite(at)])
            else:
                at = np.stack([self.first, self.first if self.mid is None else self.mid, self.last])
            at = suffix_min(at)
        self.at = at
        self.lo = float(finite[0].min()) if len(finite[0]) else math.inf
        # every table's largest entry: no M below it fails for want of an M
        self.hi = max((float(x.max()) for x in finite if len(x)), default=math.inf)

    def _most(self, table: np.ndarray, M: float) -> np.ndarray:
        return np.where(table <= M, self.nbs, 0.0).max(axis=1)

    def _kinds(self) -> list[End]:
        return position_kinds(self.p)

    def _most_at_positions(self, M: float) -> np.ndarray:
        """[K, p] the most blocks each option holds at each position under M ([V, K, p] per
        crossing variant with ``cross``)."""
        most = (self.at <= M).sum(axis=-1)[self._kinds()]                  # [p, (V,) K]
        most = np.moveaxis(most, 0, -1)
        return np.minimum(most, self.U_pos)

    def positions_hold(self, M: float) -> bool:
        """Whether the p positions, each on its own, can hold the L blocks under M: the most
        any option holds at each position, summed (no capacities; microseconds, where the LP
        takes milliseconds).  A 1F1B pipeline's first stages hold the most micro-batches in
        flight: with large micro-batches they hold few blocks of any option, which the
        positionless knapsack cannot see."""
        most = self._most_at_positions(M)
        return float(most.reshape(-1, self.p).max(axis=0).sum()) >= self.L

    def holds(self, M: float) -> bool:
        """Whether p stages whose g is at most M can hold the L blocks (necessary conditions)."""
        p, L = self.p, self.L
        any_ = self._most(self.G, M)
        usable = any_ >= 1
        if not usable.any():
            return False
        u, c = self.units[usable], self.cls[usable]
        # exactly p stages, each one option that holds at least one block under M
        if float(most_speed(any_[usable], u, c, self.caps, p, exact=True)[p - 1]) < L:
            return False
        if self.mid is not None:
            # p - 2 of them are middle stages: each holds at most its middle count; the first
            # (last) stage at most that plus the most any option gains at the first (last)
            mid = self._most(self.mid, M)[usable]
            gain = sum(float(np.maximum(self._most(end, M)[usable] - mid, 0.0).max()) for end in (self.first, self.last))
            if float(most_speed(mid, u, c, self.caps, p, exact=True)[p - 1]) + gain < L:
                return False
        if self.U_pos is None:
            return True
        if not self.positions_hold(M):
            return False
        if not self.use_lp:
            return True
        model = self._model()
        return model is not None and model.reaches(self._most_at_positions(M), L)

    def bottleneck(self, need: float) -> float:
        """The least M that ``holds`` (its infeasible end, by bisection); inf when none does.
        ``need``: the M that would prune the tuple: when it does not hold, ``need`` is
        returned; otherwise a few steps only (for the reported gap)."""
        lo, hi = self.lo, self.hi
        if not math.isfinite(lo):
            return math.inf
        if need <= lo:
            return lo
        if need < hi:
            if not self.holds(need):
                return need
            hi, steps = need, BISECT_STEPS
        elif not self.holds(hi):
            return math.inf
        else:
            steps = BISECT_STEPS if math.isfinite(need) else 30
        for _ in range(steps):
            if hi - lo <= 1e-6 * hi or clock.now() > self.deadline:
                break
            mid = 0.5 * (lo + hi)
            if self.holds(mid):
                hi = mid
            else:
                lo = mid
        return lo

    def _fill_args(self, M: float) -> tuple:
        t = self.t
        kinds = self._kinds()
        icpt = t.r_icpt[:, kinds] if self.cross is None else self.r_var[kinds].transpose(1, 2, 0)
        return (self._most_at_positions(M), t.r_slope, icpt, self.units, self.cls, self.caps, self.L, self.cross,
                self.extra)

    def _model(self) -> PositionModel | None:
        """The LP over every column the largest bottleneck allows (built once per packing:
        the bisection and the fill's grid only allow fewer)."""
        if self._lp_model is None:
            most, _, icpt, *_ = self._fill_args(self.hi)
            self._lp_model = self.lp.model(most, self.units, self.cls, self.caps, self.cross, self.t.r_slope,
                                           icpt, self.extra) or False
        return self._lp_model or None

    @property
    def lp_model(self) -> PositionModel | None:
        """The position LP, when one was built."""
        return self._lp_model or None

    def fill(self, M: float, args: tuple | None = None) -> float:
        """The least the summed rows can total over p stages whose g is at most M (the LP;
        ``args``: ``_fill_args(M)`` when the caller has them)."""
        model = self._model()
        if model is None:
            return math.inf
        return model.least_fill((args or self._fill_args(M))[0], self.L)

    def with_fill(self, M0: float, sums: float, enough: float) -> float:
        """``min over M > M0`` of ``M + max(sums, fill(M))``: every plan's bottleneck exceeds
        M0 (``bottleneck``); one in (a, b] costs at least ``a + fill(b)`` (the fill only falls
        as M grows), one above the grid's top at least ``top + fill(hi)``.  The grid reads
        the fill's dual bound at the last LP's prices (no LP; each LP's prices lift the rest);
        the interval that binds gets the LP, then is halved."""
        f_top = max(sums, self.fill(self.hi))
        if not math.isfinite(f_top):
            return math.inf
        if M0 + f_top >= enough:
            return M0 + f_top
        lp = self.lp
        grid = []                               # [a, b, max(sums, fill(b)) or a bound on it, LP args or None]
        a = M0
        while True:
            # an interval loses at most its width: a share of the objective, not of M (with
            # GPipe's single micro-batch the max terms are a sliver of it)
            b = min(self.hi, a + FILL_STEP * (a + f_top))
            args = self._fill_args(b)
            grid.append([a, b, max(sums, lp.fill_dual_bound(*args)), args])
            if b >= self.hi or b + f_top >= enough or len(grid) >= FILL_POINTS:
                break
            a = b
        tail = b + f_top
        halvings = 0
        while True:
            i = min(range(len(grid)), key=lambda j: grid[j][0] + grid[j][2])
            a, b, fb, args = grid[i]
            if a + fb >= min(tail, enough) or clock.now() > self.deadline:
                break
            if args is not None:
                grid[i] = [a, b, max(fb, sums, self.fill(b, args)), None]
                for row in grid:                # the new prices may lift the others
                    if row[3] is not None:
                        row[2] = max(row[2], lp.fill_dual_bound(*row[3]))
                continue
            if halvings >= FILL_REFINE or b - a <= 1e-6 * b:
                break
            halvings += 1
            mid = 0.5 * (a + b)
            grid[i:i + 1] = [[a, mid, max(sums, self.fill(mid)), None], [mid, b, fb, None]]
        return min(tail, min(a + fb for a, _, fb, _ in grid))
