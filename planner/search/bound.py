"""Lower bounds on a knob tuple before it is priced (docs/search-space.md, "How it is
searched", step 2).

The search ranks thousands of knob tuples and prunes most of them unpriced: a tuple whose
bound is at least the incumbent's objective cannot hold a better plan.  ``KnobBound`` reads
each option's lines (middle-stage slopes, per-position intercepts), its memory model and the
least sends from the ``Pricer``, never the per-stage pricing or the K x K send table, so a
bound costs milliseconds.  Every bound here must stay at most the tuple's optimum: the tests
hold it to the brute-force oracle on the seeded cases.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from planner.cost import CostContext, in_flight_micro_batches
from planner.search import clock
from planner.search.fill import joint_row_bound, sum_bound
from planner.search.knobs import Knobs, OptionKey, knob_rows
from planner.search.mixed import StandIn
from planner.search.option_arrays import OptionArrayCache
from planner.search.packed import PackedBound, partner_sends
from planner.search.packing import KNAPSACK_STAGES
from planner.search.schedules import SCHEDULES
from planner.search.slots import ENDS_ORDER, Position
from planner.search.space import Pricer
from planner.search.term_parts import TermParts

SUBSET_CLASSES = 4          # classes up to which the knob bound goes over every set of them (2^4 - 1)
SUBSET_MEMO = 50_000         # knob tuples whose per-subset bounds are kept (to order the next level's subsets)
_F_BUCKETS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0)


class KnobBound:
    """Knob-tuple bounds over one Pricer's options; caches per (context, B, options), so the
    knob tuples of one search that differ only in p, m or the schedule share the work (the
    per-row pieces are keyed by the rows themselves, which for some schedules change with p)."""

    def __init__(self, pricer: Pricer):
        self.pricer = pricer
        self.model, self.classes = pricer.model, pricer.classes
        self._arrays = OptionArrayCache(pricer)
        self._term_parts = TermParts(self.classes)
        self._fmin: dict = {}
        self._least: dict = {}
        self._about_keys: dict = {}     # (id(keys), len(keys)) -> (classes, holds a stand-in, keys)
        self._by_subset: dict = {}      # (knobs, id(keys)) -> {classes: their last bound}
        self._packed = PackedBound(pricer)

    def __call__(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], memory: bool = True,
                 enough: float = math.inf, packed: int = 2, enough_on=None, ordered: bool = False) -> float:
        """A lower bound on every plan of this knob tuple (``whole``).  With memory and
        options of a few classes, the least of that bound over the sets S of classes a plan
        can use (every plan uses exactly one S): on S's options alone, where a pipeline over
        |S| >= 2 classes also has at least |S| - 1 boundaries between stages of different
        classes (|S| when it wraps) and p must be at least |S|.  The two pull apart: the rates
        of several classes come only with their sends between classes (often across a zone
        link), one class's sends only with its own rates.  A bound of at least ``enough``
        (the search's pruning threshold) may be returned before the subsets are tried: it
        prunes the tuple all the same.  ``packed``: 0 (or False) without ``PackedBound``
        (packed.py); 1 with its knapsacks alone (milliseconds); 2 (or True) also with its LPs
        over positions and the fill (a tenth of a second on c); 3 also with the max terms
        apart (apart.py; seconds on c, for the tuples too big for the exact MILP).  The
        search asks for each in turn, for the tuples still in the way.  ``ordered`` (with
        ``packed`` >= 2): each set's LPs once per order of its classes (position_lp.orders).  ``enough_on(classes)``: for the cost
        objectives, the time each set of classes must be shown to take (its plans rent more
        or less): every set is then bounded to its own threshold, not only the least one
        (``by_classes`` reads them)."""
        present = self._classes_of(keys)
        if not memory or not 2 <= len(present) <= SUBSET_CLASSES:
            return self.whole(knobs, ctx, keys, memory, enough=enough, packed=packed)
        whole = self.whole(knobs, ctx, keys, True, enough=enough, packed=packed)
        if whole >= enough:
            return whole
        # Subsets in the order of their last bounds (each bounds every plan of its subset):
        # once the least so far is at most a subset's last bound, that subset cannot be the
        # least; each is asked only to show that it is at least the least so far, and keeps
        # the larger of its two bounds.
        last = self._by_subset.get((knobs, id(keys)), {})
        subsets = [sub for size in range(1, min(len(present), knobs.num_stages) + 1)
                   for sub in itertools.combinations(present, size)]
        subsets.sort(key=lambda sub: last.get(sub, -math.inf))
        now, best = dict(last), math.inf
        for subset in subsets:
            own = enough_on(subset) if enough_on is not None else None
            if own is None and last.get(subset, -math.inf) >= best:
                break
            if own is not None and last.get(subset, -math.inf) >= own:
                best = min(best, last.get(subset, -math.inf))      # already shown, or not needed
                continue
            if clock.now() > self._packed.deadline:
                best = min(best, last.get(subset, -math.inf))      # the search is out of time
                continue
            now[subset] = max(last.get(subset, -math.inf),
                              self.whole(knobs, ctx, self._arrays.subset_keys(keys, subset), True, len(subset),
                                         min(enough, best) if own is None else own, packed, ordered))
            best = min(best, now[subset])
        self._by_subset.pop((knobs, id(keys)), None)               # re-inserted: the newest
        if len(self._by_subset) >= SUBSET_MEMO:
            del self._by_subset[next(iter(self._by_subset))]       # the least recently stored
        self._by_subset[(knobs, id(keys))] = now
        return max(best, whole)        # both bound every plan (a subset's may round below the whole's)

    def orders_apply(self, knobs: Knobs, keys: list[OptionKey]) -> bool:
        """Whether ``ordered`` can lift the tuple's bound: a pipeline that does not wrap, over
        options of two or more classes (its sets of 2-3 classes get the class orders' LPs)."""
        return (not SCHEDULES[knobs.schedule].wraps and 2 <= knobs.num_stages <= KNAPSACK_STAGES
                and 2 <= len(self._classes_of(keys)) <= SUBSET_CLASSES)

    def by_classes(self, knobs: Knobs, keys: list[OptionKey]) -> dict:
        """The last memory-aware bound of the plans on each set of classes (empty until one is
        computed, and for tuples of one class or more than SUBSET_CLASSES): for the cost
        objectives' floors per set of classes (floors.py)."""
        return self._by_subset.get((knobs, id(keys)), {})

    def support(self, knobs: Knobs, most: int) -> dict[OptionKey, float]:
        """The ``most`` options the tuple's position LPs weighed most, with their weights
        (packed.py), heaviest first."""
        return self._packed.support_of(knobs, most)

    def set_deadline(self, deadline: float) -> None:
        """Past ``deadline`` (clock.now()) the packed bound's LPs stop early with the
        (lower) bound they have proved: the search's time limit holds."""
        self._packed.deadline = deadline

    def _classes_of(self, keys: list[OptionKey]) -> tuple[int, ...]:
        return self._about(keys)[0]

    def _has_stand_ins(self, keys: list[OptionKey]) -> bool:
        """Whether ``keys`` holds a mixed stage's stand-in (its rows differ: knob_rows)."""
        return self._about(keys)[1]

    def _about(self, keys: list[OptionKey]) -> tuple:
        """(the classes of ``keys``, whether one is a stand-in), once per key list (kept alive
        with them: the key is its id)."""
        ck = (id(keys), len(keys))
        hit = self._about_keys.get(ck)
        if hit is None:
            hit = self._about_keys[ck] = (tuple(sorted({k.cls for k in keys})),
                                          any(isinstance(k, StandIn) for k in keys), keys)
        return hit

    def whole(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], memory: bool,
              num_classes: int = 0, enough: float = math.inf, packed: int = 2, ordered: bool = False) -> float:
        """A lower bound on every plan of this knob tuple, from middle-stage slopes, memory,
        each position's least intercept and the least send (no per-position pricing, no send
        table).  An option holds at most ``U`` blocks, its
        memory limit at the fewest in-flight micro-batches of any position with the middle
        stages' memory (the ends add the embedding / head); options that cannot hold one block
        drop out.  The pipeline row's max term is then at least the least M with which the
        classes' units can hold L blocks (each option at most min(M / slope, U) blocks per
        stage) and at least ceil(L / p) blocks on one stage; its sum term at least the
        cheapest filling of L blocks into p stages of at most U blocks each, and the
        Cauchy-Schwarz fill of ``sum_bound``; with memory also the rate cap of at most p whole
        options (``most_speed``) and the joint bottleneck/fill bound (``joint_row_bound``).
        ``memory=False``: without memory limits (every U = L) and those two, cheaper still (no
        memory pricing): the first ranking of thousands of knob tuples; the search tightens a
        tuple's bound with memory when it gets to it.  With memory, when all that stays below
        ``enough``, the max terms are also bounded together with the exposed DP sync
        (``PackedBound``, packed.py)."""
        unit = knobs.block_unit
        L = self.model.num_layers // unit
        # a stand-in's lines depend on whether the schedule reads forward and backward apart
        # (GPipe: Pricer._stand_in_lines); an option's do not, but the key stays one form
        entry = SCHEDULES[knobs.schedule]
        sk = (self.pricer.cache_id(ctx), knobs.micro_batch_size,
              (unit, entry.reads_apart, entry.head_on_first, entry.reads_input),
              id(keys), len(keys), memory)
        hit = self._arrays.get(sk, knobs, ctx, keys, memory)
        if not len(hit.slopes):
            return math.inf
        p, m, v = knobs.num_stages, knobs.num_micro_batches, knobs.virtual_stages
        fk = (knobs.schedule, p, m, v)
        f_min = self._fmin.get(fk) if memory else 1.0
        if f_min is None:
            f_min = min(in_flight_micro_batches(knobs.schedule, p, s, m, v) for s in range(p))
            # fewer in flight only loosens the bound: round down to a few values so that knob
            # tuples share the work below
            f_min = self._fmin[fk] = max((b for b in _F_BUCKETS if b <= f_min), default=f_min)
        # Per (options, rows, fewest in flight): nothing below depends on p but the last lines,
        # so knob tuples differing in p cost almost nothing where their rows are the same
        # (1F1B's and interleaving's; ZB-H1's and the V schedules' change with p: keyed by the
        # rows themselves, not the schedule, a bound stays a bound); packed.py's stage tables
        # key by the same less f_min (it reaches them through U only)
        stand_ins = self._has_stand_ins(keys)
        rows_terms = knob_rows(knobs, stand_ins)
        base = (sk, knobs.schedule, v, m, f_min)
        if math.isfinite(enough) and not packed:
            # first on rows that tuples of many p share (their per-row pieces are the
            # memory-aware level's main cost where the rows change with p: ZB-H1's): a tuple
            # they prune is pruned
            coarse = knob_rows(knobs, stand_ins, coarse=True)
            if coarse != rows_terms:
                first = self._separate(knobs, ctx, keys, hit, L, f_min, memory, num_classes, coarse, base)[0]
                if first >= enough:
                    return first
        total, sums, U = self._separate(knobs, ctx, keys, hit, L, f_min, memory, num_classes, rows_terms, base)
        if memory and packed and total < enough:
            table_key = (sk, knobs.schedule, v, m, rows_terms)
            total = max(total, self._packed(knobs, ctx, keys, (table_key, hit, U), L, enough, sums, lp=packed >= 2,
                                                num_classes=num_classes, apart=packed >= 3, ordered=ordered))
        return total

    def _separate(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], hit, L: int, f_min: float,
                  memory: bool, num_classes: int, rows_terms: tuple, base: tuple) -> tuple[float, float, np.ndarray]:
        """(the bound with each objective term priced on its own and the joint row gains, its
        sum terms' part, every option's block limit U) on ``rows_terms`` (``whole``)."""
        p = knobs.num_stages
        parts, U = self._term_parts.get((*base[:-1], rows_terms, f_min), base, knobs, hit, L, f_min, memory,
                                        rows_terms)
        total = sums = 0.0
        rows: dict[int, dict] = {}       # per row, its max and sum terms' pieces for the joint bound
        for part in parts:
            if part is None:
                return math.inf, math.inf, U
            speed = part.speed
            rates = part.rates if part.rates is not None and p <= len(part.rates) else None
            if rates is not None:
                speed = min(speed, float(rates[p - 1]))
            k = -(-L // p)
            c_sum, c_stage = self._fixed_costs(ctx, knobs, keys, part, p, num_classes)
            if part.da is None:
                fill, m_p = L * part.a_min, k * part.a_min
            else:
                N = np.minimum(p * part.u_cum, L)
                if part.slots is not None:
                    N = np.minimum(N, part.slots.blocks(p))
                if N[-1] < L:
                    return math.inf, math.inf, U           # p stages cannot hold the blocks
                fill = float(part.da @ N)
                j = int(np.searchsorted(-part.u_desc, -k, side="right"))   # options with U >= k: the first j
                if j == 0:
                    return math.inf, math.inf, U
                m_p = k * float(part.a_prefix[j - 1])
            if part.kind == "sum":
                fill = max(fill, sum_bound(L, p, part.a_min, speed))
                total += part.weight * (fill + c_sum)
                sums += part.weight * (fill + c_sum)
                rows.setdefault(part.row, {})["sum"] = (part.weight, fill, c_sum, part.ratios)
                continue
            if not math.isfinite(part.m_cap):
                return math.inf, math.inf, U
            if part.a_min > 0:
                speed = min(speed, p / part.a_min)
            m_lb = max(L * part.a_min / p, L / speed if speed > 0 else 0.0, part.m_cap, m_p)
            total += part.weight * max(m_lb + c_stage, (fill + c_sum) / p)
            rows.setdefault(part.row, {})["max"] = (part.weight, m_lb, c_stage, (fill + c_sum) / p, rates)
        total += self._joint_gain(rows, L, p)
        return total, sums, U

    @staticmethod
    def _joint_gain(rows: dict, L: int, p: int) -> float:
        """What bounding each summed row together with a max row adds to their separate
        bounds (``joint_row_bound``): a row's sum term with its own max term (1F1B's
        ``(m - 1) max c + sum c``), else with another row's max term (ZB-H1's knob rows,
        ``(m - 1) max c + sum (c - w - k/p w)``, docs/search-space.md "ZB-H1's bound"): every
        option's slope on the summed row is at least ``rho`` times its slope on the max row
        (``term_parts.TermPart.ratios``), so the summed row's blocks cost at least ``rho`` times the max
        row's fill ``T(M)`` at the plan's bottleneck M.  Each max term joins one sum term at
        most, so the gains add."""
        gain, used_max, used_sum = 0.0, set(), set()
        pairs = [(r, r, 1.0) for r, row in rows.items() if "max" in row and "sum" in row]
        pairs += [(r2, r1, rho) for r2, row in rows.items() if "sum" in row and "max" not in row
                  for r1, rho in row["sum"][3]]
        for r2, r1, rho in pairs:
            if r1 in used_max or r2 in used_sum or "max" not in rows.get(r1, {}) or rows[r1]["max"][4] is None:
                continue
            (w_max, m_lb, c_stage, mean, rates), (w_sum, fill, c_sum, _) = rows[r1]["max"], rows[r2]["sum"]
            separate = w_max * max(m_lb + c_stage, mean) + w_sum * (fill + c_sum)
            # w_sum max(fill, rho T(M)) = (w_sum rho) max(fill / rho, T(M))
            joint = (joint_row_bound(L, rates[:p], m_lb, fill / rho, w_max, w_sum * rho)
                     + w_max * c_stage + w_sum * c_sum)
            if joint > separate:
                gain += joint - separate
                used_max.add(r1)
                used_sum.add(r2)
        return gain

    def _fixed_costs(self, ctx, knobs, keys, part, p: int, num_classes: int = 0) -> tuple[float, float]:
        """What the p stages pay whatever their block counts: (summed over stages, the least
        one stage pays): their positions' least intercepts and, in a pipeline, the least send
        of each boundary (the ends of one that does not wrap send on one side only).  A plan
        using exactly ``num_classes`` >= 2 classes has boundaries between classes (see
        ``__call__``), which pay at least the least send between two of them; with p = 2
        every stage is at such a boundary."""
        c_min, (c_out, c_in) = part.c_min, part.sends
        if p == 1:
            return float(c_min[Position.ONLY]), float(c_min[Position.ONLY])
        first, middle, last = (c_min[pos] for pos in ENDS_ORDER)
        c_sum = float(first + last + (p - 2) * middle)
        c_stage = float(min(first, last, middle if p > 2 else math.inf))
        if c_out or c_in:
            wraps = SCHEDULES[knobs.schedule].wraps
            e = self._least_send(ctx, knobs, keys)
            boundaries = p if wraps else p - 1
            cross = 0 if num_classes < 2 else min(boundaries, num_classes if wraps else num_classes - 1)
            e_cross = self._least_send(ctx, knobs, keys, between_classes=True) if cross else e
            c_sum += (c_out + c_in) * ((boundaries - cross) * e + cross * e_cross)
            c_stage += (c_out + c_in if wraps else min(c_out, c_in)) * (e_cross if p == 2 else e)
        return c_sum, c_stage


    def _least_send(self, ctx, knobs, keys: list[OptionKey], between_classes: bool = False) -> float:
        """A lower bound on any one boundary's send (``between_classes``: of one whose two
        stages are of different classes): a boundary's busiest point carries at least one
        transfer of a whole share, and no share is below ``ceil(B / most replicas)``; so
        ``L0 + k X`` at that k, and across a capped zone link no less than the whole
        micro-batch over its aggregate bandwidth; least over the partner types of ``keys``
        (packed.partner_sends: a mixed stage's stand-in sends over either kind's paths).
        Needs only the paths, not the K x K table, so every knob tuple can afford it."""
        if not keys:
            return 0.0
        B = knobs.micro_batch_size
        ck = (self.pricer.cache_id(ctx), B, id(keys), len(keys), between_classes)
        hit = self._least.get(ck)
        if hit is None:
            k = -(-B // max(key.replicas for key in keys))
            ps = partner_sends(self.pricer, ctx, B, keys)
            pairs = ps.cls[:, None] != ps.cls[None, :] if between_classes else np.ones(ps.L0.shape, dtype=bool)
            least = float(np.maximum(ps.L0 + k * ps.X, ps.shared)[pairs].min()) if pairs.any() else 0.0
            hit = self._least[ck] = (least, keys)   # keys kept alive: id() stays unique
        return hit[0]
