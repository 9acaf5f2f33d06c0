"""Plans found without proof: the incumbents the branch and bound of solve.py prunes against.

- **Warm start** (warm.py): the best-ranked knob tuples solved on a few options each,
  capped in time, before the exact pass.
- **Relaxation** (``relaxed``): a tuple too big for the exact MILP solved without its sends;
  its dual bound still bounds the tuple, and its plan, priced with the sends, is an incumbent.
- **Local search** (``polish_into``): such a plan improved over all of its tuple's options
  (polish.py).

``Best`` keeps the K best distinct candidates; ``exact_solver`` picks enumeration or the MILP.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace

from planner.search import clock
from planner.search.core import enum
from planner.search.core.milp import CoreMilp
from planner.search.core.problem import quick_bound
from planner.search.knobs import Knobs, OptionKey
from planner.search.polish import polish
from planner.search.schedules import SCHEDULES
from planner.search.twin_plans import twin_assign, twins_of

WARM_TUPLE_SHARE = 0.07     # of the time limit, at most, for one tuple's warm-start MILP
POLISH_SHARE = 0.02         # of the time limit, at most, for one local search (polish.py)
# The shares above are of a limit of at most this: a longer limit is time to prove in, not a
# reason to spend longer on incumbents (lab-mixed's job took 159 s to prove under a 600-s
# limit against 24 s under 60 s, its warm-start MILPs capped at 42 s each instead of 4.2 s)
WARM_HORIZON_S = 60.0
ENUM_STAGES = 2             # pipelines this short are solved by enumeration (core/enum.py)
RELAX_MAX_VARS = 20_000     # stage x option pairs of a send-free MILP we still build


@dataclass
class Candidate:
    key: tuple[float, ...]
    time_s: float
    price_usd_per_hour: float
    knobs: Knobs
    layout: list            # [(OptionKey, blocks)] per stage
    # a plan given whole rather than as a layout (the old plan a replan starts from, given.py):
    # the answer is then that plan itself, its devices as named
    plan: object = None

    @property
    def signature(self) -> tuple:
        """What makes two candidates the same plan (Best keeps distinct ones).  Where every
        stage holds one copy of its weights (one replica, no context ranks), ZeRO shards
        nothing: its stages, HSDP groups and resharding name the same run, so they count as
        ZeRO 0 (``--top`` listed such twins as distinct plans)."""
        knobs = self.knobs
        if knobs.zero_stage and all(getattr(key, "ranks", 0) == 1 for key, _ in self.layout):
            knobs = replace(knobs, zero_stage=0, reshard_after_forward=True, zero_shard_degree=None)
        return (knobs, tuple(self.layout), None if self.plan is None else id(self.plan))

    @classmethod
    def of(cls, prob, assign, time_s: float, knobs: Knobs, spec) -> Candidate:
        """``assign`` on ``prob`` taking ``time_s`` per iteration: its price, its ranking key
        under the objective ``spec`` and its layout."""
        price = prob.price(assign)
        # the rows of a schedule may only bound its time (schedules.py): price it exactly
        time_s = SCHEDULES[knobs.schedule].exact_time_s(prob, assign, knobs.num_micro_batches, time_s)
        return cls(spec.key(price, time_s), time_s, price, knobs, layout(prob, assign, knobs))


class Best:
    """The K best distinct candidates so far.  The warm start may add to it from a thread beside
    the heap (background.py): ``add`` takes a lock and puts a new list in place, so a reader of
    ``items`` sees the old list or the new one, never one being sorted (CPython's sort empties
    the list while it runs)."""

    def __init__(self, k: int, identical: list | None = None):
        self.k, self.items = k, []
        # per class index, a key shared by identical classes (the per-node view's nodes of one
        # class): layouts that differ only by a swap of them are one plan (``_signature``)
        self.identical = identical
        self._lock = threading.Lock()
        self._closed = False
        self._found: dict[tuple, float] = {}     # signature -> time.monotonic() it first entered

    def _signature(self, cand: Candidate) -> tuple:
        sig = cand.signature
        if self.identical is None:
            return sig
        knobs, layout, given = sig
        ordinal: dict = {}
        canon = []
        for key, blocks in layout:
            if isinstance(key, OptionKey):      # mixed stages' keys keep their classes
                group = self.identical[key.cls]
                ordinal.setdefault(key.cls, sum(1 for c in ordinal if self.identical[c] == group))
                key = (group, ordinal[key.cls], key.tp, key.replicas, key.cp)
            canon.append((key, blocks))
        return knobs, tuple(canon), given

    def add(self, cand: Candidate) -> None:
        sig = self._signature(cand)
        with self._lock:
            same = next((c for c in self.items if self._signature(c) == sig), None)
            if self._closed or (same is not None and same.key <= cand.key):
                return
            items = sorted([*(c for c in self.items if c is not same), cand], key=lambda c: c.key)[:self.k]
            if any(c is cand for c in items) and (same is not None or sig not in self._found):
                self._found[sig] = time.monotonic()     # new, or a better twin: the value entered now
            self.items = items

    def found_at(self, cand: Candidate) -> float | None:
        """When ``cand`` first entered (time.monotonic()), None if it never did."""
        return self._found.get(self._signature(cand))

    def close(self) -> None:
        """No more candidates: the answer is built from ``items`` as they are now (a warm start
        left running past the search, background.py, may still offer some)."""
        with self._lock:
            self._closed = True

    def threshold(self) -> float:
        """Value a new candidate must beat to enter (inf while fewer than K)."""
        return self.items[-1].key[0] if len(self.items) >= self.k else float("inf")


class Shared(Best):
    """The incumbents of another objective's search run inside this one (the throughput warm
    start, under the cost objectives): every candidate it is offered also goes, re-keyed under
    ``spec``, to ``target`` when it meets ``spec`` 's budget or floor (``admits``), so that every
    plan priced during the search, of any objective, is a candidate for every objective."""

    def __init__(self, k: int, target: Best, spec, admits):
        super().__init__(k)
        self.target, self.spec, self.admits = target, spec, admits

    def add(self, cand: Candidate) -> None:
        super().add(cand)
        mine = replace(cand, key=self.spec.key(cand.price_usd_per_hour, cand.time_s))
        if self.admits(mine):
            self.target.add(mine)


def layout(prob, assign, knobs: Knobs) -> list:
    """[(OptionKey, blocks)] per stage of a CoreProblem's assignment (blocks, not core units)."""
    return [(prob.options[o].label, nb * knobs.block_unit) for o, nb in assign]


