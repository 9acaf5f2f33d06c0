"""The declared plan space (docs/search-space.md) and its pricing into CoreProblems.

A *knob* tuple fixes the global choices (logical micro-batch size B and count m, schedule
with its virtual stages, recompute, ZeRO stage, number of stages p).  For each, every stage
option ``(node class, tp, replicas n)`` is priced with the cost model's own pure functions
(``replica_compute``, ``replica_memory``, ``dp_sync_time_s``, ``optimizer_time_s``,
``p2p_time_s``) on representative devices of its class, so the CoreProblem's objective is
``planner.cost`` 's iteration time for the plan that naming.py builds.  Everything per stage
is affine in its block count (identical blocks), which the core relies on; we measure the
slope and intercept at two block counts and re-check memory at the chosen limit.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner.cost import (
    CostContext,
    dp_exposed_s,
    dp_sync_time_s,
    in_flight_micro_batches,
    optimizer_time_s,
    p2p_time_s,
    replica_compute,
    replica_memory_bytes,
    shared_link_time_s,
    stage_params,
)
from planner.search.classes import ClassInfo
from planner.search.core import CoreOption, CoreProblem, Row, Term
from planner.search.core.problem import max_row_bound
from planner.search.pieces import _busiest_points, _max_units, most_speed, replica_counts, shares  # noqa: F401

INTERLEAVE_V = 2            # virtual stages tried for interleaved-1f1b
SUBSET_CLASSES = 4          # classes up to which the knob bound goes over every set of them (2^4 - 1)
KNAPSACK_STAGES = 128       # stage counts up to which the knob bound packs whole options (all, for the models we know)
_F_BUCKETS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0)
QUANTITIES = ("forward", "backward", "sync_less_backward", "optimizer", "gather_less_forward")
POSITIONS = ((False, False), (True, False), (False, True), (True, True))   # middle, first, last, only


@dataclass(frozen=True)
class Knobs:
    micro_batch_size: int       # B: sequences of one logical micro-batch (sum of a stage's shares)
    num_micro_batches: int      # m = global batch / B
    schedule: str
    virtual_stages: int
    recompute: str
    zero_stage: int
    num_stages: int

    @property
    def block_unit(self) -> int:
        """Blocks per core unit: interleaving needs each stage's blocks to split into v chunks."""
        return self.virtual_stages if self.schedule == "interleaved-1f1b" else 1

    def label(self) -> str:
        v = f"x{self.virtual_stages}" if self.schedule == "interleaved-1f1b" else ""
        return (f"p={self.num_stages} B={self.micro_batch_size} m={self.num_micro_batches} "
                f"{self.schedule}{v} rc={self.recompute} zero={self.zero_stage}")


@dataclass(frozen=True)
class OptionKey:
    cls: int
    tp: int
    replicas: int


def tp_degrees(model, info: ClassInfo, max_tp: int) -> list[int]:
    out, t = [], 1
    while t <= min(info.gpus_per_node, max_tp):
        if model.num_attention_heads % t == 0 and model.kv_heads % t == 0:
            out.append(t)
        t *= 2
    return out


