"""What the knob bound (bound.py) keeps per objective term of a knob tuple's rows, for every
p at once: each row's least slope and per-position intercepts, its rate caps, the cheapest
way to fill L blocks, and a max row's memory/capacity bound.

Knob tuples that differ only in p share these pieces where their rows are the same (1F1B's
and interleaving's); ZB-H1's summed row and the V rows change with p, so the pieces are
keyed by the rows themselves (``knobs.knob_rows``), never by the schedule's name: before,
a tuple bounded after one of another p took that p's rows (docs/search-space.md, "These rows
change with p").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from planner.cost.memory import deferred_w_micro_batches
from planner.search.core.problem import max_row_bound
from planner.search.fill import Slots, class_slots
from planner.search.knobs import Knobs
from planner.search.option_arrays import both_classes
from planner.search.packing import KNAPSACK_STAGES
from planner.search.pieces import block_limits, most_speed

PARTS_ENTRIES = 2048     # per-term and per-row pieces kept, each store (~50 kB each on c's 540 options)


@dataclass
class TermPart:
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
    slots: Slots | None = None          # see fill.class_slots
    ratios: tuple[tuple[int, float], ...] = ()  # a summed row's least slope ratio to each max row (_ratios)


def remember(store: dict, key, value):
    """``store[key] = value``, the oldest entry dropped past PARTS_ENTRIES; returns ``value``."""
    if len(store) >= PARTS_ENTRIES:
        del store[next(iter(store))]
    store[key] = value
    return value


class TermParts:
    """The pieces of one KnobBound (its classes' capacities), cached."""

    def __init__(self, classes):
        self.classes = classes
        self._parts: dict = {}          # per (options, rows, f_min): the terms' parts and U
        self._pieces: dict = {}         # per (options, schedule, m, f_min[, row]): U and each row's pieces

    def get(self, tk: tuple, base: tuple, knobs: Knobs, arrays: tuple, L: int, f_min: float, memory: bool,
            rows_terms: tuple) -> tuple[list, np.ndarray]:
        """(parts, U): per objective term (pipeline rows only; hinge rows are skipped) what
        ``KnobBound.whole`` needs for every p (None for a term no option can take), and every
        option's block limit U at ``f_min`` micro-batches in flight (0: it cannot hold one
        block); ``tk``: the options, the rows and f_min; ``base``: the same but the rows.  A
        row's max and sum terms share their pieces; only the max term reads ``m_cap``.  Each
        row's pieces are kept under ``base``: rows that do not change with p (ZB-H1's max row)
        are not computed again for every p."""
        hit = self._parts.get(tk)
        if hit is None:
            hit = remember(self._parts, tk, self._build(knobs, arrays, L, f_min, memory, rows_terms, base))
        return hit

    def _build(self, knobs: Knobs, arrays: tuple, L: int, f_min: float, memory: bool,
               rows_terms: tuple, base: tuple) -> tuple[list, np.ndarray]:
        rows, terms = rows_terms
        U, usable, most_p = self._limits(knobs, arrays, L, f_min, base)
        max_rows = {t.row for t in terms if t.kind == "max" and not rows[t.row].hinges}
        parts = []
        for t in terms:
            row = rows[t.row]
            if row.hinges:
                continue
            # the knapsack rates only where a max term reads the row (KnobBound._joint_gain):
            # a summed row alone (ZB-H1's, one per p) takes its rate cap from its classes
            rated = t.row in max_rows
            piece = self._pieces.get((base, row, rated))
            if piece is None:
                piece = remember(self._pieces, (base, row, rated),
                                 (self._row_part(row, arrays, U, usable, L, memory and rated, most_p, memory),))
            base_part = piece[0]
            if base_part is None:
                parts.append(None)
                continue
            m_cap = 0.0
            if t.kind == "max" and memory and base_part.a_min > 0:
                cap = self._pieces.get((base, row, "m_cap"))
                if cap is None:
                    cap = remember(self._pieces, (base, row, "m_cap"), self._max_row_cap(row, arrays, U, usable, L))
                m_cap = cap
            parts.append(replace(base_part, kind=t.kind, row=t.row, weight=t.weight, m_cap=m_cap))
        for i, part in enumerate(parts):
            if part is not None and part.kind == "sum" and part.row not in max_rows and memory:
                parts[i] = replace(part, ratios=_ratios(rows, part.row, max_rows, arrays.slopes[usable]))
        return parts, U

    def _limits(self, knobs: Knobs, arrays: tuple, L: int, f_min: float, base: tuple) -> tuple:
        """(U, usable, most_p) of ``get``, once per ``base``."""
        hit = self._pieces.get((base, "limits"))
        if hit is not None:
            return hit
        # with the fewest W-waiting micro-batches of any stage (ZB-H1: 1 on its first, ZB-V and
        # DualPipeV: half a stage on their first; the same for every p, which the key leaves
        # out); that and f_min may come from different stages, which only loosens
        p, m = knobs.num_stages, knobs.num_micro_batches
        d_min = min(deferred_w_micro_batches(knobs.schedule, p, s, m) for s in range(p))
        U = block_limits(arrays.coef, arrays.exact, arrays.caps, [f_min], L, [d_min])[:, 0]
        # the most stages a tuple sharing these parts can have (they differ only in p): an
        # interleaved schedule needs p to divide m; a larger p reads no rate cap (still a bound)
        most_p = min(KNAPSACK_STAGES, L, knobs.num_micro_batches if knobs.virtual_stages > 1 else L)
        return remember(self._pieces, (base, "limits"), (U, U >= 1, most_p))

    def _max_row_cap(self, row, arrays: tuple, U: np.ndarray, usable: np.ndarray, L: int) -> float:
        """The memory/capacity bound on a max row (``TermPart.m_cap``)."""
        capacity = [c.capacity_units for c in self.classes]
        vals = (arrays.slopes @ np.array(row.stage, dtype=float))[usable]
        return max_row_bound(L, *both_classes(vals, U[usable], arrays.units[usable], arrays.cls[usable],
                                              arrays.extra[usable]), capacity, [L], rel_tol=1e-5)

    def _row_part(self, row, arrays: tuple, U: np.ndarray, usable: np.ndarray, L: int,
                  rated: bool, most_p: int, memory: bool) -> TermPart | None:
        """One row's pieces over the usable options (kind, row, weight and m_cap are the
        caller's): least slope and per-position intercepts, rate caps (``rated``: also the
        knapsack's, of at most p whole options), cheapest-fill pieces."""
        arr, units, cls, _, _, _, _, icpt, _ = arrays
        vals = (arr @ np.array(row.stage, dtype=float))[usable]
        if not len(vals):
            return None
        capacity = [c.capacity_units for c in self.classes]
        c_min = (icpt @ np.array(row.stage, dtype=float))[usable].min(axis=0)   # per position
        sends = (sum(row.out), sum(row.inn))      # coefficients of a stage's out / in send
        a_min = float(vals.min())
        speed, rates = 0.0, None
        uu, cc, nn = U[usable], cls[usable], units[usable]
        if a_min > 0:
            # each class's capacity times its best rate per unit caps the stages' total rate,
            # a stand-in's rate per all its units and under both its classes (option_arrays.both_classes)
            vx, _, _, ux, cx = both_classes(vals, uu, nn, cc, arrays.extra[usable])
            ratio = 1.0 / (vx * ux)
            for c in np.unique(cx):
                speed += capacity[int(c)] * float(ratio[cx == c].max())
        if a_min > 0 and rated:
            # at most p whole options, not the classes' capacity at their best rates
            rates = most_speed(1.0 / vals, nn, cc, capacity, most_p)
        part = TermPart("", -1, 0.0, a_min, speed, rates, 0.0, c_min, sends)
        if (uu >= L).all():                 # no memory limit binds: closed forms in whole()
            return part
        order = np.argsort(vals, kind="stable")
        a_sorted = vals[order]
        # for ceil(L/p) blocks on one stage: the least slope among options holding k blocks
        by_u = np.argsort(-uu, kind="stable")
        return replace(part, da=a_sorted - np.append(a_sorted[1:], 0.0),   # fill = sum_j a_j (N_j - N_j-1) = da @ N
                       u_cum=np.maximum.accumulate(uu[order]), u_desc=uu[by_u],
                       a_prefix=np.minimum.accumulate(vals[by_u]),
                       slots=class_slots(uu[order], nn[order], cc[order], capacity) if memory else None)


def _ratios(rows, summed: int, max_rows: set, slopes: np.ndarray) -> tuple[tuple[int, float], ...]:
    """Per max row r (of options with positive slopes on it), the least ratio over the usable
    options of their slope on row ``summed`` to their slope on r: each stage's blocks then
    cost on the summed row at least that times what they cost on r (bound.KnobBound._joint_gain).
    Slopes, not intercepts: the intercepts are bounded apart."""
    if not len(slopes):
        return ()
    mine = slopes @ np.array(rows[summed].stage, dtype=float)
    out = []
    for r in sorted(max_rows):
        theirs = slopes @ np.array(rows[r].stage, dtype=float)
        if (theirs > 0).all():
            rho = float((mine / theirs).min())
            if rho > 0:
                out.append((r, rho))
    return tuple(out)