def priced(pricer, knobs, ctx, keys, spec, launcher, sends: bool = True) -> tuple:
    """The tuple's CoreProblem on ``keys``, prepared for the objective and the launcher, and
    its quick bound (None: some stage has no option)."""
    clock.charge(len(keys) * knobs.num_stages)     # pricing's work, for a deterministic search
    prob = pricer.price(knobs, ctx, keys, sends=sends)
    prepare(prob, spec, launcher)
    return prob, (quick_bound(prob) if prob.options else None)


def mapped(prob, assign: list, onto) -> list:
    """``assign`` (over ``prob`` 's options) over ``onto`` 's options, matched by label."""
    index = {opt.label: i for i, opt in enumerate(onto.options)}
    return [(index[prob.options[o].label], nb) for o, nb in assign]


def exact_solver(prob):
    """One or two stages: every assignment priced at once (core.enum); longer pipelines: the MILP."""
    return enum.CoreEnum(prob) if enum.fits(prob) else CoreMilp(prob)


def prepare(prob, spec, launcher) -> None:
    if launcher:
        prob.same_group = True
        for o in prob.options:
            o.group = (o.label.tp, o.label.replicas)
    if spec.kind == "throughput-under-budget":
        prob.budget_usd_per_hour = spec.budget_usd_per_hour


def relaxed(pricer, knobs, ctx, keys, lb, spec, launcher, best, bounds, stats, settings, deadline, gap_rel,
            time_like) -> None:
    """A tuple too big for the exact MILP: solve it without the pipeline sends (no pairwise
    terms; a relaxation, so its dual bound bounds the tuple), and price the plan it finds with
    its sends as an incumbent.  The tuple stays unexplored unless the bound prunes it."""
    # Pricing and building a relaxed MILP cannot be interrupted (only HiGHS can): start one only
    # when the time left exceeds the longest such set-up so far (c overran its limit by 1 s).
    if (not time_like or len(keys) * knobs.num_stages > RELAX_MAX_VARS
            or deadline - clock.now() < stats.relaxed_setup_s):
        stats.unexplored += 1
        bounds.append(lb)
        return
    started = clock.now()
    prob, qb = priced(pricer, knobs, ctx, keys, spec, launcher, sends=False)
    if qb is None:
        stats.empty += 1
        return
    lb = max(lb, qb)
    cut = best.threshold() * (1 - gap_rel)
    if lb >= cut:
        stats.pruned += 1
        bounds.append(lb)
        return
    solver = exact_solver(prob)
    stats.relaxed_setup_s = max(stats.relaxed_setup_s, clock.now() - started)
    # capped like a warm start: a relaxation that cannot prune in a few seconds rarely does
    # later, and the time is better spent on the next tuples
    until = share_until(deadline, WARM_TUPLE_SHARE, settings)
    sol = solver.solve(settings, deadline=until, cutoff=cut if math.isfinite(cut) else None)
    stats.relaxed += 1
    if sol.status == "infeasible":
        stats.empty += 1
        return
    bound = max(lb, sol.bound) if sol.bound is not None else lb
    bounds.append(bound)
    if sol.status == "cutoff" or bound >= cut:
        stats.pruned += 1
        return
    stats.unexplored += 1
    if not sol.ok:
        return
    # the plan it found, priced with its sends
    chosen = list(dict.fromkeys(prob.options[o].label for o, _ in sol.assign))
    full, _ = priced(pricer, knobs, ctx, chosen, spec, launcher)
    found = mapped(prob, sol.assign, full)
    orders = [(full.objective(a), a) for a in grouped_orders(full, found) if full.feasible(a)]
    if not orders:
        return
    t, assign = min(orders, key=lambda x: x[0])
    if t < best.threshold():
        best.add(Candidate.of(full, assign, t, knobs, spec))
        polish_into(pricer, knobs, ctx, keys, full, assign, spec, launcher, best,
                    share_until(deadline, POLISH_SHARE, settings))


