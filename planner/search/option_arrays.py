"""Per option of a knob tuple's key list, the arrays the knob bounds read (bound.py,
packed.py): middle-stage slopes, units and class, the memory model and capacity, per-position
intercepts and a mixed stage's units of other classes, built once per (pricer context, B, row
kind, keys, level) from the ``Pricer``'s lines and cached; a class subset's arrays are rows of
its parent's."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from planner.cost import CostContext
from planner.search.knobs import Knobs, OptionKey
from planner.search.schedules import SCHEDULES
from planner.search.slots import POSITIONS, QUANTITIES, Quantity, per_quantity
from planner.search.space import Pricer


class OptionArrays(NamedTuple):
    """Per option of a key list, what the knob bounds read (``OptionArrayCache.get``)."""
    slopes: np.ndarray      # [K, quantities] middle-stage slopes per unit of blocks
    units: np.ndarray       # [K] units of its class an option takes
    cls: np.ndarray         # [K] its class
    keys: list              # the options themselves (kept alive: caches key by id)
    coef: np.ndarray        # [K, 5] memory model c0..c4 (memory level; zeros without)
    exact: np.ndarray       # [K] the memory model is affine (else no memory limit)
    caps: np.ndarray        # [K] memory per GPU of its class
    icpt: np.ndarray        # [K, positions, quantities] intercepts per stage position
    extra: np.ndarray       # [K, classes] units of other classes (a mixed stage's stand-in)


def both_classes(vals, U, units, cls, extra):
    """Per-option arrays (slopes, U [K, 1], None, units, classes, as ``max_row_bound`` takes
    them) with a mixed stage's stand-in at all its units and also listed under its other
    class: its blocks and rate then count against both classes' capacities (a plan's blocks
    or rate are at most each class's capacity times the best per unit of any option on it)."""
    total = units + extra.sum(axis=1)
    rows, other = np.nonzero(extra)
    return (np.concatenate([vals, vals[rows]]), np.concatenate([U, U[rows]])[:, None], None,
            np.concatenate([total, total[rows]]), np.concatenate([cls, other]))


class OptionArrayCache:
    """``OptionArrays`` per key list of one Pricer, and the class subsets of each key list (one
    list object per (keys, subset): the caches key by id)."""

    def __init__(self, pricer: Pricer):
        self.pricer, self.classes = pricer, pricer.classes
        self._slopes: dict = {}
        self._subsets: dict = {}
        self._subset_parent: dict = {}  # id(subset keys) -> (those keys, all keys, the classes)

    def get(self, sk, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], memory: bool) -> OptionArrays:
        """Per option of ``keys``: middle-stage slopes, units, class, memory model, capacity and
        per-position intercepts, cached under ``sk`` (the caller's key: its pricer context, B,
        the schedule's row kind, the keys' identity and the level).  A class subset's arrays are
        its parent's rows, not priced again."""
        hit = self._slopes.get(sk)
        return hit if hit is not None else self._build(sk, knobs, ctx, keys, memory)

    def _build(self, sk, knobs: Knobs, ctx: CostContext, keys: list[OptionKey], memory: bool) -> OptionArrays:
        unit = knobs.block_unit
        parent = self._subset_parent.get(id(keys))
        if parent is not None and parent[0] is keys:
            _, full, subset = parent
            psk = (sk[0], sk[1], sk[2], id(full), len(full), memory)
            arrays = self.get(psk, knobs, ctx, full, memory)
            mask = np.isin(arrays.cls, subset)
            hit = OptionArrays._make(a[mask] if name != "keys" else keys
                                     for name, a in zip(OptionArrays._fields, arrays))
            self._slopes[sk] = hit
            return hit
        if memory:      # the memory-free level's arrays and the memory model
            lsk = sk[:-1] + (False,)
            light = self.get(lsk, knobs, ctx, keys, False)
            models = [self.pricer.memory_model(ctx, knobs, k, unit, False, False) for k in keys]
            coef = np.array([mm[0][:5] for mm in models]) if models else np.zeros((0, 5))
            exact = np.array([bool(mm[1]) for mm in models], dtype=bool)
            hit = self._slopes[sk] = light._replace(coef=coef, exact=exact)
            return hit
        arr = np.array([self._light(ctx, knobs, k, unit) for k in keys])
        coef, exact = np.zeros((len(keys), 5)), np.zeros(len(keys), dtype=bool)
        caps = np.array([self.classes[k.cls].gpu.memory_bytes for k in keys], dtype=float)
        units = np.array([k.units_in(self.classes) for k in keys], dtype=float)
        cls = np.array([k.cls for k in keys])
        icpt = (np.array([self._intercepts(ctx, knobs, k, unit) for k in keys]) if keys
                else np.zeros((0, len(POSITIONS), len(QUANTITIES))))
        extra = np.zeros((len(keys), len(self.classes)))
        for i, k in enumerate(keys):
            for c, u in k.extra_units_in(self.classes):
                extra[i, c] += u
        hit = self._slopes[sk] = OptionArrays(arr, units, cls, keys, coef, exact, caps, icpt, extra)
        return hit

    def subset_keys(self, keys: list[OptionKey], subset: tuple[int, ...]) -> list[OptionKey]:
        """The keys of ``subset`` 's classes, one list per (keys, subset): the caches key by id."""
        ck = (id(keys), len(keys), subset)
        hit = self._subsets.get(ck)
        if hit is None:
            hit = self._subsets[ck] = ([k for k in keys if k.cls in subset], keys)   # keys kept alive
            self._subset_parent[id(hit[0])] = (hit[0], keys, subset)
        return hit[0]

    def _light(self, ctx, knobs, key: OptionKey, unit: int) -> tuple[float, ...]:
        """Middle-stage slopes of the quantities a knob bound reads (forward, backward,
        optimizer; the sync columns only feed hinge rows, which it skips: 0 here).  The
        backward's input part only where the schedule's rows read it (zero-bubble): pricing its
        W apart is a second backward per option (bench b: 1.6 of 9 s), and other rows weigh it 0."""
        (sf, sb, _), (so, _) = self.pricer.lines(ctx, knobs, key, unit)
        reads = SCHEDULES[knobs.schedule].reads_input
        return per_quantity(forward=sf, backward=sb, sync_less_backward=0.0, optimizer=so, gather_less_forward=0.0,
                            backward_input=self.pricer.input_line(ctx, knobs, key, unit)[0] if reads else 0.0)

    def _intercepts(self, ctx, knobs, key: OptionKey, unit: int) -> np.ndarray:
        """Per stage position (middle, first, last, only) the intercepts of the same
        quantities: the per-micro-batch overhead everywhere, the embedding on the first stage,
        the head on the last.  Every stage pays its position's intercept whatever its block
        count, so the least intercept over options is a valid addition to the knob bound."""
        (_, _, fb), (_, opt) = self.pricer.lines(ctx, knobs, key, unit)
        out = np.zeros((len(POSITIONS), len(QUANTITIES)))
        out[:, Quantity.FORWARD], out[:, Quantity.BACKWARD] = fb.T
        out[:, Quantity.OPTIMIZER] = opt
        if SCHEDULES[knobs.schedule].reads_input:    # else weighed 0 by every row (_light)
            out[:, Quantity.BACKWARD_INPUT] = self.pricer.input_line(ctx, knobs, key, unit)[1]
        # a V (zb-v, dualpipev): the first stage carries the embedding and the head, the last neither
        return out[list(SCHEDULES[knobs.schedule].role_positions())]
