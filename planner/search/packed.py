"""The max terms of a knob tuple bounded together, and then with the pipeline's fill (the
knob bound's last level; docs/search-space.md, "How it is searched", step 2).

The separate bounds of bound.py price each objective term on its own.  Here every stage
counts all its max-term rows at once, ``g(s) = sum_t w_t row_t(s)`` (pipeline rows with their
weights, the exposed DP sync, the optimizer step; ``sum_t w_t max_s row_t(s) >= max_s g(s)``),
at its own position: the first stage pays the embedding and one send, a middle stage two
sends, the last the head; each position has its own memory limit (micro-batches in flight).

1. **Bottleneck.** With ``max_s g(s) <= M`` option o holds at most the largest nb with
   ``G[o, nb] <= M`` at a position.  p stages must hold all L blocks: a knapsack over exactly
   p whole options within the classes' capacities (pieces.most_speed), and the LP relaxation
   of one option per position (position_lp.PositionLP.most_blocks); for a set of two or more
   classes, in the LP each stage's sends depend on whether its neighbours are of its class
   (position_lp.Cross).  The least such M, by bisection.
2. **With the fill.** The same blocks also pay the summed rows (1F1B's ``sum_s (F + B)``,
   interleaving's 1/v of it): the smaller M, the more the blocks must spread over slow
   stages.  For each M the LP's least fill bounds the summed rows of every plan whose
   bottleneck is at most M; the objective is at least ``min_M M + fill(M)``, taken over a grid
   of M (each interval at its lower end with the fill of its upper end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.cost import CostContext, in_flight_micro_batches
from planner.cost.comm import exposed_sync_parts
from planner.cost.memory import deferred_w_micro_batches
from planner.search import clock
from planner.search.knobs import Knobs, OptionKey, knob_rows
from planner.search.mixed import StandIn
from planner.search.pieces import block_limits, most_speed
from planner.search.position_lp import VARIANTS, Cross, PositionLP, PositionModel
from planner.search.schedules import SCHEDULES
from planner.search.space import POSITIONS

KNAPSACK_STAGES = 128       # stage counts up to which the knob bound packs whole options (all, for the models we know)
STAGE_COST_ENTRIES = 256    # [options x blocks] tables kept (~0.25 MB each on c)
FILL_STEP = 0.01            # grid step of the bottleneck M for the bound with the fill, of the objective
FILL_POINTS = 24            # grid points at most (above the last, the fill with no bottleneck)
FILL_REFINE = 4             # halvings of the grid interval that binds
BISECT_STEPS = 6            # halvings of the bottleneck's interval once M = need holds (for the reported gap)


@dataclass
class _Tables:
    """Per option, without memory limits: ``g`` [K, L] the least max-term sum at any
    position; ``first``, ``mid``, ``last`` the same at that position (None for p = 1, mid
    None for p = 2); the summed rows, affine in the blocks: ``r_slope`` [K] and ``r_icpt``
    [K, 3] (first, middle, last; sends included).  ``sends`` (None for p = 1): the same
    without sends and what each side's send adds, for the crossing variants."""
    g: np.ndarray
    first: np.ndarray | None
    mid: np.ndarray | None
    last: np.ndarray | None
    r_slope: np.ndarray
    r_icpt: np.ndarray
    sends: _Sends | None = None