def warm_horizon_s(settings) -> float:
    """The limit the warm start's shares are of (WARM_HORIZON_S at most)."""
    return min(settings.time_limit_s, WARM_HORIZON_S)


def share_until(deadline: float, share: float, settings) -> float:
    """When a step given ``share`` of the warm horizon from now must stop (``deadline`` at the
    latest): the caps of the warm start's and the support plans' MILPs and polishes."""
    return min(deadline, clock.now() + share * warm_horizon_s(settings))


def polish_into(pricer, knobs, ctx, keys, prob, assign, spec, launcher, best, deadline) -> None:
    """A plan found on a subset of the tuple's options (a warm start, a relaxation): local
    search (polish.py) on all of them, for a better incumbent; proves nothing."""
    if deadline is not None and clock.now() >= deadline:
        # pricing all the options cannot be interrupted (1.5 s on bench scenario c, under
        # load): past the deadline it only made --time-limit late (issue 19)
        return
    full, _ = priced(pricer, knobs, ctx, keys, spec, launcher)
    start = mapped(prob, assign, full)
    if not full.feasible(start):
        return
    t, found = polish(full, start, deadline=deadline)
    if t < best.threshold():
        best.add(Candidate.of(full, found, t, knobs, spec))


def add_twins(pricer, twins: dict, cand: Candidate | None, spec, launcher, best,
              deadline: float | None = None) -> None:
    """``cand`` 's layout as a plan of each twin tuple (twin_plans.py) where it fits there
    (memory per position, capacity, budget), priced exactly under the twin's schedule, then
    polished (polish.py) on the layout's own options under the twin's rows until
    ``deadline``: the same blocks are rarely the twin's best split (c + zb-h1: the interleaved
    answer's layout is 1.966 s under ZB-H1, 1.866 s polished, 3% under the answer)."""
    if cand is None or cand.plan is not None:
        return
    keys = list(dict.fromkeys(k for k, _ in cand.layout))
    for tw in twins_of(twins, cand.knobs):
        prob, qb = priced(pricer, tw.knobs, tw.ctx, keys, spec, launcher)
        assign = None if qb is None else twin_assign(prob, cand.layout, tw.knobs.block_unit)
        if assign is not None and prob.feasible(assign):
            best.add(Candidate.of(prob, assign, prob.objective(assign), tw.knobs, spec))
            if deadline is not None and clock.now() < deadline:
                t, found = polish(prob, assign, deadline=deadline)
                if found != assign:
                    best.add(Candidate.of(prob, found, t, tw.knobs, spec))


def best_of(best, knobs: Knobs) -> Candidate | None:
    """The best incumbent of ``knobs``, if any."""
    return next((c for c in best.items if c.knobs == knobs), None)


def grouped_orders(prob, assign: list) -> list:
    """The relaxation's stages in their own order and with the stages of each class side by
    side (classes in order of first appearance, and reversed).  Without sends the order
    barely mattered to it (only the end stages' embedding / head and the in-flight memory per
    position tell the stages apart); with them each change of class is a send between classes,
    often across a zone link."""
    out = [assign]
    cls = [prob.options[o].label.cls for o, _ in assign]
    first = list(dict.fromkeys(cls))
    for order in (first, first[::-1]):
        grouped = [a for c in order for a, k in zip(assign, cls) if k == c]
        if grouped not in out:
            out.append(grouped)
    return out
