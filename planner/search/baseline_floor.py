"""The compute floor of a baseline layout (a lower bound on its iteration time from its
stages' forward and backward slopes), and the test, made before any memory check, that none
of a rule's remaining candidates could be priced.

``seed`` leaves a layout unpriced when its floor reaches its rule's best and the incumbents'
threshold.  A rule takes the first of its candidates (replica counts, largest first) that fits
memory, so when neither the even-split layout nor the Metis re-split of any candidate left can
be priced, no memory check can change what is priced: the rule stops there.  Each candidate's
floor per micro-batch depends on the knob tuple only through its options, B, the stage count
and what the lines read, so it is computed once per seed call and shared by the tuples that
differ in the schedule, ZeRO stage or micro-batch count (c: 516 tuples, most of their
candidates ruled out without a memory model).
"""

from __future__ import annotations

import math
from collections.abc import Callable

# The schedules whose rows (schedules.py) bound the iteration time from below by
# (m - a) x the busiest stage's forward + backward plus a x every stage's: 1F1B's
# (m - 1) max_s c_s + sum_s c_s (a = 1); GPipe's, forward and backward apart, at least that
# (a = 1); interleaved's (m - 1/v) max + (1/v) sum (a = 1/v); sends, the exposed DP sync and
# the optimizer step only add.  ZB-H1's time (its closed form, not its rows) at least m x the
# worst cycle (a = 0: the fill it takes back).  Not BitPipe (a rank averages its pair's work),
# nor the V schedules or latency-aware (no such closed form).
COMPUTE_FLOOR_SCHEDULES = frozenset({"1f1b", "gpipe", "interleaved-1f1b", "zb-h1"})

# A hair of slack on a kept layout's floor: a stage's fixed parts, read as intercepts of lines,
# may round below 0 (seed keeps a layout whose floor is under its threshold x (1 + this))
FLOOR_SLACK = 1e-9
# The rules' test ahead of the memory checks adds up the same floors in another order, or
# bounds a Metis re-split's by the harmonic mean: it rules a candidate out only with this much
# more room, far above the rounding of either
BOUND_ROOM = 1e-6


def fill_weight(knobs) -> float:
    """a of the floor (m - a) x busiest + a x all stages (COMPUTE_FLOOR_SCHEDULES)."""
    if knobs.schedule == "interleaved-1f1b":
        return 1.0 / knobs.virtual_stages
    return 0.0 if knobs.schedule == "zb-h1" else 1.0


