"""The max terms of a knob tuple bounded together, and then with the pipeline's fill (the
knob bound's knapsack and LP levels; docs/search-space.md, "How it is searched", step 2;
the level after them, the max terms apart, is apart.py).

The separate bounds of bound.py price each objective term on its own.  Here every stage
counts all its max-term rows at once, ``g(s) = sum_t w_t row_t(s)`` (pipeline rows with their
weights, the exposed DP sync, the optimizer step; ``sum_t w_t max_s row_t(s) >= max_s g(s)``),
at its own position: the first stage pays the embedding and one send, a middle stage two
sends, the last the head; each position has its own memory limit (micro-batches in flight).

1. **Bottleneck.** With ``max_s g(s) <= M`` option o holds at most the largest nb with
   ``G[o, nb] <= M`` at a position.  p stages must hold all L blocks: a knapsack over exactly
   p whole options within the classes' capacities (pieces.most_speed), the positions each on
   its own (the most any option holds at each position's memory limit, summed; these two are
   the knapsack level), and the LP relaxation of one option per position
   (position_lp.PositionLP.most_blocks); for a set of two or more
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

from planner.cost import CostContext
from planner.cost.comm import exposed_sync_parts
from planner.cost.memory import stage_holds
from planner.search import clock
from planner.search.apart import bound_apart
from planner.search.knobs import Knobs, OptionKey, knob_rows
from planner.search.mixed import StandIn
from planner.search.packing import KNAPSACK_STAGES, MaxTerms, Packing, Sends, Tables
from planner.search.pieces import block_limits
from planner.search.position_lp import Cross, PositionLP, orders
from planner.search.schedules import SCHEDULES
from planner.search.slots import ENDS_ORDER, POSITIONS, End, Position, Quantity

STAGE_COST_ENTRIES = 256    # [options x blocks] tables kept (~0.25 MB each on c)
SUPPORT_ENTRIES = 4096      # knob tuples whose fill LPs' options are kept (a few options each)


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
        # per knob tuple, the options its fill LPs' optima take, with their weights: a few
        # options that a plan near the bound is likely made of (support_plans.support_plan)
        self.support: dict = {}

    def __call__(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], pieces: tuple, L: int,
                 enough: float, sums: float, lp: bool = True, num_classes: int = 0, apart: bool = False,
                 ordered: bool = False) -> float:
        """A lower bound on the whole objective of every plan of the tuple (``pieces``: the
        knob bound's (key of its options and rows, arrays, U at the fewest in flight);
        ``sums``: its bound on the sum terms).  At least ``enough`` once that is shown (the search's pruning
        threshold); the bound with the fill only while below it.  ``lp=False``: the
        knapsacks alone (no LP over positions, no fill).  ``num_classes`` >= 2: for plans
        using exactly that many classes (those of ``keys``), whose LPs count the crossings
        between classes (position_lp.Cross), and with ``ordered`` one LP per order of the
        classes and one for more crossings (position_lp.orders; up to 7x the LPs).
        ``apart``: then also with the pipeline's max terms and the stages' own bounded apart
        (apart.py; seconds, for the tuples too big for the exact MILP)."""
        p = knobs.num_stages
        if p > KNAPSACK_STAGES:
            return sums
        lp = lp and clock.now() <= self.deadline
        t = self.stage_tables(knobs, ctx, keys, pieces, L)
        U_pos = self.position_limits(knobs, pieces[1], L) if p > 1 else None
        bound = self.bound_on(knobs, t, pieces, L, U_pos, num_classes, enough, sums, lp=lp, keep=True,
                              ordered=ordered)
        if apart and lp and p > 1 and bound < enough:
            bound = max(bound, bound_apart(self, knobs, ctx, keys, pieces, L, U_pos, enough, sums, bound,
                                           num_classes))
        return bound

    def bound_on(self, knobs: Knobs, t: Tables, pieces: tuple, L: int, U_pos: np.ndarray | None,
                 num_classes: int, enough: float, sums: float, lp: bool = True, keep: bool = False,
                 ordered: bool = False) -> float:
        """``__call__``'s bound on the max terms ``t`` sums (with ``sums`` and the fill),
        each option holding at most ``U_pos`` [K, p] blocks at each position; ``keep``: keep
        the fill LP's options as the tuple's support; ``ordered``: the least over the class
        orders' LPs (``__call__``)."""
        p = knobs.num_stages
        self._lp.deadline = self.deadline
        U = pieces[2]
        over = np.arange(1, L + 1)[None, :] > U[:, None]
        tables = [None if x is None else np.where(over, math.inf, x) for x in (t.g, t.first, t.mid, t.last)]
        cross = (Cross(num_classes, SCHEDULES[knobs.schedule].wraps)
                  if num_classes >= 2 and p > 1 and lp and t.sends is not None else None)
        crosses = orders(cross, t.sends.partners) if ordered and cross is not None else [cross]
        capacities = [c.capacity_units for c in self.classes]
        least, kept = math.inf, None
        for each in crosses:
            # an order's LP need only show that it is at least the least so far
            packing = Packing(self._lp, knobs, pieces[1], capacities, L, tables, U_pos, t, each, over,
                              self.deadline, use_lp=lp)
            bound = self._bound_with(packing, p, min(enough, least), sums, lp)
            if bound < least:
                least, kept = bound, packing
        if keep and kept is not None and kept.lp_model is not None:
            self._keep_support(knobs, pieces[1].keys, kept, num_classes, least)     # the LP's options, in its order
        return least

    @staticmethod
    def _bound_with(packing: Packing, p: int, enough: float, sums: float, lp: bool) -> float:
        need = enough - sums
        M = packing.bottleneck(need)
        if not math.isfinite(M):
            return math.inf                     # p stages cannot hold the blocks at all
        if M >= need:
            return enough                       # M = need did not hold the blocks (sums + need may round below)
        if p == 1 or not lp:
            return sums + M
        return max(sums + M, packing.with_fill(M, sums, enough))

    def support_of(self, knobs: Knobs, most: int) -> dict[OptionKey, float]:
        """The ``most`` options the tuple's fill LPs' optima weighed most, with their weights
        (about how many stages each took), on the set of classes with the least bound (the
        bound over all classes where no set has its own): a plan near the bound is likely made
        of them.  (Each set's LP makes every class of the set hold a stage: the union over the
        sets would mix in the slow classes.)  Heaviest first."""
        by_set = self.support.get(knobs, {})
        own = {classes: entry for classes, entry in by_set.items() if classes} or by_set
        if not own:
            return {}
        _, weights = min(own.values(), key=lambda entry: entry[0])
        return {k: weights[k] for k in sorted(weights, key=lambda k: -weights[k])[:most]}

    def _keep_support(self, knobs: Knobs, keys: list[OptionKey], packing: Packing, num_classes: int,
                      bound: float) -> None:
        """Per tuple and set of classes (0: the bound over all of them, any set), the bound
        and the options its LPs' optima weighed, with their largest weight."""
        model = packing.lp_model
        if model is None or not model.option_weights:
            return
        if knobs not in self.support and len(self.support) >= SUPPORT_ENTRIES:
            del self.support[next(iter(self.support))]          # the oldest
        classes = tuple(sorted({k.cls for k in keys})) if num_classes else ()
        self.support.setdefault(knobs, {})[classes] = (bound, {keys[o]: w for o, w in model.option_weights.items()})

    def stage_tables(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], pieces: tuple,
                     L: int, group: MaxTerms = MaxTerms.ALL) -> Tables:
        """The tuple's tables summing the max terms of ``group``."""
        table_key, arrays, _ = pieces
        ck = (table_key, min(knobs.num_stages, 3), group)
        hit = self._tables.get(ck)
        if hit is None:
            if len(self._tables) >= STAGE_COST_ENTRIES:
                del self._tables[next(iter(self._tables))]      # the oldest
            hit = self._tables[ck] = self._unlimited(knobs, ctx, keys, arrays, L, group)
        return hit

    def _unlimited(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], arrays, L: int,
                   group: MaxTerms) -> Tables:
        """Each option's lines (forward, backward, optimizer, and the sync less backward /
        gather less forward through ``exposed_sync_parts``) at every block count and
        position, the max terms of ``group`` summed, plus the sends the stage pays there (``_option_sends``): a middle stage
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
        f, b = Quantity.FORWARD, Quantity.BACKWARD
        rs, ag = Quantity.SYNC_LESS_BACKWARD, Quantity.GATHER_LESS_FORWARD
        slope[:, rs], slope[:, ag] = exposed_sync_parts(ctx, d_slope, slope[:, f], slope[:, b], rep_slope)
        at[:, :, rs], at[:, :, ag] = exposed_sync_parts(ctx, d_icpt, at[:, :, f], at[:, :, b], rep_icpt)
        nbs = np.arange(1, L + 1, dtype=float)
        Q = slope[:, None, None, :] * nbs[None, None, :, None] + at[:, :, None, :]    # [K, positions, L, quantities]
        rows, terms = knob_rows(knobs, any(isinstance(k, StandIn) for k in keys))
        g = np.zeros(Q.shape[:3])
        r_slope, r_at = np.zeros(len(keys)), np.zeros((len(keys), len(POSITIONS)))
        sends = {"max": [0.0, 0.0], "sum": [0.0, 0.0]}      # weighted send coefficients, out / in
        for t in terms:
            row = rows[t.row]
            if t.kind == "max" and not group.takes(row):
                continue
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
            return Tables(g[:, Position.ONLY], None, None, None, r_slope, r_at[:, [Position.ONLY] * len(End)])
        out2, in2, partners = self._option_sends(ctx, knobs, keys)
        bare = Sends(np.stack([g[:, pos] for pos in ENDS_ORDER]), r_at[:, list(ENDS_ORDER)], tuple(sends["max"]),
                      tuple(sends["sum"]), out2, in2, SCHEDULES[knobs.schedule].wraps, partners)
        # without crossings each side pays its least send, to any partner
        (first, r_first), (mid, r_mid), (last, r_last) = (bare.priced(k, out2.min(axis=0), in2.min(axis=0))
                                                           for k in End)
        r_icpt = np.stack([r_first, r_mid, r_last], axis=1)
        end = np.minimum(first, last)
        if p == 2:
            return Tables(end, first, None, last, r_slope, r_icpt, bare)
        return Tables(np.minimum(mid, end), first, mid, last, r_slope, r_icpt, bare)

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

    def position_limits(self, knobs: Knobs, arrays, L: int) -> np.ndarray:
        """[K, p] blocks each option can hold at each position: the middle stage's memory model
        (the ends add the embedding / head: more memory, so this only loosens) at that
        position's micro-batches in flight and waiting for their W; L where the model is not
        affine."""
        coef, exact, caps = arrays.coef, arrays.exact, arrays.caps
        p, m, v = knobs.num_stages, knobs.num_micro_batches, knobs.virtual_stages
        f, d = zip(*(stage_holds(knobs.schedule, p, s, m, v) for s in range(p)))
        return block_limits(coef, exact, caps, f, L, d)

    def _option_sends(self, ctx, knobs, keys: list[OptionKey]) -> tuple[np.ndarray, np.ndarray, tuple]:
        """[1 + C, K] each, the least send out of and into a stage of each option, to a partner
        of its own class (row 0) and of each of the C classes of ``keys`` (row j + 1 to the
        j-th, the classes returned third; inf to its own class): a
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
        own = np.array([k.cls for k in keys])[:, None]
        partners = tuple(sorted({int(c) for c in ps.cls}))
        to = [ps.cls[None, :] == own] + [(ps.cls[None, :] == c) & (own != c) for c in partners]
        send_out = np.stack([np.where(mask, out, math.inf).min(axis=1) for mask in to])
        send_in = np.stack([np.where(mask, inn, math.inf).min(axis=1) for mask in to])
        return send_out, send_in, partners


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


