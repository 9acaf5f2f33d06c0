"""Exact solver for pipelines of one or two stages: every (option, option, split) at once.

A two-stage problem has ``K^2 (L - 1)`` assignments; numpy prices them all in one pass where
the MILP would need ``K^2`` pairwise send constraints just to be built (pulp builds about 1e5
terms per second, so a 300-option tuple cost seconds before HiGHS started).  Same interface
as ``milp.CoreMilp`` (``solve`` in time or price mode with a cutoff, ``exclude`` for top-K),
and the same answers: tests/test_search_core.py checks it against brute force and the MILP.
"""

from __future__ import annotations

import math

import numpy as np

from planner.search import clock
from planner.search.core.problem import CoreProblem, CoreSolution

TIMED_OUT = object()
MAX_CELLS = 40_000_000          # assignments we price for one solve (about a second of numpy)
_CHUNK_CELLS = 2_000_000        # per slice of first-stage options, to bound memory (~16 MB/array)
_REL = 1e-12


def fits(prob: CoreProblem) -> bool:
    """Whether this solver takes the problem: one or two stages, not too many assignments."""
    return fits_size(prob.num_stages, len(prob.options), prob.num_blocks)


def fits_size(num_stages: int, num_options: int, num_blocks: int) -> bool:
    """``fits`` before the problem is priced (the search decides how to treat a tuple)."""
    return num_stages == 1 or (num_stages == 2 and num_options ** 2 * max(1, num_blocks - 1) <= MAX_CELLS)


