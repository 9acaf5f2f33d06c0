"""LP relaxations of choosing one option per pipeline position (packed.py's LP level, and apart.py's).

Each position s takes one option o; at s it holds at most ``most[o, s]`` blocks (below 1: o
is not allowed there), within every class's capacity in units.  Any plan is one integer
choice, so the LP optimum bounds it.  The positionless knapsack (pieces.most_speed) must give
every stage its option's best position; here the first stages of a 1F1B pipeline, with the
most micro-batches in flight, hold fewer blocks of the memory-bound options, and the ends pay
for embedding and head.

**Crossings between classes** (``Cross``).  A plan that uses exactly C >= 2 classes has
boundaries whose two stages are of different classes (at least C - 1; at least C when the
pipeline wraps), and a send across one costs more than a send within a class (another zone,
another network: tens of times more on a cluster of zones).  With ``cross`` each column is
also one of four variants, whether the stage's out and in sides cross (``VARIANTS``); its
``most`` and intercept are the caller's for that variant.  Rows tie the variants together:
boundary b crosses on both of its sides or on neither, a side that does not cross has the
same class on the other side, every class of the plan holds some stage, and at least the
fewest crossings happen.  An integer plan satisfies them all, so the LP still bounds it.

**Class orders** (``orders``; the knob bound's ordered level).  In the LP above a crossing
side pays its least send to any other class, and fractions of several classes at each
position cost no crossing at all; on a cluster of zones whose links differ (5 Gbit/s between
two, 10 between the others) it priced the crossings at the fast links while placing the
classes as only the slow one allows.  A pipeline that does not wrap keeps each class's stages
together or crosses more often: every plan of C classes either runs them in one of the C!
orders with C - 1 crossings, or crosses at least C times.  Each order is its own LP: the first
position holds the first class and the last the last, a stage's class never comes earlier in
the order than its predecessor's (``sum_{rank <= r}`` falls along the positions), and a
crossing out of the r-th class goes into the (r+1)-th, each side at its least send to that
class (``Cross.order``).  The rest cross at least C times (``Cross.more``), each crossing
side naming the class across it (``Cross.partners``: both sides of a boundary name the same
pair).  The least over these LPs bounds every plan; each is a restriction of the LP above.

"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from planner.search import clock

VARIANTS = ((0, 0), (0, 1), (1, 0), (1, 1))    # (out side crosses, in side crosses), per column


@dataclass(frozen=True)
class Cross:
    """Plans using exactly ``num_classes`` >= 2 classes; ``wrap``: the last stage also sends
    to the first (interleaved schedules).  ``order``: only plans running the classes in this
    order, each class's stages together; ``partners``: a crossing side names the class across
    it, one of these; ``more``: crossings beyond the fewest (module docstring)."""
    num_classes: int
    wrap: bool
    partners: tuple[int, ...] = ()
    order: tuple[int, ...] = ()
    more: int = 0

    def boundaries(self, p: int) -> list[tuple[int, int]]:
        return [(s, (s + 1) % p) for s in range(p if self.wrap else p - 1)]

    @property
    def fewest(self) -> int:
        return (self.num_classes if self.wrap else self.num_classes - 1) + self.more

    @property
    def variants(self) -> tuple[tuple[int, int], ...]:
        """Each column's (out side, in side): 0 does not cross, 1 crosses (into the next class
        of ``order``, out of the one before), and with ``partners`` j >= 1 crosses to or from
        ``partners[j - 1]``.  Without partners: VARIANTS."""
        n = len(self.partners) + 1 if self.partners and not self.order else 2
        return tuple((o, i) for o in range(n) for i in range(n))


ORDER_CLASSES = 3   # class orders are tried for sets of at most this many classes (3! = 6 LPs and one more)


def orders(cross: Cross, classes: tuple[int, ...]) -> list[Cross]:
    """The LPs of the ordered level for plans of exactly ``classes`` (module docstring): one per
    order of the classes, and one for the plans crossing at least C times; ``[cross]`` where
    it does not apply (a pipeline that wraps, more than ORDER_CLASSES classes)."""
    C = len(classes)
    if cross.wrap or C != cross.num_classes or not 2 <= C <= ORDER_CLASSES:
        return [cross]
    return ([Cross(C, False, classes, order) for order in itertools.permutations(classes)]
            + [Cross(C, False, classes if C > 2 else (), more=1)])    # two classes: one partner each


class PositionLP:
    """The HiGHS instance the models share (one model is loaded at a time).  ``most`` is
    [K, p] without crossings and [V, K, p] with ``cross`` (its ``variants`` order); ``icpt``
    has the same shape."""

    def __init__(self):
        import highspy

        from planner.search.core.highs import quiet_highs
        self._h = quiet_highs()
        # each run is a new LP of a few thousand columns and a few rows (PositionModel):
        # presolve cost more than it saved there (scenario e's LPs took 1.6x as long with it)
        self._h.setOptionValue("presolve", "off")
        self._hs = highspy
        self.loaded: PositionModel | None = None
        self.deadline = math.inf                 # time.monotonic() past which a run stops unsure
        self.fill_duals: tuple | None = None     # (lam, {class: mu}) of the last least_fill

    def model(self, most: np.ndarray, units: np.ndarray, cls: np.ndarray, capacity: list[int],
              cross: Cross | None = None, slope: np.ndarray | None = None,
              icpt: np.ndarray | None = None, extra: np.ndarray | None = None) -> PositionModel | None:
        """The LP over every column ``most`` allows (None when some position has none): its
        calls may then allow fewer, and HiGHS starts from the last basis.  ``extra`` [K,
        classes]: units an option also takes of other classes (a mixed stage's stand-in)."""
        return PositionModel.build(self, most, units, cls, capacity, cross, slope, icpt, extra)

    def most_blocks(self, most: np.ndarray, units: np.ndarray, cls: np.ndarray, capacity: list[int],
                    cross: Cross | None = None, extra: np.ndarray | None = None) -> float:
        model = self.model(most, units, cls, capacity, cross, extra=extra)
        return -math.inf if model is None else model.most_blocks(most)

    def least_fill(self, most: np.ndarray, slope: np.ndarray, icpt: np.ndarray, units: np.ndarray,
                   cls: np.ndarray, capacity: list[int], L: int, cross: Cross | None = None,
                   extra: np.ndarray | None = None) -> float:
        model = self.model(most, units, cls, capacity, cross, slope, icpt, extra)
        return math.inf if model is None else model.least_fill(most, L)

    def fill_dual_bound(self, most: np.ndarray, slope: np.ndarray, icpt: np.ndarray, units: np.ndarray,
                        cls: np.ndarray, capacity: list[int], L: int, cross: Cross | None = None,
                        extra: np.ndarray | None = None) -> float:
        """A lower bound on ``least_fill`` without an LP: its Lagrangian dual at the prices of
        the last LP solved (a block's price lam, each class's unit price mu >= 0; the
        crossing rows priced at 0, i.e. dropped, which only lowers it),

            lam L - sum_c mu_c cap_c + sum_s min_(v, o) [icpt + mu_c(o) units_o
                                                         + min(slope_o - lam, (slope_o - lam) most)],

        which bounds it for any prices (weak duality) and reaches it at the LP's own when no
        crossing row binds; the fill of a nearby bottleneck has nearly the same prices.  Both
        signs of HiGHS's duals are tried (any choice is valid)."""
        if self.fill_duals is None:
            return -math.inf
        most3 = most.reshape(-1, *most.shape[-2:])
        icpt3 = icpt.reshape(-1, *icpt.shape[-2:])
        ok = most3 >= 1
        if not ok.any(axis=(0, 1)).all():
            return math.inf                     # some position takes no option: no plan
        lam0, mu0 = self.fill_duals
        best = -math.inf
        for lam in (lam0, -lam0):
            for sign in (1.0, -1.0):
                mu = np.array([max(0.0, sign * mu0.get(int(c), 0.0)) for c in range(len(capacity))])
                per = (slope[:, None] - lam)[None]
                used = mu[cls] * units + (0.0 if extra is None else extra @ mu)
                col = icpt3 + used[None, :, None] + np.minimum(per, per * most3)
                col = np.where(ok, col, math.inf)
                value = lam * L - float(mu @ np.asarray(capacity, dtype=float)) + float(col.min(axis=(0, 1)).sum())
                best = max(best, value)
        return best - 1e-6 * max(1.0, abs(best))


class PositionModel:
    """One slot per (variant, option, position) the largest bottleneck allows.  Each run puts
    in the LP only the columns the run's ``most`` allows: per slot, its choices z <= y <=
    most z of the aggregated LP are the mixes of two columns, one block and ``most`` blocks
    (the same units and rows; each stage's cost and blocks are affine in its block count), and
    only the latter for the most blocks.  An LP holding the disallowed columns at zero bounds
    (five in six of them on scenario e) had the same optimum and took twice as long."""

    def __init__(self, lp, v, o, s, top, units, cls, capacity, cross, slope, icpt, extra):
        self.lp, self.v, self.o, self.s, self.top = lp, v, o, s, top
        self.cls, self.cross = cls, cross
        self.slope, self.icpt = slope, icpt          # icpt [slots] at each slot's variant and position
        self.p = int(s.max()) + 1
        self.primary = np.unique(cls[o])
        # every slot's rows, built once: a run gathers the columns it allows (_load)
        rows, self.lower, self.upper, self.cap_rows = _rows(v, o, s, units, cls, capacity, cross, self.p, extra)
        rows.append((np.full(len(o), len(self.lower)), np.arange(len(o)), np.ones(len(o))))   # blocks, last
        self.lower.append(-math.inf)
        self.upper.append(math.inf)
        r, c, val = (np.concatenate(x) for x in zip(*rows))
        order = np.lexsort((r, c))
        self._r, self._val = r[order].astype(np.int32), val[order].astype(float)
        self._start = np.searchsorted(c[order], np.arange(len(o) + 1))
        self._weights = None        # the last optimal solution, per slot (reaches)
        self.option_weights: dict[int, float] = {}   # option -> its most weight in a fill's optimum

    @classmethod
    def build(cls_, lp, most, units, cls, capacity, cross, slope, icpt, extra=None) -> PositionModel | None:
        p = most.shape[-1]
        most3 = most.reshape(-1, *most.shape[-2:]).astype(int)
        v, o, s = np.nonzero(most3 >= 1)
        if len(np.unique(s)) < p:
            return None
        at = None if icpt is None else icpt.reshape(-1, *icpt.shape[-2:])[v, o, s]
        return cls_(lp, v, o, s, most3[v, o, s], units, cls, capacity, cross, slope, at, extra)

    def most_blocks(self, most: np.ndarray) -> float:
        """max blocks over the columns ``most`` allows (-inf when no choice fits)."""
        value_ = self._run(most, "blocks", None)
        if value_ is None:
            return math.inf                     # unsure: claim nothing
        if not math.isfinite(value_):
            return -math.inf                    # infeasible: no choice fits
        return -value_ + 1e-6 * max(1.0, float(np.max(most)))

    def reaches(self, most: np.ndarray, L: float) -> bool:
        """Whether ``most_blocks(most) >= L``, without the LP when the last solution still
        shows it: its choices satisfy every row but the blocks (none depends on ``most``), so
        where each still has a column they hold ``sum w most`` blocks, at most the LP's
        optimum.  A bisection on the bottleneck (packed.py) lowers M mostly by such steps."""
        w = self._weights
        if w is not None:
            m = np.minimum(most.reshape(-1, *most.shape[-2:])[self.v, self.o, self.s], self.top)
            used = w > 0
            if (m[used] >= 1).all() and float(w @ m) + 1e-6 * max(1.0, float(np.max(most))) >= L:
                return True
        return self.most_blocks(most) >= L

    def least_fill(self, most: np.ndarray, L: int) -> float:
        """min summed row over the allowed columns holding exactly L blocks (inf: none can)."""
        value_ = self._run(most, "fill", L)
        if value_ is None:
            return -math.inf                    # unsure: claim nothing
        if not math.isfinite(value_):
            return value_                       # infeasible: no choice holds the blocks
        duals = np.asarray(self.lp._h.getSolution().row_dual)
        self.lp.fill_duals = (float(duals[-1]), {c: float(duals[r]) for c, r in self.cap_rows.items()})
        return value_ - 1e-6 * max(1.0, abs(value_))

    def _run(self, most: np.ndarray, mode: str, L: int | None) -> float | None:
        """Minimise (-blocks or the fill) over the columns ``most`` allows; the optimum's
        value, inf when infeasible, None when HiGHS is unsure."""
        m = np.minimum(most.reshape(-1, *most.shape[-2:])[self.v, self.o, self.s], self.top)
        ok = m >= 1
        if mode == "blocks":
            slot = np.flatnonzero(ok)
            nb = m[slot].astype(float)
        else:
            more = np.flatnonzero(ok & (m > 1))
            slot = np.concatenate([np.flatnonzero(ok), more])
            nb = np.concatenate([np.ones(int(ok.sum())), m[more].astype(float)])
        if len(np.unique(self.s[slot])) < self.p:
            return math.inf                     # some position takes no column
        if self.cross is not None and len(np.unique(self.cls[self.o[slot]])) < len(self.primary):
            return math.inf                     # a class of the plan can hold no stage
        cost = -nb if mode == "blocks" else self.slope[self.o[slot]] * nb + self.icpt[slot]
        h, hs = self.lp._h, self.lp._hs
        self._load(h, hs, slot, nb, cost, L)
        self.lp.loaded = self
        # HiGHS checks its time limit against all the time this instance has run (clearModel
        # does not reset it): the limit is that total plus the time left
        # (a deterministic search: its LPs run to the end, their iterations counted as work,
        # stopped only by the user's wall-clock guard; clock.py)
        left = self.lp.deadline - clock.now() if clock.active() is None else clock.wall_left_s()
        h.setOptionValue("time_limit", h.getRunTime() + max(1e-3, left) if math.isfinite(left) else hs.kHighsInf)
        h.run()
        clock.charge(max(0, int(h.getInfo().simplex_iteration_count)))
        status = h.getModelStatus()
        if status == hs.HighsModelStatus.kInfeasible:
            return math.inf
        if status != hs.HighsModelStatus.kOptimal:
            return None
        x = np.clip(np.asarray(h.getSolution().col_value), 0.0, None)
        self._weights = np.bincount(slot, weights=x, minlength=len(self.v))
        if mode == "fill":
            # which options the fill's optimum takes, for a plan on them (packed.PackedBound.support)
            per_option = np.bincount(self.o, weights=self._weights)
            for o in np.flatnonzero(per_option > 1e-6):
                self.option_weights[int(o)] = max(self.option_weights.get(int(o), 0.0), float(per_option[o]))
        return float(h.getInfo().objective_function_value)

    def _load(self, h, hs, slot: np.ndarray, nb: np.ndarray, cost: np.ndarray, L: int | None) -> None:
        """Pass HiGHS the LP of the columns ``slot`` (a slot twice in the fill: its one block
        and its most), each in [0, 1] at ``cost``, holding ``nb`` blocks."""
        count = np.diff(self._start)[slot]
        ends = np.cumsum(count)
        at = np.arange(int(ends[-1])) - np.repeat(ends - count - self._start[slot], count)
        value = self._val[at]
        value[ends - 1] = nb                    # the blocks row, last in each column
        n = len(slot)
        lower, upper = np.array(self.lower, dtype=float), np.array(self.upper, dtype=float)
        if L is not None:
            lower[-1] = upper[-1] = float(L)
        lp = hs.HighsLp()
        lp.num_col_, lp.num_row_ = n, len(lower)
        lp.col_cost_ = np.asarray(cost, dtype=float)
        lp.col_lower_, lp.col_upper_ = np.zeros(n), np.ones(n)
        lp.row_lower_ = np.where(np.isfinite(lower), lower, -hs.kHighsInf)
        lp.row_upper_ = np.where(np.isfinite(upper), upper, hs.kHighsInf)
        lp.a_matrix_.format_ = hs.MatrixFormat.kColwise
        lp.a_matrix_.start_ = np.concatenate([[0], ends]).astype(np.int32)
        lp.a_matrix_.index_ = self._r[at]
        lp.a_matrix_.value_ = value
        h.clearModel()
        h.passModel(lp)


def _rows(v, o, s, units, cls, capacity, cross: Cross | None, p: int, extra=None) -> tuple:
    """One column per position, the classes' capacities, and with ``cross`` the crossing rows
    (module docstring): (row, column, value) triples, row bounds, each class's capacity row.
    ``extra``: units columns also take of other classes (into those classes' rows; a class
    only reached that way has no stage of its own, so no crossing rows of its own)."""
    n = len(o)
    j = np.arange(n)
    rows, lower, upper = [(s, j, np.ones(n))], [1.0] * p, [1.0] * p
    klass = cls[o]
    cap_rows = {}
    for c in sorted({int(x) for x in klass}):
        mine = klass == c
        cap_rows[c] = len(lower)
        rows.append((np.full(mine.sum(), len(lower)), j[mine], units[o][mine].astype(float)))
        lower.append(-math.inf)
        upper.append(float(capacity[c]))
    if extra is not None:
        for c in np.flatnonzero(extra[o].any(axis=0)):
            c = int(c)
            if c not in cap_rows:
                cap_rows[c] = len(lower)
                lower.append(-math.inf)
                upper.append(float(capacity[c]))
            mine = extra[o, c] > 0
            rows.append((np.full(mine.sum(), cap_rows[c]), j[mine], extra[o, c][mine]))
    primary = sorted({int(x) for x in klass})
    if cross is None:
        return rows, lower, upper, cap_rows
    sides = np.array(cross.variants)
    out_to, in_from = sides[v, 0], sides[v, 1]      # 0: no crossing (module docstring)
    out_x, in_x = out_to > 0, in_from > 0
    rank = {c: r for r, c in enumerate(cross.order)}
    rk = np.array([rank.get(int(c), -1) for c in klass])
    index = {c: j + 1 for j, c in enumerate(cross.partners)}

    def add(mask: np.ndarray, sign: float, row: int) -> None:
        rows.append((np.full(mask.sum(), row), j[mask], np.full(mask.sum(), sign)))

    for c in primary:                           # every class of the plan holds a stage
        add(klass == c, 1.0, len(lower))
        lower.append(1.0)
        upper.append(math.inf)
    add(out_x, 1.0, len(lower))                 # the fewest crossings
    lower.append(float(cross.fewest))
    upper.append(math.inf)
    for a, b in cross.boundaries(p):
        # both sides of a boundary cross, or neither
        add((s == a) & out_x, 1.0, len(lower))
        add((s == b) & in_x, -1.0, len(lower))
        lower.append(0.0)
        upper.append(0.0)
        for c in primary:
            # a side that does not cross has its own class on the other side
            for here, side, there in ((a, ~out_x, b), (b, ~in_x, a)):
                add((s == here) & side & (klass == c), 1.0, len(lower))
                add((s == there) & (klass == c), -1.0, len(lower))
                lower.append(-math.inf)
                upper.append(0.0)
        for r in range(len(cross.order) - 1):
            # the classes up to the r-th in the order only shrink along the pipeline, and a
            # crossing out of the r-th goes into the (r+1)-th
            add((s == a) & (rk <= r), 1.0, len(lower))
            add((s == b) & (rk <= r), -1.0, len(lower))
            lower.append(0.0)
            upper.append(math.inf)
            add((s == a) & (rk == r) & out_x, 1.0, len(lower))
            add((s == b) & (rk == r + 1) & in_x, -1.0, len(lower))
            lower.append(0.0)
            upper.append(0.0)
        if not cross.order:
            # a crossing out of class c into c2 is one into c2 out of c
            for c in primary:
                for c2 in primary:
                    if c2 != c and c in index and c2 in index:
                        add((s == a) & (klass == c) & (out_to == index[c2]), 1.0, len(lower))
                        add((s == b) & (klass == c2) & (in_from == index[c]), -1.0, len(lower))
                        lower.append(0.0)
                        upper.append(0.0)
    if cross.order:
        # the first position holds the order's first class, the last its last
        add(((s == 0) & (rk != 0)) | ((s == p - 1) & (rk != len(cross.order) - 1)), 1.0, len(lower))
        lower.append(-math.inf)
        upper.append(0.0)
    return rows, lower, upper, cap_rows