def stage_work_s(pricer, tup, cls: int, tp: int, replicas: int) -> float:
    """Forward plus backward slope, per core unit of blocks, of a replica of ``tp`` GPUs of
    class ``cls`` on its share of the tuple's micro-batch over ``replicas`` (the pricer's
    cached lines)."""
    f = pricer.kind_lines(tup.ctx, cls, tp, -(-tup.knobs.micro_batch_size // replicas), tup.unit)
    return f[0] + f[1]


def compute_floor_s(pricer, tup, lay) -> float:
    """A lower bound on the layout's iteration time from its stages' forward and backward
    slopes alone (the stages' fixed parts, sends, DP sync and optimizer only add): m - a
    micro-batches of the busiest stage and a of every stage (``fill_weight``); 0 where the
    schedule gives no such bound."""
    knobs = tup.knobs
    if knobs.schedule not in COMPUTE_FLOOR_SCHEDULES:
        return 0.0
    units = lay.units or [tup.L_units // knobs.num_stages] * knobs.num_stages
    busiest = total = 0.0
    for k, u in zip(lay.keys, units):
        work = u * stage_work_s(pricer, tup, k.cls, k.tp, k.replicas)
        busiest, total = max(busiest, work), total + work
    a = fill_weight(knobs)
    return (knobs.num_micro_batches - a) * busiest + a * total


def kept(floor_s: float, threshold_s: float) -> bool:
    """Whether seed prices a layout of this compute floor against this threshold."""
    return floor_s < threshold_s * (1 + FLOOR_SLACK)


class Floors:
    """A rule's candidates in the order it tries them, each with lower bounds on the busiest
    stage's and all stages' forward + backward per micro-batch, for its even split and for
    its Metis re-split, and their minima from each position on.

    ``stages``: per candidate, the stages' slopes (or lower bounds on them) as (count,
    slope) pairs.  An even split's busiest is the largest slope's stage (a product's rounding
    keeps the order).  Any split with u_s blocks on stage s has some u_s w_s >= H = L /
    sum(1 / w) (the u_s sum to L), and all stages at least L min w.  With the slopes ``exact``
    (not lower bounds), the re-split is Metis' own (baselines._proportional on the speeds 1 /
    w): u_s > L w_s^-1 / sum w^-1 - 1, so u_s w_s > H - w_s, and u_s >= 1.  Spanning one
    class, a candidate has no re-split (inf)."""

    def __init__(self, tup, stages: list[list[tuple[int, float]]], exact: bool):
        L, even = tup.L_units, tup.L_units // tup.knobs.num_stages
        rows = []
        for pairs in stages:
            used = [(k, w) for k, w in pairs if k]
            if len(used) < 2:
                k, w = used[0]
                rows.append((even * w, even * (k * w), math.inf, math.inf))
                continue
            ws = [w for _, w in used]
            busiest, total = even * max(ws), even * sum(k * w for k, w in used)
            harmonic = L / sum(k / max(1e-30, w) for k, w in used)
            any_total = L * min(ws)
            if exact:
                any_total = max(any_total, sum(k * max(w, harmonic - w) for k, w in used))
            rows.append((busiest, total, harmonic, any_total))
        self.rest = [(math.inf,) * 4] * (len(rows) + 1)     # per position: the minima from there on
        b0 = t0 = b1 = t1 = math.inf
        for i in range(len(rows) - 1, -1, -1):
            b, t, ab, at = rows[i]
            b0, t0, b1, t1 = min(b, b0), min(t, t0), min(ab, b1), min(at, t1)
            self.rest[i] = (b0, t0, b1, t1)


class Unpriced:
    """Per tuple: whether a rule's candidates from some position on would all be left
    unpriced by seed, with their Metis re-splits.  ``floor_of``: rule -> its threshold, read
    once (nothing is priced while a tuple's layouts are built)."""

    def __init__(self, tup, floor_of: Callable[[str], float]):
        self.m, self.a = tup.knobs.num_micro_batches, fill_weight(tup.knobs)
        self.p, self.L_units = tup.knobs.num_stages, tup.L_units
        self.active = tup.knobs.schedule in COMPUTE_FLOOR_SCHEDULES
        self.threshold = {r: floor_of(r) for r in ("megatron", "sailor", "metis")}

    def _out(self, busiest: float, total: float, rule: str) -> bool:
        if math.isinf(busiest):
            return True         # no such layout (and 0 x inf would be nan)
        floor = (self.m - self.a) * busiest + self.a * total
        return floor * (1 - BOUND_ROOM) >= self.threshold[rule] * (1 + FLOOR_SLACK)

    def rest_dropped(self, rule: str, floors: Floors, i: int) -> bool:
        """Whether candidates ``i``.. of ``floors`` are all left unpriced: each even split's
        floor reaches the rule's threshold and each re-split's the Metis one (the minima
        bound each candidate's floor from below)."""
        if not self.active:
            return False
        busiest, total, any_busiest, any_total = floors.rest[i]
        return self._out(busiest, total, rule) and self._out(any_busiest, any_total, "metis")

    def one_class_dropped(self, rule: str, least_slope: float) -> bool:
        """Whether every even split on one class whose stages' slopes are at least
        ``least_slope`` is left unpriced (such a layout has no re-split)."""
        if not self.active:
            return False
        L = self.L_units
        return self._out(L // self.p * least_slope, L * least_slope, rule)