class CoreEnum:
    def __init__(self, prob: CoreProblem):
        if not fits(prob):
            raise ValueError("CoreEnum takes one- or two-stage problems of at most "
                             f"{MAX_CELLS} assignments")
        self.prob = prob
        self.excluded: set[tuple[int, ...]] = set()
        K = len(prob.options)
        opts = prob.options
        C = len(prob.capacity)
        self.units = prob.units_by_resource()                  # [K, C]
        self.capacity = np.array(prob.capacity, dtype=float)
        # only resources some option holds can bind or be charged
        self.held = [c for c in range(C) if self.units[:, c].any()]
        self.option_price = np.array([o.price_usd_per_hour for o in opts], dtype=float)
        rp = prob.resource_price or [0.0] * C
        self.resource_price = np.array(rp, dtype=float)
        groups = {g: i for i, g in enumerate(dict.fromkeys(o.group for o in opts))}
        self.group = np.array([groups[o.group] for o in opts], dtype=int)
        # per stage position: the rows' stage parts, shape [rows, K, L + 1] (index = block count)
        self.stage_rows = [self._stage_rows(s) for s in range(prob.num_stages)] if opts else []
        self.nodes = 0
        self._K = K

    def _stage_rows(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """Row values of stage position ``s`` without boundary terms, [rows, K, L+1], and the
        mask of allowed (option, block count)."""
        prob, L = self.prob, self.prob.num_blocks
        Q = prob.num_quantities
        nb = np.arange(L + 1, dtype=float)
        slope = np.array([o.slope for o in prob.options], dtype=float).reshape(-1, Q)
        fixed = np.array([o.fixed[s] if o.fixed[s] is not None else (0.0,) * Q for o in prob.options],
                         dtype=float).reshape(-1, Q)
        q = slope[:, None, :] * nb[None, :, None] + fixed[:, None, :]          # [K, L+1, Q]
        rows = np.zeros((len(prob.rows), len(prob.options), L + 1))
        for j, row in enumerate(prob.rows):
            v = q @ np.array(row.stage, dtype=float)
            for h in row.hinges:
                v = v + np.maximum(0.0, q @ np.array(h, dtype=float))
            rows[j] = v
        hi = np.array([o.max_blocks[s] if o.allowed(s) else 0 for o in prob.options])
        lo = np.array([o.least_blocks(s) for o in prob.options])
        ok = (nb[None, :] >= lo[:, None]) & (nb[None, :] <= hi[:, None])
        return rows, ok

    # -- one pass over every assignment -------------------------------------------------
    def _scan(self, mode: str, time_cap: float | None, deadline: float | None = None):
        """The best assignment by (objective) or (price, objective); None when none is allowed;
        ``TIMED_OUT`` when the deadline passed between chunks."""
        prob = self.prob
        if not prob.options:
            return None
        if prob.num_stages == 1:
            return self._scan_one(mode, time_cap)
        L, K = prob.num_blocks, self._K
        n1 = np.arange(1, L)                 # first stage's block count; the second has L - n1
        rows0, ok0 = self.stage_rows[0]
        rows1, ok1 = self.stage_rows[1]
        step = max(1, _CHUNK_CELLS // max(1, K * len(n1)))
        best = None
        for a in range(0, K, step):
            if deadline is not None and a and clock.now() > deadline:
                return TIMED_OUT
            sl = slice(a, min(K, a + step))
            obj, price, ok = self._chunk(sl, n1, rows0, ok0, rows1, ok1)
            self.nodes += obj.size
            clock.charge(obj.size / clock.ENUM_PER_UNIT)
            if time_cap is not None:
                ok &= obj <= time_cap * (1 + _REL)
            if not ok.any():
                continue
            if mode == "price":
                pm = np.where(ok, price[:, :, None], np.inf)
                low = float(pm.min())
                ok &= pm <= low + abs(low) * _REL
                key_first = low
            else:
                key_first = None
            masked = np.where(ok, obj, np.inf)
            i = int(np.argmin(masked))
            value = float(masked.flat[i])
            o1, o2, k = np.unravel_index(i, masked.shape)
            cand = ((key_first, value) if mode == "price" else (value,), [(a + int(o1), int(n1[k])),
                                                                          (int(o2), int(L - n1[k]))])
            if best is None or cand[0] < best[0]:
                best = cand
        return best

    def _chunk(self, sl: slice, n1, rows0, ok0, rows1, ok1):
        prob = self.prob
        L = prob.num_blocks
        idx = np.arange(self._K)[sl]
        # boundary table b -> b+1; with wrap also 1 -> 0 (the transpose)
        E = prob.boundary if prob.boundary is not None else np.zeros((0, self._K, self._K))
        obj = 0.0
        vals = []
        for j, row in enumerate(prob.rows):
            b0 = np.zeros((len(idx), self._K))
            b1 = np.zeros((len(idx), self._K))
            for r in range(E.shape[0]):
                fwd = E[r][idx, :]                           # [o1, o2]: stage 0 -> 1
                back = E[r].T[idx, :] if prob.wrap else None     # [o1, o2]: stage 1 -> 0
                if row.out and row.out[r]:
                    b0 = b0 + row.out[r] * fwd
                    if back is not None:
                        b1 = b1 + row.out[r] * back
                if row.inn and row.inn[r]:
                    b1 = b1 + row.inn[r] * fwd
                    if back is not None:
                        b0 = b0 + row.inn[r] * back
            v0 = rows0[j][idx][:, None, n1] + b0[:, :, None]             # [o1, o2, split]
            v1 = rows1[j][:, L - n1][None, :, :] + b1[:, :, None]
            vals.append((v0, v1))
        for t in prob.terms:
            v0, v1 = vals[t.row]
            if t.kind == "min":
                obj = obj + t.weight * np.minimum(v0, v1)
            else:
                obj = obj + t.weight * (np.maximum(0.0, np.maximum(v0, v1)) if t.kind == "max" else v0 + v1)
        ok = ok0[idx][:, None, n1] & ok1[:, L - n1][None, :, :]
        cap_ok = np.ones((len(idx), self._K), dtype=bool)
        price = self.option_price[idx][:, None] + self.option_price[None, :]
        for c in self.held:
            u1, u2 = self.units[idx, c][:, None], self.units[:, c][None, :]
            cap_ok &= u1 + u2 <= self.capacity[c]
            if self.resource_price[c]:
                price = price + self.resource_price[c] * ((u1 > 0) | (u2 > 0))
        pair_ok = cap_ok
        if prob.same_group:
            pair_ok = pair_ok & (self.group[idx][:, None] == self.group[None, :])
        if prob.budget_usd_per_hour is not None:
            pair_ok = pair_ok & (price <= prob.budget_usd_per_hour * (1 + _REL))
        for seq in self.excluded:
            if sl.start <= seq[0] < sl.stop:
                pair_ok[seq[0] - sl.start, seq[1]] = False
        return np.broadcast_to(obj, ok.shape), price, ok & pair_ok[:, :, None]

    def _scan_one(self, mode: str, time_cap: float | None):
        prob = self.prob
        L = prob.num_blocks
        rows, ok = self.stage_rows[0]
        obj = np.zeros(self._K)
        for t in prob.terms:
            v = rows[t.row][:, L]
            obj = obj + t.weight * (np.maximum(0.0, v) if t.kind == "max" else v)    # one stage: min = sum
        good = ok[:, L] & (self.units <= self.capacity).all(axis=1)
        price = self.option_price + (self.units > 0) @ self.resource_price[:self.units.shape[1]]
        if prob.budget_usd_per_hour is not None:
            good &= price <= prob.budget_usd_per_hour * (1 + _REL)
        if time_cap is not None:
            good &= obj <= time_cap * (1 + _REL)
        for seq in self.excluded:
            good[seq[0]] = False
        self.nodes += self._K
        if not good.any():
            return None
        if mode == "price":
            low = float(np.where(good, price, np.inf).min())
            good &= price <= low + abs(low) * _REL
        masked = np.where(good, obj, np.inf)
        o = int(np.argmin(masked))
        key = (float(price[o]), float(masked[o])) if mode == "price" else (float(masked[o]),)
        return key, [(o, L)]

    # -- the CoreMilp interface ---------------------------------------------------------
    def solve(self, settings=None, mode: str = "time", time_cap: float | None = None,
              deadline: float | None = None, cutoff: float | None = None) -> CoreSolution:
        """Exact: ``optimal`` with bound = objective, ``cutoff`` (bound = the optimum) when the
        optimum (the time, or in price mode the price) is not below ``cutoff``, or
        ``infeasible``; ``unknown`` (no bound) when ``deadline`` passes between chunks of a
        pass.  ``settings`` is accepted for the MILP's interface."""
        found = self._scan(mode, time_cap if mode == "price" else None, deadline)
        if found is TIMED_OUT:
            return CoreSolution(status="unknown", nodes=self.nodes)
        if found is None:
            return CoreSolution(status="infeasible", nodes=self.nodes)
        _, assign = found
        value = self.prob.objective(assign) if mode == "time" else self.prob.price(assign)
        if cutoff is not None and math.isfinite(cutoff) and value >= cutoff * (1 - _REL):
            return CoreSolution(status="cutoff", bound=value, nodes=self.nodes)
        return CoreSolution(status="optimal", assign=assign, objective=value, bound=value, gap=0.0,
                            nodes=self.nodes)

    def exclude(self, assign: list[tuple[int, int]]) -> None:
        """Forbid this option sequence (any block split of it), as the MILP's no-good cut."""
        self.excluded.add(tuple(o for o, _ in assign))