def enumerate_knobs(model, training, classes: list[ClassInfo]) -> list[Knobs]:
    gbs, L = training.global_batch_size, model.num_layers
    total_units = sum(c.capacity_units for c in classes)
    max_p = min(L, training.max_stages or L, total_units if all(c.shared_node for c in classes) else 10**9)
    max_p = min(max_p, sum(c.node_class.num_gpus for c in classes))
    out = []
    for B in (d for d in range(1, gbs + 1) if gbs % d == 0):
        m = gbs // B
        for sched in training.schedules:
            v = INTERLEAVE_V if sched == "interleaved-1f1b" else 1
            for rc in training.recompute_modes:
                for z in training.zero_stages:
                    for p in range(1, max_p + 1):
                        if v > 1 and (p < 2 or m % p or L % v or L // v < p):
                            continue
                        out.append(Knobs(B, m, sched, v, rc, int(z), p))
    return out


def make_context(model, training, knobs: Knobs, profiles=None, calibration=None) -> CostContext:
    from planner.cost import default_calibration
    return CostContext(model=model, seq_len=training.seq_len, precision=training.precision,
                       recompute=knobs.recompute, sequence_parallel=training.sequence_parallel,
                       zero_stage=knobs.zero_stage, schedule=knobs.schedule,
                       virtual_stages=knobs.virtual_stages,
                       calibration=calibration or default_calibration(), profiles=profiles)


def _affine(f, unit: int) -> tuple[float, float]:
    """(slope, intercept) per core unit of a function affine in blocks for blocks >= 1."""
    a, b = f(unit), f(2 * unit)
    return b - a, a - (b - a)


class Pricer:
    """Prices the options of one knob tuple; topology paths are cached across knob tuples."""

    def __init__(self, model, training, classes: list[ClassInfo], topology, profiles=None):
        self.model, self.training, self.classes, self.topo = model, training, classes, topology
        self.profiles = profiles
        self._rings: dict = {}
        self._paths: dict = {}
        self._bases: dict = {}
        self._sends: dict = {}
        self._slopes: dict = {}
        self._keys: dict = {}
        self._term_parts: dict = {}
        self._fmin: dict = {}
        self._fb: dict = {}
        self._opt: dict = {}
        self._least: dict = {}
        self._subsets: dict = {}
        self._memory: dict = {}
        self._present: dict = {}
        self._subset_parent: dict = {}  # id(subset keys) -> (those keys, all keys, the classes)
        self._contexts: dict = {}       # id -> context: kept alive, so cache keys by id stay unique

    def _cid(self, ctx) -> int:
        """The context's id for cache keys; the pricer holds the context so the id is not reused."""
        return id(self._contexts.setdefault(id(ctx), ctx))

    def option_keys(self, knobs: Knobs) -> list[OptionKey]:
        hit = self._keys.get(knobs.micro_batch_size)
        if hit is None:
            hit = self._keys[knobs.micro_batch_size] = self._option_keys(knobs)
        return hit

    def _option_keys(self, knobs: Knobs) -> list[OptionKey]:
        allowed_q = set(self.training.micro_batch_sizes or ())
        keys = []
        for info in self.classes:
            for t in tp_degrees(self.model, info, self.training.max_tp):
                for n in replica_counts(knobs.micro_batch_size):
                    if n > info.max_replicas(t) or info.units(t, n) > info.capacity_units:
                        continue
                    if allowed_q and -(-knobs.micro_batch_size // n) not in allowed_q:
                        continue
                    keys.append(OptionKey(info.index, t, n))
        return keys

    def knob_bound(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], memory: bool = True,
                   enough: float = math.inf) -> float:
        """A lower bound on every plan of this knob tuple (``_knob_bound``).  With memory and
        options of a few classes, the least of that bound over the sets S of classes a plan
        can use (every plan uses exactly one S): on S's options alone, where a pipeline over
        |S| >= 2 classes also has at least |S| - 1 boundaries between stages of different
        classes (|S| when it wraps) and p must be at least |S|.  The two pull apart: the rates
        of several classes come only with their sends between classes (often across a zone
        link), one class's sends only with its own rates.  A bound of at least ``enough``
        (the search's pruning threshold) may be returned before the subsets are tried: it
        prunes the tuple all the same."""
        present = self._classes_of(keys)
        if not memory or not 2 <= len(present) <= SUBSET_CLASSES:
            return self._knob_bound(knobs, ctx, keys, memory)
        whole = self._knob_bound(knobs, ctx, keys, True)     # every subset's bound is at least this
        if whole >= enough:
            return whole
        best = math.inf
        for size in range(1, min(len(present), knobs.num_stages) + 1):
            for subset in itertools.combinations(present, size):
                best = min(best, self._knob_bound(knobs, ctx, self._subset_keys(keys, subset), True, size))
        return best

    def _classes_of(self, keys: list[OptionKey]) -> tuple[int, ...]:
        ck = (id(keys), len(keys))
        hit = self._present.get(ck)
        if hit is None:
            hit = self._present[ck] = (tuple(sorted({k.cls for k in keys})), keys)   # keys kept alive
        return hit[0]

    def _slope_arrays(self, sk, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], memory: bool) -> tuple:
        """Per option of ``keys``: middle-stage slopes, units, class, memory model, capacity and
        per-position intercepts (cached under ``sk``).  A class subset's arrays are its parent's
        rows, not priced again."""
        unit = knobs.block_unit
        parent = self._subset_parent.get(id(keys))
        if parent is not None and parent[0] is keys:
            _, full, subset = parent
            psk = (sk[0], sk[1], sk[2], id(full), len(full), memory)
            arrays = self._slopes.get(psk) or self._slope_arrays(psk, knobs, ctx, full, memory)
            mask = np.isin(arrays[2], subset)
            hit = tuple(a[mask] if i != 3 else keys for i, a in enumerate(arrays))
            self._slopes[sk] = hit
            return hit
        if memory:      # the memory-free level's arrays and the memory model
            lsk = sk[:-1] + (False,)
            light = self._slopes.get(lsk) or self._slope_arrays(lsk, knobs, ctx, keys, False)
            models = [self._memory_model(ctx, knobs, k, unit, False, False) for k in keys]
            coef = np.array([mm[0] for mm in models]) if models else np.zeros((0, 4))
            exact = np.array([bool(mm[1]) for mm in models], dtype=bool)
            hit = self._slopes[sk] = light[:4] + (coef, exact) + light[6:]
            return hit
        arr = np.array([self._light(ctx, knobs, k, unit) for k in keys])
        coef, exact = np.zeros((len(keys), 4)), np.zeros(len(keys), dtype=bool)
        caps = np.array([self.classes[k.cls].gpu.memory_bytes for k in keys], dtype=float)
        units = np.array([self.classes[k.cls].units(k.tp, k.replicas) for k in keys], dtype=float)
        cls = np.array([k.cls for k in keys])
        icpt = (np.array([self._intercepts(ctx, knobs, k, unit) for k in keys]) if keys
                else np.zeros((0, len(POSITIONS), len(QUANTITIES))))
        hit = self._slopes[sk] = (arr, units, cls, keys, coef, exact, caps, icpt)   # keys kept alive: id() stays unique
        return hit

    def _subset_keys(self, keys: list[OptionKey], subset: tuple[int, ...]) -> list[OptionKey]:
        """The keys of ``subset`` 's classes, one list per (keys, subset): the caches key by id."""
        ck = (id(keys), len(keys), subset)
        hit = self._subsets.get(ck)
        if hit is None:
            hit = self._subsets[ck] = ([k for k in keys if k.cls in subset], keys)   # keys kept alive
            self._subset_parent[id(hit[0])] = (hit[0], keys, subset)
        return hit[0]

    def _knob_bound(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], memory: bool,
                    num_classes: int = 0) -> float:
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
        tuple's bound with memory when it gets to it."""
        unit = knobs.block_unit
        L = self.model.num_layers // unit
        sk = (self._cid(ctx), knobs.micro_batch_size, unit, id(keys), len(keys), memory)
        hit = self._slopes.get(sk) or self._slope_arrays(sk, knobs, ctx, keys, memory)
        arr, units, cls, _, coef, exact, caps, icpt = hit
        if not len(arr):
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
        # so knob tuples differing in p cost almost nothing.
        tk = (sk, knobs.schedule, v, m, f_min)
        parts = self._term_parts.get(tk)
        if parts is None:
            rows, terms = pipeline_rows(knobs)
            c0, c1, c2, c3 = (coef[:, i] for i in range(4))
            room, per_u = caps - c0 - c2 * f_min, c1 + c3 * f_min
            with np.errstate(divide="ignore", invalid="ignore"):
                U = np.where(per_u > 0, np.floor(room / per_u * (1 + 1e-9) + 1e-9), np.where(room >= 0, L, 0))
            U = np.clip(np.where(exact, U, L), 0, L)     # not affine: no memory limit (still a bound)
            usable = U >= 1
            parts = []
            for t in terms:
                row = rows[t.row]
                if row.hinges:
                    continue
                vals = (arr @ np.array(row.stage, dtype=float))[usable]
                if not len(vals):
                    parts.append(None)
                    continue
                c_min = (icpt @ np.array(row.stage, dtype=float))[usable].min(axis=0)   # per position
                sends = (sum(row.out), sum(row.inn))      # coefficients of a stage's out / in send
                a_min = float(vals.min())
                speed, m_cap, rates = 0.0, 0.0, None
                uu, cc, nn = U[usable], cls[usable], units[usable]
                if a_min > 0:
                    ratio = 1.0 / (vals * nn)
                    for c in np.unique(cc):
                        speed += self.classes[int(c)].capacity_units * float(ratio[cc == c].max())
                if a_min > 0 and memory:
                    # at most p whole options, not the classes' capacity at their best rates
                    rates = most_speed(1.0 / vals, nn, cc, [c.capacity_units for c in self.classes],
                                       min(KNAPSACK_STAGES, L))
                    if t.kind == "max":             # the sum term does not read it
                        m_cap = max_row_bound(L, vals, uu[:, None], None, nn, cc,
                                              [c.capacity_units for c in self.classes], [L], rel_tol=1e-5)
                order = np.argsort(vals, kind="stable")
                a_sorted = vals[order]
                da = a_sorted - np.append(a_sorted[1:], 0.0)   # fill = sum_j a_j (N_j - N_j-1) = da @ N
                # for ceil(L/p) blocks on one stage: the least slope among options holding k blocks
                by_u = np.argsort(-uu, kind="stable")
                if (uu >= L).all():                 # no memory limit binds: closed forms below
                    parts.append(_TermPart(t.kind, t.row, t.weight, a_min, speed, rates, m_cap, c_min, sends))
                    continue
                slots = (_class_slots(uu[order], nn[order], cc[order], [c.capacity_units for c in self.classes])
                         if memory else None)
                parts.append(_TermPart(t.kind, t.row, t.weight, a_min, speed, rates, m_cap, c_min, sends, da,
                                       np.maximum.accumulate(uu[order]), uu[by_u],
                                       np.minimum.accumulate(vals[by_u]), slots))
            self._term_parts[tk] = parts
        total = 0.0
        rows: dict[int, dict] = {}       # per row, its max and sum terms' pieces for the joint bound
        for part in parts:
            if part is None:
                return math.inf
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
                    N = np.minimum(N, _slot_blocks(*part.slots, p))
                if N[-1] < L:
                    return math.inf                        # p stages cannot hold the blocks
                fill = float(part.da @ N)
                j = int(np.searchsorted(-part.u_desc, -k, side="right"))   # options with U >= k: the first j
                if j == 0:
                    return math.inf
                m_p = k * float(part.a_prefix[j - 1])
            if part.kind == "sum":
                fill = max(fill, sum_bound(L, p, part.a_min, speed))
                total += part.weight * (fill + c_sum)
                rows.setdefault(part.row, {})["sum"] = (part.weight, fill, c_sum)
                continue
            if not math.isfinite(part.m_cap):
                return math.inf
            if part.a_min > 0:
                speed = min(speed, p / part.a_min)
            m_lb = max(L * part.a_min / p, L / speed if speed > 0 else 0.0, part.m_cap, m_p)
            total += part.weight * max(m_lb + c_stage, (fill + c_sum) / p)
            rows.setdefault(part.row, {})["max"] = (part.weight, m_lb, c_stage, (fill + c_sum) / p, rates)
        for row in rows.values():
            if "max" not in row or "sum" not in row or row["max"][4] is None:
                continue
            (w_max, m_lb, c_stage, mean, rates), (w_sum, fill, c_sum) = row["max"], row["sum"]
            separate = w_max * max(m_lb + c_stage, mean) + w_sum * (fill + c_sum)
            joint = joint_row_bound(L, rates[:p], m_lb, fill, w_max, w_sum) + w_max * c_stage + w_sum * c_sum
            total += max(0.0, joint - separate)
        return total

    def _fixed_costs(self, ctx, knobs, keys, part, p: int, num_classes: int = 0) -> tuple[float, float]:
        """What the p stages pay whatever their block counts: (summed over stages, the least
        one stage pays): their positions' least intercepts and, in a pipeline, the least send
        of each boundary (the ends of one that does not wrap send on one side only).  A plan
        using exactly ``num_classes`` >= 2 classes has boundaries between classes (see
        ``knob_bound``), which pay at least the least send between two of them; with p = 2
        every stage is at such a boundary."""
        c_min, (c_out, c_in) = part.c_min, part.sends
        if p == 1:
            return float(c_min[3]), float(c_min[3])
        c_sum = float(c_min[1] + c_min[2] + (p - 2) * c_min[0])
        c_stage = float(min(c_min[1], c_min[2], c_min[0] if p > 2 else math.inf))
        if c_out or c_in:
            wraps = knobs.schedule == "interleaved-1f1b"
            e = self._least_send(ctx, knobs, keys)
            boundaries = p if wraps else p - 1
            cross = 0 if num_classes < 2 else min(boundaries, num_classes if wraps else num_classes - 1)
            e_cross = self._least_send(ctx, knobs, keys, between_classes=True) if cross else e
            c_sum += (c_out + c_in) * ((boundaries - cross) * e + cross * e_cross)
            c_stage += (c_out + c_in if wraps else min(c_out, c_in)) * (e_cross if p == 2 else e)
        return c_sum, c_stage

    def ring(self, key: OptionKey):
        hit = self._rings.get(key)
        if hit is None:
            info = self.classes[key.cls]
            devs = tuple(r[0] for r in info.replica_devices(key.tp, key.replicas))
            hit = self._rings[key] = self.topo.ring(devs, concurrent_rings=key.tp)
        return hit

    def send_path(self, a: OptionKey, b: OptionKey):
        """(L0, X): a transfer of k sequences takes L0 + k X (p2p_time_s is affine in bytes)."""
        ck = (a.cls, a.tp, b.cls, b.tp)
        hit = self._paths.get(ck)
        if hit is None:
            ia, ib = self.classes[a.cls], self.classes[b.cls]
            da = ia.replica_devices(a.tp, 1)[0][0]
            if a.cls == b.cls and not ia.shared_node:
                db = ib.replica_devices(b.tp, 1, first_node=1)[0][0]
            elif a.cls == b.cls:
                db = ib.replica_devices(b.tp, 1, first_gpu=a.tp)[0][0] if a.tp + b.tp <= ia.gpus_per_node \
                    else ib.replica_devices(b.tp, 1)[0][0]
            else:
                db = ib.replica_devices(b.tp, 1)[0][0]
            na, nb = da.rpartition(":")[0], db.rpartition(":")[0]
            path = self.topo.p2p(da, db)
            cap = None if na == nb else self.topo.node_p2p(na, nb).bandwidth_Bps
            hit = self._paths[ck] = (path, cap, min(a.tp, b.tp))
        return hit

    def price(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey] | None = None,
              sends: bool = True) -> CoreProblem:
        """The tuple's CoreProblem on ``keys``; ``sends=False``: without the pipeline sends
        (no boundary table, rows without send terms): a relaxation, whose optimum bounds the
        tuple's from below (sends are >= 0 with non-negative coefficients)."""
        keys = self.option_keys(knobs) if keys is None else keys
        p, _m, _B = knobs.num_stages, knobs.num_micro_batches, knobs.micro_batch_size
        unit = knobs.block_unit
        L_units = self.model.num_layers // unit
        options = []
        for key in keys:
            opt = self._option(ctx, knobs, key, unit, L_units)
            if opt is not None:
                options.append(opt)
        boundary = self._boundary(ctx, knobs, options) if p > 1 and options and sends else None
        rows, terms = pipeline_rows(knobs)
        if not sends:
            rows = [Row(stage=r.stage, hinges=r.hinges) for r in rows]
        res_price = []
        for info in self.classes:
            price = info.node_price_usd_per_hour
            res_price.append((price or 0.0) if info.shared_node else 0.0)
        return CoreProblem(num_blocks=L_units, num_stages=p, capacity=[c.capacity_units for c in self.classes],
                           options=options, rows=rows, terms=terms, boundary=boundary,
                           wrap=knobs.schedule == "interleaved-1f1b" and p > 1, resource_price=res_price)

    def _light(self, ctx, knobs, key: OptionKey, unit: int) -> tuple[float, ...]:
        """Middle-stage slopes of the quantities a knob bound reads (forward, backward,
        optimizer; the sync columns only feed hinge rows, which it skips: 0 here)."""
        (sf, sb, _), (so, _) = self._lines(ctx, knobs, key, unit)
        return (sf, sb, 0.0, so, 0.0)

    def _intercepts(self, ctx, knobs, key: OptionKey, unit: int) -> np.ndarray:
        """Per stage position (middle, first, last, only) the intercepts of the same
        quantities: the per-micro-batch overhead everywhere, the embedding on the first stage,
        the head on the last.  Every stage pays its position's intercept whatever its block
        count, so the least intercept over options is a valid addition to the knob bound."""
        (_, _, fb), (_, opt) = self._lines(ctx, knobs, key, unit)
        out = np.zeros((len(POSITIONS), len(QUANTITIES)))
        out[:, 0], out[:, 1], out[:, 3] = fb[:, 0], fb[:, 1], opt
        return out

    def _lines(self, ctx, knobs, key: OptionKey, unit: int):
        """Forward/backward and optimizer time as lines in the block count: the middle-stage
        slopes and each position's intercept.  Forward and backward do not read the ZeRO stage,
        the optimizer step neither the recompute nor B (planner.cost.compute): cached apart, so
        the knob tuples of one search share the work."""
        B = knobs.micro_batch_size
        info = self.classes[key.cls]
        gpu, intra, t, n = info.gpu, info.node_class.intra_Bps, key.tp, key.replicas
        fk = (ctx.recompute, B, key, unit)
        fb = self._fb.get(fk)
        if fb is None:
            share = -(-B // n)
            at = [replica_compute(ctx, gpu, intra, t, share, unit, emb, head) for emb, head in POSITIONS]
            r2 = replica_compute(ctx, gpu, intra, t, share, 2 * unit, False, False)
            sf, sb = r2.total_forward_s - at[0].total_forward_s, r2.total_backward_s - at[0].total_backward_s
            fb = self._fb[fk] = (sf, sb, np.array([(r.total_forward_s - sf, r.total_backward_s - sb) for r in at]))
        ok = (knobs.zero_stage >= 1, key, unit)
        opt = self._opt.get(ok)
        if opt is None:
            shard = n if knobs.zero_stage >= 1 else 1
            at = [optimizer_time_s(ctx, gpu, stage_params(ctx, unit, emb, head) / t / shard) for emb, head in POSITIONS]
            so = optimizer_time_s(ctx, gpu, stage_params(ctx, 2 * unit, False, False) / t / shard) - at[0]
            opt = self._opt[ok] = (so, np.array(at) - so)
        return fb, opt

    def _base(self, ctx, knobs, key: OptionKey, unit: int, emb: bool, head: bool, timing_only: bool = False):
        """Per (knobs without p, option, end flags): quantity slopes/intercepts per core unit and
        the memory model mem(u, f) = c0 + c1 u + f (c2 + c3 u) in units u and in-flight f
        (weights/grads/optimizer are affine in blocks, activations blocks x in-flight)."""
        ck = (self._cid(ctx), knobs.micro_batch_size, key, unit, emb, head)
        hit = self._bases.get(ck)
        if hit is not None and (timing_only or hit[2] is not None):
            return hit
        info = self.classes[key.cls]
        gpu, intra, t, n = info.gpu, info.node_class.intra_Bps, key.tp, key.replicas
        share = -(-knobs.micro_batch_size // n)
        ring = self.ring(key) if n > 1 else None
        shard = n if knobs.zero_stage >= 1 else 1

        def quantities(nb: int) -> tuple[float, ...]:
            rt = replica_compute(ctx, gpu, intra, t, share, nb, emb, head)
            params = stage_params(ctx, nb, emb, head)
            dp = (dp_sync_time_s(ctx, params, n, t, ring.bandwidth_Bps, ring.latency_s, ring.kind, gpu)
                  if ring else 0.0)
            # comm.dp_exposed_s: the sync hides behind the last backward (ZeRO-1: its
            # reduce-scatter part; the all-gather behind the next first forward)
            if not ctx.grad_reduce_overlap:
                rs, ag = dp, 0.0
            elif ctx.zero_stage >= 1:
                g, pb = ctx.grad_bytes_per_param, ctx.activation_bytes
                rs = dp * g / (g + pb) - rt.total_backward_s
                ag = dp * pb / (g + pb) - rt.total_forward_s
            else:
                rs, ag = dp - rt.total_backward_s, -rt.total_forward_s
            return (rt.total_forward_s, rt.total_backward_s, rs,
                    optimizer_time_s(ctx, gpu, params / t / shard), ag)

        if hit is None:
            q1, q2 = quantities(unit), quantities(2 * unit)
            sl = tuple(b - a for a, b in zip(q1, q2))
            fx = tuple(a - d for a, d in zip(q1, sl))
        else:
            sl, fx = hit[0], hit[1]
        if timing_only:
            hit = self._bases[ck] = (sl, fx, None, None, None)
            return hit
        self._check_exposed(ctx, gpu, intra, t, share, n, ring, unit, emb, head,
                            tuple(a + b for a, b in zip(sl, fx)))

        coef, exact, mem = self._memory_model(ctx, knobs, key, unit, emb, head)
        hit = self._bases[ck] = (sl, fx, coef, exact, mem)
        return hit

    def _memory_model(self, ctx, knobs, key: OptionKey, unit: int, emb: bool, head: bool):
        """(c0..c3, exact, mem) with mem(u, f) = c0 + c1 u + f (c2 + c3 u) bytes for u units of
        blocks and f micro-batches in flight; ``exact`` when a third point agrees (else the
        callers settle limits with ``mem`` itself).  Apart from ``_base`` so that the knob
        bound reads memory without pricing the timings."""
        ck = (self._cid(ctx), knobs.micro_batch_size, key, unit, emb, head)
        hit = self._memory.get(ck)
        if hit is not None:
            return hit
        info = self.classes[key.cls]
        gpu, t, n = info.gpu, key.tp, key.replicas
        share = -(-knobs.micro_batch_size // n)

        def mem(u: int, f: float) -> float:
            return replica_memory_bytes(ctx, gpu, t, share, u * unit, emb, head, n, f)

        m11, m21, m12, m22 = mem(1, 1.0), mem(2, 1.0), mem(1, 2.0), mem(2, 2.0)
        c3 = (m22 - m12) - (m21 - m11)
        c1 = (m21 - m11) - c3
        c2 = (m12 - m11) - c3
        c0 = m11 - c1 - c2 - c3
        probe = mem(3, 3.0)
        exact = abs(c0 + 3 * c1 + 3 * (c2 + 3 * c3) - probe) <= 1e-9 * probe
        hit = self._memory[ck] = ((c0, c1, c2, c3), exact, mem)
        return hit

    def _check_exposed(self, ctx, gpu, intra, t, share, n, ring, nb, emb, head, q) -> None:
        """Our hinge form of the exposed sync must be the cost model's ``dp_exposed_s``; a
        change there must not silently make the search optimise something else."""
        rt = replica_compute(ctx, gpu, intra, t, share, nb, emb, head)
        dp = (dp_sync_time_s(ctx, stage_params(ctx, nb, emb, head), n, t, ring.bandwidth_Bps, ring.latency_s,
                             ring.kind, gpu) if ring else 0.0)
        want = dp_exposed_s(ctx, dp, rt.total_backward_s, rt.total_forward_s)
        got = max(0.0, q[2]) + max(0.0, q[4])
        if abs(got - want) > 1e-9 * max(1e-12, want):
            raise AssertionError(f"search/space.py models the exposed DP sync as {got}, the cost model "
                                 f"says {want}: update the hinge form to planner.cost.comm.dp_exposed_s")

    def _option(self, ctx, knobs, key: OptionKey, unit: int, L_units: int) -> CoreOption | None:
        info = self.classes[key.cls]
        p, m, v = knobs.num_stages, knobs.num_micro_batches, knobs.virtual_stages
        cap = info.gpu.memory_bytes
        slope = None
        fixed: list[tuple[float, ...] | None] = []
        max_blocks: list[int] = []
        for s in range(p):
            sl, fx, (c0, c1, c2, c3), exact, mem = self._base(ctx, knobs, key, unit, s == 0, s == p - 1)
            slope = slope or sl
            f = in_flight_micro_batches(knobs.schedule, p, s, m, v)
            hi = _max_units(cap, c0 + c2 * f, c1 + c3 * f, exact, lambda u, f=f, mem=mem: mem(u, f), L_units)
            fixed.append(fx if hi >= 1 else None)
            max_blocks.append(hi)
        if not any(max_blocks):
            return None
        return CoreOption(resource=key.cls, units=info.units(key.tp, key.replicas), slope=slope, fixed=fixed,
                          max_blocks=max_blocks, price_usd_per_hour=info.option_price(key.tp, key.replicas),
                          label=key)

    def _boundary(self, ctx, knobs, options: list[CoreOption]) -> np.ndarray:
        """Send time between adjacent stages for every option pair (evaluate's bottleneck rule):
        ``max(c L0 + k X)`` over the boundary's busiest points (c transfers, k sequences), with
        the path's (L0, X) per (class, TP) pair and the points per replica-count pair, so the
        K x K table is filled by numpy, not a K^2 Python loop."""
        return self._send_table(ctx, knobs.micro_batch_size, [o.label for o in options])[None]

    def _send_table(self, ctx, B: int, labels: list[OptionKey]) -> np.ndarray:
        groups = list(dict.fromkeys((k.cls, k.tp) for k in labels))
        counts = list(dict.fromkeys(k.replicas for k in labels))
        gi = np.array([groups.index((k.cls, k.tp)) for k in labels])
        ri = np.array([counts.index(k.replicas) for k in labels])
        L0 = np.zeros((len(groups), len(groups)))
        X = np.zeros_like(L0)
        for a, (ca, ta) in enumerate(groups):
            for b, (cb, tb) in enumerate(groups):
                L0[a, b], X[a, b] = self._send_line(ctx, OptionKey(ca, ta, 1), OptionKey(cb, tb, 1))
        pc, pk = _point_tables(B, tuple(counts))
        c = pc[ri[:, None], ri[None, :]]                   # [K, K, points]
        k = pk[ri[:, None], ri[None, :]]
        T = (c * L0[gi[:, None], gi[None, :], None] + k * X[gi[:, None], gi[None, :], None]).max(axis=2)
        shared = np.array([[self._shared_link(ctx, B, ga, gb) for gb in groups] for ga in groups])
        return np.maximum(T, shared[gi[:, None], gi[None, :]])

    def _shared_link(self, ctx, B: int, a: tuple[int, int], b: tuple[int, int]) -> float:
        """A whole micro-batch crossing a capped zone link between the classes of ``a`` and
        ``b`` ((class, TP) each): evaluate's shared-link floor of a boundary."""
        ia, ib = self.classes[a[0]], self.classes[b[0]]
        if ia.zone == ib.zone:
            return 0.0
        aggregate = self.topo.zone_path(ia.zone, ib.zone)[1]
        path = self.send_path(OptionKey(a[0], a[1], 1), OptionKey(b[0], b[1], 1))[0]
        per_seq = ctx.seq_len * ctx.model.hidden_size * ctx.activation_bytes
        return shared_link_time_s(B * per_seq, path, aggregate, ctx, ia.gpu)

    def _send_line(self, ctx, a: OptionKey, b: OptionKey) -> tuple[float, float]:
        """(L0, X) of a send from class/TP ``a`` to ``b``: k sequences take L0 + k X
        (p2p_time_s is affine in bytes; the sender's GPU prices it, as in evaluate)."""
        ck = (self._cid(ctx), a.cls, a.tp, b.cls, b.tp)
        hit = self._sends.get(ck)
        if hit is None:
            per_seq = ctx.seq_len * ctx.model.hidden_size * ctx.activation_bytes
            path, cap, flows = self.send_path(a, b)
            gpu = self.classes[a.cls].gpu
            t1 = p2p_time_s(per_seq, path, ctx, flows, cap, gpu)
            t2 = p2p_time_s(2 * per_seq, path, ctx, flows, cap, gpu)
            X = t2 - t1
            hit = self._sends[ck] = (t1 - X, X)
        return hit


    def _least_send(self, ctx, knobs, keys: list[OptionKey], between_classes: bool = False) -> float:
        """A lower bound on any one boundary's send (``between_classes``: of one whose two
        stages are of different classes): a boundary's busiest point carries at least one
        transfer of a whole share, and no share is below ``ceil(B / most replicas)``; so
        ``L0 + k X`` at that k, and across a capped zone link no less than the whole
        micro-batch over its aggregate bandwidth; least over the (class, TP) pairs of ``keys``.
        Needs only the paths, not the K x K table, so every knob tuple can afford it."""
        if not keys:
            return 0.0
        B = knobs.micro_batch_size
        ck = (self._cid(ctx), B, id(keys), len(keys), between_classes)
        hit = self._least.get(ck)
        if hit is None:
            k = -(-B // max(key.replicas for key in keys))
            groups = sorted({(key.cls, key.tp) for key in keys})
            pairs = [(a, b) for a in groups for b in groups if not between_classes or a[0] != b[0]]
            least = math.inf
            for a, b in pairs:
                L0, X = self._send_line(ctx, OptionKey(a[0], a[1], 1), OptionKey(b[0], b[1], 1))
                least = min(least, max(L0 + k * X, self._shared_link(ctx, B, a, b)))
            hit = self._least[ck] = (least if pairs else 0.0, keys)   # keys kept alive: id() stays unique
        return hit[0]


@lru_cache(maxsize=256)
def _point_tables(B: int, counts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The busiest points per replica-count pair, padded with (0, 0) (a zero-cost point never
    wins the max, as L0, X >= 0): arrays [counts, counts, points] of transfers and sequences."""
    pts = {(x, y): _busiest_points(B, x, y) for x in counts for y in counts}
    width = max(len(v) for v in pts.values())
    pc = np.zeros((len(counts), len(counts), width))
    pk = np.zeros_like(pc)
    for i, x in enumerate(counts):
        for j, y in enumerate(counts):
            for w, (c, k) in enumerate(pts[x, y]):
                pc[i, j, w], pk[i, j, w] = c, k
    return pc, pk


@dataclass
class _TermPart:
    """What a knob bound keeps per objective term, for every p at once."""
    kind: str                  # "max" or "sum"
    row: int
    weight: float
    a_min: float               # least slope (seconds per block) of a usable option
    speed: float               # rate cap: each class's capacity at its best rate per unit
    rates: np.ndarray | None   # memory level: rate cap of at most k whole options, k = 1, 2, ...
    m_cap: float               # memory/capacity bound on the max row (0 when not computed)
    c_min: np.ndarray          # least intercept per stage position
    sends: tuple[float, float]  # the row's out / in send coefficients
    da: np.ndarray | None = None        # with memory limits: the cheapest-fill pieces
    u_cum: np.ndarray | None = None
    u_desc: np.ndarray | None = None
    a_prefix: np.ndarray | None = None
    slots: tuple[np.ndarray, np.ndarray] | None = None   # see _class_slots


def _class_slots(u_sorted: np.ndarray, units_sorted: np.ndarray, cls_sorted: np.ndarray,
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


def _slot_blocks(most: np.ndarray, count: np.ndarray, p: int) -> np.ndarray:
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


def pipeline_rows(knobs: Knobs) -> tuple[list[Row], list[Term]]:
    """planner.cost.schedule's closed forms as core rows and terms (F, B, DPX, OPT; one send)."""
    m, v = knobs.num_micro_batches, knobs.virtual_stages
    dpx = Row(stage=(0, 0, 0, 0, 0), hinges=((0, 0, 1, 0, 0), (0, 0, 0, 0, 1)))
    opt = Row(stage=(0, 0, 0, 1, 0))
    if knobs.schedule == "gpipe":
        rows = [Row(stage=(1, 0, 0, 0, 0), out=(1,)), Row(stage=(0, 1, 0, 0, 0), inn=(1,)), dpx, opt]
        terms = [Term("max", 0, m - 1), Term("sum", 0), Term("max", 1, m - 1), Term("sum", 1),
                 Term("max", 2), Term("max", 3)]
        return rows, terms
    if knobs.schedule == "interleaved-1f1b":
        rows = [Row(stage=(1, 1, 0, 0, 0), out=(v,), inn=(v,)), dpx, opt]
        return rows, [Term("max", 0, m - 1.0 / v), Term("sum", 0, 1.0 / v), Term("max", 1), Term("max", 2)]
    rows = [Row(stage=(1, 1, 0, 0, 0), out=(1,), inn=(1,)), dpx, opt]
    return rows, [Term("max", 0, m - 1), Term("sum", 0), Term("max", 1), Term("max", 2)]