@dataclass
class _Sends:
    """A stage's max-term sum and summed-row intercept without its sends (``g`` [3, K, L] and
    ``r`` [K, 3] at the first, middle, last position), the sends' weights in each (``w_max``,
    ``w_sum``: (out, in)) and each side's least send within the class and to another class
    (``out``, ``inn``: [2, K], index 1 = crossing; inf when no other class)."""
    g: np.ndarray
    r: np.ndarray
    w_max: tuple[float, float]
    w_sum: tuple[float, float]
    out: np.ndarray
    inn: np.ndarray
    wraps: bool

    def sides(self, k: int) -> tuple[bool, bool]:
        """Whether a stage at position kind k (0 first, 1 middle, 2 last) sends out and in."""
        return k != 2 or self.wraps, k != 0 or self.wraps

    def priced(self, k: int, out: np.ndarray, inn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([K, L] max-term sums, [K] summed-row intercept) at position kind k with the sends
        ``out`` and ``inn`` [K] on the sides it has."""
        has_out, has_in = self.sides(k)
        o = out if has_out else 0.0
        n = inn if has_in else 0.0
        return (self.g[k] + (self.w_max[0] * o + self.w_max[1] * n)[:, None],
                self.r[:, k] + self.w_sum[0] * o + self.w_sum[1] * n)

    def variants(self) -> tuple[np.ndarray, np.ndarray]:
        """([3, 4, K, L] max-term sums, [3, 4, K] summed-row intercepts) per position kind
        and crossing variant (position_lp.VARIANTS); inf where the variant's crossing side
        does not exist (the first stage's in side, the last's out side, unless it wraps)."""
        g = np.empty((3, len(VARIANTS)) + self.g.shape[1:])
        r = np.empty((3, len(VARIANTS), self.g.shape[1]))
        for k in range(3):
            has_out, has_in = self.sides(k)
            for i, (co, ci) in enumerate(VARIANTS):
                if (co and not has_out) or (ci and not has_in):
                    g[k, i], r[k, i] = math.inf, math.inf
                else:
                    g[k, i], r[k, i] = self.priced(k, self.out[co], self.inn[ci])
        return g, r


class PackedBound:
    """The packed bottleneck and the bound with the fill over one Pricer's options."""

    def __init__(self, pricer):
        self.pricer, self.classes = pricer, pricer.classes
        self._tables: dict = {}
        self._syncs: dict = {}
        self._lp = PositionLP()
        # the search's deadline (clock.now()): past it the bisection and the fill's grid
        # stop where they are, with the bound they have proved (one tuple's LPs can take
        # seconds)
        self.deadline = math.inf

    def __call__(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], pieces: tuple, L: int,
                 enough: float, sums: float, lp: bool = True, num_classes: int = 0) -> float:
        """A lower bound on the whole objective of every plan of the tuple (``pieces``: the
        knob bound's (cache key, arrays, U at the fewest in flight); ``sums``: its bound on
        the sum terms).  At least ``enough`` once that is shown (the search's pruning
        threshold); the bound with the fill only while below it.  ``lp=False``: the
        knapsacks alone (no LP over positions, no fill).  ``num_classes`` >= 2: for plans
        using exactly that many classes (those of ``keys``), whose LPs count the crossings
        between classes (position_lp.Cross)."""
        p = knobs.num_stages
        if p > KNAPSACK_STAGES:
            return sums
        lp = lp and clock.now() <= self.deadline
        self._lp.deadline = self.deadline
        t = self._stage_tables(knobs, ctx, keys, pieces, L)
        U = pieces[2]
        over = np.arange(1, L + 1)[None, :] > U[:, None]
        tables = [None if x is None else np.where(over, math.inf, x) for x in (t.g, t.first, t.mid, t.last)]
        U_pos = self._position_limits(knobs, pieces[1], L) if p > 1 and lp else None
        cross = (Cross(num_classes, SCHEDULES[knobs.schedule].wraps)
                  if num_classes >= 2 and p > 1 and lp and t.sends is not None else None)
        packing = _Packing(self._lp, knobs, pieces[1], [c.capacity_units for c in self.classes], L,
                           tables, U_pos, t, cross, over, self.deadline)
        need = enough - sums
        M = packing.bottleneck(need)
        if not math.isfinite(M):
            return math.inf                     # p stages cannot hold the blocks at all
        if M >= need:
            return enough                       # M = need did not hold the blocks (sums + need may round below)
        if p == 1 or not lp:
            return sums + M
        return max(sums + M, packing.with_fill(M, sums, enough))

    def _stage_tables(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], pieces: tuple,
                      L: int) -> _Tables:
        tk, arrays, _ = pieces
        ck = (tk[:-1], min(knobs.num_stages, 3))  # not the fewest in flight: it reaches the tables through U only
        hit = self._tables.get(ck)
        if hit is None:
            if len(self._tables) >= STAGE_COST_ENTRIES:
                del self._tables[next(iter(self._tables))]      # the oldest
            hit = self._tables[ck] = self._unlimited(knobs, ctx, keys, arrays, L)
        return hit

    def _unlimited(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], arrays, L: int) -> _Tables:
        """Each option's lines (forward, backward, optimizer, and the sync less backward /
        gather less forward through ``exposed_sync_parts``) at every block count and
        position, plus the sends the stage pays there (``_option_sends``): a middle stage
        both ways, the first stage out and the last in (both ends both ways, v each, when the
        schedule wraps)."""
        p = knobs.num_stages
        unit = knobs.block_unit
        d_slope, d_icpt = self._sync_arrays(ctx, keys, unit)
        slope, at = arrays.slopes.copy(), arrays.icpt.copy()           # at: per position
        d_icpt = d_icpt[:, list(SCHEDULES[knobs.schedule].role_positions())]   # as arrays.icpt (bound.py)
        # HSDP's all-reduce across the shard groups: backward-side whole (cost/hsdp.py)
        rep = [self.pricer.replicate_lines(ctx, k, unit) for k in keys]
        rep_slope = np.array([r[0] for r in rep])
        rep_icpt = np.array([r[1] for r in rep]).reshape(len(keys), len(POSITIONS))
        rep_icpt = rep_icpt[:, list(SCHEDULES[knobs.schedule].role_positions())]
        slope[:, 2], slope[:, 4] = exposed_sync_parts(ctx, d_slope, slope[:, 0], slope[:, 1], rep_slope)
        at[:, :, 2], at[:, :, 4] = exposed_sync_parts(ctx, d_icpt, at[:, :, 0], at[:, :, 1], rep_icpt)
        nbs = np.arange(1, L + 1, dtype=float)
        Q = slope[:, None, None, :] * nbs[None, None, :, None] + at[:, :, None, :]    # [K, positions, L, quantities]
        rows, terms = knob_rows(knobs, any(isinstance(k, StandIn) for k in keys))
        g = np.zeros(Q.shape[:3])
        r_slope, r_at = np.zeros(len(keys)), np.zeros((len(keys), len(POSITIONS)))
        sends = {"max": [0.0, 0.0], "sum": [0.0, 0.0]}      # weighted send coefficients, out / in
        for t in terms:
            row = rows[t.row]
            coef = np.array(row.stage, dtype=float)
            if t.kind == "max":
                val = Q @ coef
                for h in row.hinges:
                    val += np.maximum(0.0, Q @ np.array(h, dtype=float))
                g += t.weight * val
            else:
                r_slope += t.weight * (slope @ coef)
                r_at += t.weight * (at @ coef)
            sends[t.kind][0] += t.weight * sum(row.out)
            sends[t.kind][1] += t.weight * sum(row.inn)
        if p == 1:
            return _Tables(g[:, 3], None, None, None, r_slope, r_at[:, [3, 3, 3]])
        out2, in2 = self._option_sends(ctx, knobs, keys)
        bare = _Sends(np.stack([g[:, 1], g[:, 0], g[:, 2]]), r_at[:, [1, 0, 2]], tuple(sends["max"]),
                      tuple(sends["sum"]), out2, in2, SCHEDULES[knobs.schedule].wraps)
        # without crossings each side pays its least send, to any partner
        (first, r_first), (mid, r_mid), (last, r_last) = (bare.priced(k, out2.min(axis=0), in2.min(axis=0))
                                                           for k in range(3))
        r_icpt = np.stack([r_first, r_mid, r_last], axis=1)
        end = np.minimum(first, last)
        if p == 2:
            return _Tables(end, first, None, last, r_slope, r_icpt, bare)
        return _Tables(np.minimum(mid, end), first, mid, last, r_slope, r_icpt, bare)

    def _sync_arrays(self, ctx: CostContext, keys: list[OptionKey], unit: int) -> tuple[np.ndarray, np.ndarray]:
        """([K] slope, [K, positions] intercepts) of the options' gradient syncs
        (Pricer.sync_lines), once per (context, options, unit): the tables of every schedule,
        m and p on them share it (a third of the knapsack level's time on scenario e was
        these lines asked again)."""
        ck = (self.pricer.cache_id(ctx), id(keys), len(keys), unit)
        hit = self._syncs.get(ck)
        if hit is None:
            sync = [self.pricer.sync_lines(ctx, k, unit) for k in keys]
            d_slope = np.array([s[0] for s in sync])
            d_icpt = np.array([s[1] for s in sync]).reshape(len(keys), len(POSITIONS))
            hit = self._syncs[ck] = (d_slope, d_icpt, keys)     # keys kept alive: id() stays unique
        return hit[0], hit[1]

    def _position_limits(self, knobs: Knobs, arrays, L: int) -> np.ndarray:
        """[K, p] blocks each option can hold at each position: the middle stage's memory model
        (the ends add the embedding / head: more memory, so this only loosens) at that
        position's micro-batches in flight and waiting for their W; L where the model is not
        affine."""
        coef, exact, caps = arrays.coef, arrays.exact, arrays.caps
        p, m, v = knobs.num_stages, knobs.num_micro_batches, knobs.virtual_stages
        f = [in_flight_micro_batches(knobs.schedule, p, s, m, v) for s in range(p)]
        d = [deferred_w_micro_batches(knobs.schedule, p, s, m) for s in range(p)]
        return block_limits(coef, exact, caps, f, L, d)

    def _option_sends(self, ctx, knobs, keys: list[OptionKey]) -> tuple[np.ndarray, np.ndarray]:
        """[2, K] each, the least send out of and into a stage of each option, to a partner of
        its own class (row 0) and of another class (row 1; inf when ``keys`` has none): a
        boundary's busiest point carries at least one transfer and, on the option's side,
        its largest share ceil(B / n) of sequences (``L0 + ceil(B / n) X``, the sender's
        line), and across a capped zone link no less than the whole micro-batch
        (``shared_link``); the least over the partners in ``keys`` (``partner_sends``)."""
        B = knobs.micro_batch_size
        ps = partner_sends(self.pricer, ctx, B, keys)
        t = ps.type_of
        share = np.array([-(-B // k.replicas) for k in keys], dtype=float)[:, None]
        out = np.maximum(ps.L0[t] + share * ps.X[t], ps.shared[t])                # [K, partner type]
        inn = np.maximum(ps.L0[:, t].T + share * ps.X[:, t].T, ps.shared[:, t].T)
        crossing = ps.cls[None, :] != np.array([k.cls for k in keys])[:, None]
        send_out = np.stack([np.where(crossing, math.inf, out).min(axis=1), np.where(crossing, out, math.inf).min(axis=1)])
        send_in = np.stack([np.where(crossing, math.inf, inn).min(axis=1), np.where(crossing, inn, math.inf).min(axis=1)])
        return send_out, send_in


@dataclass
class PartnerSends:
    """Send lines between the partner types of a key list: [T, T] each, from type to type."""
    L0: np.ndarray
    X: np.ndarray
    shared: np.ndarray
    cls: np.ndarray             # [T] the class a type counts in (a stand-in's: its primary's)
    type_of: np.ndarray         # [K] each key's type


def partner_sends(pricer, ctx, B: int, keys: list) -> PartnerSends:
    """A partner type is a key's (send groups, class): one (class, TP) for an option, two for
    a mixed stage's stand-in (mixed.StandIn), whose transfers take either kind's paths.  The
    lines between two types are the least over their group pairs, L0 and X apart (a replica's
    transfers to two kinds sum to at least the least L0 plus its sequences at the least X),
    which for single groups is just the pair's line."""
    types = list(dict.fromkeys((k.send_groups, k.cls) for k in keys))
    groups = sorted({g for gs, _ in types for g in gs})
    index = {g: i for i, g in enumerate(groups)}
    L0, X, shared = pricer.group_lines(ctx, B, groups)                          # [sender, receiver]
    width = max(len(gs) for gs, _ in types)
    gi = np.array([[index[gs[min(i, len(gs) - 1)]] for i in range(width)] for gs, _ in types])   # [T, width]
    a, b = gi[:, :, None, None], gi[None, None, :, :]

    def least(m: np.ndarray) -> np.ndarray:
        return m[a, b].min(axis=(1, 3)) if width > 1 else m[gi[:, 0][:, None], gi[:, 0][None, :]]

    pos = {t: i for i, t in enumerate(types)}
    return PartnerSends(least(L0), least(X), least(shared), np.array([c for _, c in types]),
                        np.array([pos[(k.send_groups, k.cls)] for k in keys]))


class _Packing:
    """One tuple's tables with its memory limits applied: the tests of a bottleneck M."""

    def __init__(self, lp: PositionLP, knobs: Knobs, arrays, caps: list[int], L: int, tables: list,
                 U_pos: np.ndarray | None, t: _Tables, cross: Cross | None = None, over=None,
                 deadline: float = math.inf):
        self.lp, self.p, self.L, self.caps = lp, knobs.num_stages, L, caps
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
            # per position kind (first, middle, last) [and crossing variant], [K, L]
            if cross is not None:
                g, self.r_var = t.sends.variants()
                at = np.where(over[None, None], math.inf, g)
                finite.append(at[np.isfinite(at)])
            else:
                at = np.stack([self.first, self.first if self.mid is None else self.mid, self.last])
            # the suffix minimum over block counts: the most blocks under M (the largest nb
            # with g <= M) is then how many entries are at most M; the memory limit per
            # position is applied after that (the largest nb <= U_pos with g <= M may be
            # smaller where g falls as nb grows: only loosens)
            at = np.flip(np.minimum.accumulate(np.flip(at, axis=-1), axis=-1), axis=-1)
        self.at = at
        self.lo = float(finite[0].min()) if len(finite[0]) else math.inf
        # every table's largest entry: no M below it fails for want of an M
        self.hi = max((float(x.max()) for x in finite if len(x)), default=math.inf)

    def _most(self, table: np.ndarray, M: float) -> np.ndarray:
        return np.where(table <= M, self.nbs, 0.0).max(axis=1)

    def _kinds(self) -> list[int]:
        return [0] + [1] * (self.p - 2) + [2]

    def _most_at_positions(self, M: float) -> np.ndarray:
        """[K, p] the most blocks each option holds at each position under M ([4, K, p] per
        crossing variant with ``cross``)."""
        most = (self.at <= M).sum(axis=-1)[self._kinds()]                  # [p, (4,) K]
        most = np.moveaxis(most, 0, -1)
        return np.minimum(most, self.U_pos)

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
