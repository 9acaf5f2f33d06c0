"""The capacity floor: a lower bound on the rent of a knob tuple's plans that meet a cap on the
iteration time (``cost-above-floor``: time <= tokens per iteration / the tokens/s floor).

Every schedule the search prices keeps each stage busy for m cycles of its forward and backward
(floors.py, the work floor), and a stage of option o at position pos runs
``a_o nb + c_o(pos)`` per micro-batch (its lines: slope per unit of blocks, the position's
intercept). Within the cap it therefore holds at most
``n_o(pos) = floor((cap / m - c_o(pos)) / a_o)`` units of blocks, and an option with
``n_o(pos) < 1`` cannot take that position at all.

So the stages' options, whatever else they do, must hold all L units between them: the
least rent of p options, one per stage role (first, p - 2 middle, last; one stage: the only
one; each role at its position, ``SearchSchedule.role_positions``), whose ``n`` add up to L
is a lower bound on the plan's rent. That is a small covering knapsack, solved exactly by a
min-plus recursion over the stages on the units held (``least_price``: p steps over an
(L + 1)-square table), memoised per cap and class set.

Under a budget on the rent it reads the other way (``least_time``): the least cap whose
capacity floor fits the budget bounds the time of every plan within it.

The work floor over the cap (floors.py) prices fractions of a replica's time; this counts
whole options: on bench scenario d at 5M tokens/s (OPT-350M on A100s) the answer needs 114
replicas in 15 nodes, where the work floor allowed 13.4 nodes' rent.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from planner.search import clock
from planner.search.slots import ENDS_ORDER, Position


@dataclass(frozen=True, eq=False)     # ndarrays and a memo: compared by identity
class Capacity:
    """A knob tuple's options, as the capacity floor reads them."""

    price_usd_per_hour: np.ndarray   # [option] rent share
    cls: np.ndarray                  # [option] node class
    slope_s: np.ndarray              # [option] forward + backward per unit of blocks
    icpt_s: np.ndarray               # [option, role] intercepts, in Position order
    num_micro_batches: int
    units: int                       # blocks / the tuple's block unit
    num_stages: int
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    def held_units(self, cap_s: float) -> np.ndarray:
        """[option, role]: the most units of blocks a stage there runs m times within
        ``cap_s`` (at most all of them; 0: the option cannot take the position)."""
        per_mb_s = cap_s * (1 + 1e-12) / self.num_micro_batches
        room = per_mb_s - self.icpt_s
        with np.errstate(divide="ignore", invalid="ignore"):
            units = np.where(self.slope_s[:, None] > 0, room / self.slope_s[:, None],
                             np.where(room >= 0, np.inf, -np.inf))
        return np.clip(np.floor(np.minimum(units, self.units) + 1e-9), 0, None)

    def least_price(self, cap_s: float, classes: tuple[int, ...] | None = None) -> float:
        """A lower bound on the rent of every plan on ``classes`` (None: any) whose time is
        within ``cap_s`` (module docstring); ``inf``: no such plan."""
        key = (cap_s, classes)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._least_price(cap_s, classes)
        return hit

    def least_time(self, budget_usd_per_hour: float, classes: tuple[int, ...] | None = None,
                   above_s: float = 0.0) -> float:
        """A lower bound on the time of every plan on ``classes`` (None: any) that rents at
        most ``budget_usd_per_hour``, at least ``above_s`` (the caller's bound so far: where
        the budget's floor allows a cap of ``above_s`` one knapsack says so, without the
        bisection); ``inf``: no such plan (the budget's time floor, module docstring)."""
        key = ("time", budget_usd_per_hour, classes, above_s)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._least_time(budget_usd_per_hour, classes, above_s)
        return hit

    def _least_time(self, budget: float, classes, above_s: float) -> float:
        # held_units only changes at the caps m (c_o(role) + k a_o), k = 1..L: between two of
        # them least_price is constant, and it only falls as the cap grows, so the least such
        # cap whose floor fits the budget is found by bisection over them, and no plan within
        # the budget is faster (a plan faster than it would fit a smaller cap's floor)
        caps = self._breakpoints()
        if self.least_price(float(caps[-1]), classes) > budget:
            return math.inf
        lo = int(np.searchsorted(caps, above_s, side="right")) - 1     # held_units(above_s) is held_units there
        if lo >= 0 and self._least_price(float(caps[lo]), classes) <= budget:
            return above_s
        hi = len(caps) - 1          # least_price(caps[lo]) > budget >= least_price(caps[hi])
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._least_price(float(caps[mid]), classes) > budget:
                lo = mid
            else:
                hi = mid
        return max(above_s, float(caps[hi]) * (1 - 1e-9))     # held_units' rounding may admit a cap a hair early

    def _breakpoints(self) -> np.ndarray:
        """The sorted caps where some option's held units change, 0 first (held_units at a cap
        below every positive one is held_units(0)); once per tuple."""
        caps = self._memo.get("breakpoints")
        if caps is None:
            roles = [Position.ONLY] if self.num_stages == 1 else list(ENDS_ORDER)
            k = np.arange(1, self.units + 1)
            per_mb_s = self.icpt_s[:, roles, None] + self.slope_s[:, None, None] * k
            caps = self._memo["breakpoints"] = np.unique(
                np.concatenate(([0.0], self.num_micro_batches * per_mb_s[per_mb_s > 0])))
        return caps

    def _least_price(self, cap_s: float, classes) -> float:
        # its work, for a deterministic search: p min-plus steps over an (L + 1)-square table
        clock.charge(max(1.0, self.num_stages * (self.units + 1) ** 2 / clock.ENUM_PER_UNIT))
        held = self.held_units(cap_s).astype(int)
        if classes is not None:
            held[~np.isin(self.cls, classes)] = 0
        L = self.units
        if self.num_stages > L:         # a stage holds a block at least
            return math.inf
        if self.num_stages == 1:
            return float(_cover_price(held[:, Position.ONLY], self.price_usd_per_hour, L)[L])
        # least rent to hold b units (b = L: all or more) after each stage, in stage order
        price = self.price_usd_per_hour
        covered = _cover_price(held[:, Position.FIRST], price, L)
        middle = _cover_price(held[:, Position.MIDDLE], price, L)
        for _ in range(self.num_stages - 2):
            covered = _min_plus(covered, middle, L)
        return float(_min_plus(covered, _cover_price(held[:, Position.LAST], price, L), L)[L])


def _cover_price(held: np.ndarray, price: np.ndarray, L: int) -> np.ndarray:
    """[h] the least price of one option holding at least h >= 1 units (inf at h = 0: a stage
    holds a block)."""
    exact = np.full(L + 1, np.inf)
    usable = held >= 1
    np.minimum.at(exact, held[usable], price[usable])
    out = np.minimum.accumulate(exact[::-1])[::-1]
    out[0] = np.inf
    return out


def _min_plus(before: np.ndarray, stage: np.ndarray, L: int) -> np.ndarray:
    """[b] the least of before[i] + stage[h] over i + h >= b, h >= 1 (capped at L): both
    arrays are least prices to hold *at least* so many units, so the stage needs at least
    ``max(b - i, 1)``."""
    return (before[None, :] + stage[_need(L)]).min(axis=1)


@functools.lru_cache(maxsize=64)
def _need(L: int) -> np.ndarray:
    """[b, i]: the units a stage must hold after ``i`` to reach ``b``, at least 1."""
    b, i = np.indices((L + 1, L + 1))
    return np.clip(b - i, 1, L)
