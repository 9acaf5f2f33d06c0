"""Plans found without proof: the incumbents the branch and bound of solve.py prunes against.

- **Warm start** (``warm_start``): the best-ranked knob tuples solved on a few options each
  (``warm_keys``), capped in time, before the exact pass.
- **Relaxation** (``relaxed``): a tuple too big for the exact MILP solved without its sends;
  its dual bound still bounds the tuple, and its plan, priced with the sends, is an incumbent.
- **Local search** (``polish_into``): such a plan improved over all of its tuple's options
  (polish.py).

``Best`` keeps the K best distinct candidates; ``exact_solver`` picks enumeration or the MILP.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace

from planner.search import clock
from planner.search.core import enum
from planner.search.core.milp import CoreMilp
from planner.search.core.problem import quick_bound
from planner.search.knobs import Knobs
from planner.search.polish import polish
from planner.search.schedules import SCHEDULES
from planner.search.twin_plans import BOUND_ONLY_TWINS, has_exact_twin, twin_assign, twin_index, twins_of

WARM_KEYS_ABOVE = 48        # options per stage above which a warm start pays for itself
WARM_RERANK = 8            # first stage counts re-ranked by the knapsack bound
WARM_SHARE = 0.5            # of the time left, for the warm start's enumerations
WARM_MILP_SHARE = 0.3       # of the time left, for its MILPs of longer pipelines
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
        """What makes two candidates the same plan (Best keeps distinct ones)."""
        return (self.knobs, tuple(self.layout), None if self.plan is None else id(self.plan))

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

    def __init__(self, k: int):
        self.k, self.items = k, []
        self._lock = threading.Lock()
        self._closed = False

    def add(self, cand: Candidate) -> None:
        sig = cand.signature
        with self._lock:
            if self._closed or any(c.signature == sig for c in self.items):
                return
            self.items = sorted([*self.items, cand], key=lambda c: c.key)[:self.k]

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
    until = min(deadline, clock.now() + WARM_TUPLE_SHARE * _horizon(settings))
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
                    min(deadline, clock.now() + POLISH_SHARE * _horizon(settings)))


def _horizon(settings) -> float:
    return min(settings.time_limit_s, WARM_HORIZON_S)


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


def add_twins(pricer, twins: dict, cand: Candidate | None, spec, launcher, best) -> None:
    """``cand`` 's layout as a plan of each twin tuple (twin_plans.py) where it fits there
    (memory per position, capacity, budget), priced exactly under the twin's schedule."""
    if cand is None or cand.plan is not None:
        return
    keys = list(dict.fromkeys(k for k, _ in cand.layout))
    for tw in twins_of(twins, cand.knobs):
        prob, qb = priced(pricer, tw.knobs, tw.ctx, keys, spec, launcher)
        assign = None if qb is None else twin_assign(prob, cand.layout, tw.knobs.block_unit)
        if assign is not None and prob.feasible(assign):
            best.add(Candidate.of(prob, assign, prob.objective(assign), tw.knobs, spec))


def _best_of(best, knobs: Knobs) -> Candidate | None:
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


def warm_keys(pricer, knobs: Knobs, keys) -> list:
    """A few options per (class, tp): the most replicas that fit when the class is split
    over k = 1, 2, 3, 4, 6, 8, ... stages.  A subset of the space, for a quick incumbent."""
    out = []
    groups: dict = {}
    for k in pricer.pure_part(keys):        # not the mixed stages' stand-ins
        groups.setdefault((k.cls, k.tp), []).append(k)
    for (c, t), ks in sorted(groups.items()):
        cap = pricer.classes[c].capacity_units
        for share in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32):
            if share > knobs.num_stages:
                break
            fit = [k for k in ks if pricer.classes[c].units(k.width, k.replicas) <= cap // share]
            if fit:
                best_k = max(fit, key=lambda k: k.replicas)
                if best_k not in out:
                    out.append(best_k)
    return out


def warm_start(pricer, knob_bound, ranked, spec, training, best, settings, deadline, launcher, say,
               share: float = WARM_SHARE, done: set | None = None, milp_share: float = WARM_MILP_SHARE):
    """Solve the best-ranked knob tuples on a small subset of options to get a good incumbent
    quickly; the full branch and bound that follows prunes against it.  Gives no bounds.
    ``done`` collects the tuples tried, so a second pass (after the exact pass, with the time
    left) continues where the first stopped."""
    now = clock.now()
    # enumerations (one and two stages) up to ``share`` of the time left; the MILPs of longer
    # pipelines up to WARM_MILP_SHARE of it (c: once its 12-stage tuple's plan is polished,
    # the other stage counts' capped MILPs rarely beat it, and the bounds need the time); the
    # first pass plans on at most WARM_HORIZON_S of it, the second (share 1) on all that is left
    left = max(0.0, deadline - now)
    if share < 1.0:
        left = min(left, WARM_HORIZON_S)
    # min with the deadline: past a deterministic search's wall guard now() is inf, and inf
    # stops compared "inf > inf" false, so the loop below went on past the limit
    stop = min(deadline, now + share * left)
    stop_milp = min(deadline, now + min(share, milp_share) * left)
    done = set() if done is None else done
    twins = twin_index(ranked)
    order = _warm_order(ranked, knob_bound, best, pricer, twins)
    found: dict = {}
    polished: set = set()
    late = False
    for kb, _, knobs, ctx, keys in order:
        if knobs.num_stages > ENUM_STAGES and best.items and clock.now() > stop_milp:
            continue
        if clock.now() > stop:
            if best.items or late or knobs.num_stages > ENUM_STAGES:
                break
            # no plan yet (the limit ran out while ranking): the first enumeration still runs
            # (milliseconds), so that a tight limit returns a plan rather than none
            late = True
        if knobs in done or kb >= best.threshold():
            continue
        done.add(knobs)
        # the warm start looks for plans without mixed stages (warm_keys): their bound decides
        if math.isfinite(best.threshold()) and _cannot_beat(knob_bound, knobs, ctx, pricer.pure_part(keys),
                                                            best.threshold()):
            continue            # no MILP for it (b: its p >= 3 tuples)
        prob, qb = priced(pricer, knobs, ctx, warm_keys(pricer, knobs, keys), spec, launcher)
        if qb is None:
            continue
        cut = best.threshold()
        # one long pipeline's MILP may take all the warm start's time to prove what it found in
        # its first seconds: cap it, so that more stage counts get their try
        solver = exact_solver(prob)
        if late and not isinstance(solver, enum.CoreEnum):
            break                   # a MILP is not milliseconds
        until = None if late else min(stop_milp if knobs.num_stages > ENUM_STAGES else stop,
                                      clock.now() + WARM_TUPLE_SHARE * _horizon(settings))
        sol = solver.solve(settings, deadline=until, cutoff=cut if math.isfinite(cut) else None)
        if sol.ok and sol.objective < best.threshold():
            say(f"warm start {knobs.label()}: {sol.objective:.4g} s")
            cand = Candidate.of(prob, sol.assign, sol.objective, knobs, spec)
            best.add(cand)
            found[knobs] = (ctx, keys, prob, sol.assign)
            if not late and knobs.num_stages > ENUM_STAGES:
                # at once, so that the next MILPs have its cutoff (c: 2.565 s to 2.409 s)
                polish_into(pricer, knobs, ctx, keys, prob, sol.assign, spec, launcher, best,
                            min(stop_milp, clock.now() + POLISH_SHARE * _horizon(settings)))
                polished.add(knobs)
            # the polished plan where it leads, else the one found (its time exact either way)
            add_twins(pricer, twins, _best_of(best, knobs) or cand, spec, launcher, best)
    # the incumbent was found on a few options of its tuple: local search on all of them
    top = best.items[0] if best.items else None
    if top is not None and top.knobs in found and top.knobs not in polished:
        ctx, keys, prob, assign = found[top.knobs]
        polish_into(pricer, top.knobs, ctx, keys, prob, assign, spec, launcher, best,
                    min(deadline, clock.now() + POLISH_SHARE * _horizon(settings)))


def _cannot_beat(knob_bound, knobs, ctx, keys, threshold: float) -> bool:
    """Whether the tuple's bound on ``keys`` shows it cannot beat ``threshold``: the cheap
    level first; a MILP (longer pipelines) only after the packed levels too, which cost
    milliseconds to a tenth of a second where a capped warm-start MILP that finds nothing
    costs its whole cap (b: four p = 3-4 tuples bounded at 0.25-0.28 s against a 0.389 s
    incumbent ran 0.5-1.4 s each; their packed bounds rule them out, as the search's own
    pass does later)."""
    levels = (False,) if knobs.num_stages <= ENUM_STAGES else (False, 1, 2)
    return any(knob_bound(knobs, ctx, keys, enough=threshold, packed=level) >= threshold for level in levels)


def _warm_order(ranked, knob_bound, best, pricer, twins: dict):
    """The warm start's tuples, diverse first: the best-ranked tuple of each stage count (the
    memory-free ranking favours long pipelines, whose memory limits it cannot see).

    1. One and two stages, which enumeration solves in milliseconds, one per micro-batch size
       and schedule too: by stage count (one stage is the cheapest to enumerate), then in the order of
       their bounds (the likely best first: under a tight limit the first plan may be the only
       one; a's came last of 10 in micro-batch order).
    2. The longer ones, ranked once those enumerations have set an incumbent: the ones it
       does not rule out, in the order of their memory-aware bound, the first WARM_RERANK
       of them by their knapsack bound (c: its 12-stage tuple comes first instead of fifth,
       after the 3-, 4-, 6- and 8-stage ones whose MILPs only lost time).
    3. The rest of ``ranked``.

    A longer ZB-H1 tuple with an exact twin (twin_plans.py) is not among the stage counts'
    firsts: its rows only bound its time, so it ranks first and its capped MILP rarely finds
    a plan (c: none in 2-3 s each, and the interleaved tuple that finds the answer's layout
    never ran); its plans come from the twins' layouts (``add_twins``).
    """
    first: dict[tuple, tuple] = {}
    for item in ranked:
        p = item.knobs.num_stages
        if p > ENUM_STAGES and item.knobs.schedule in BOUND_ONLY_TWINS and has_exact_twin(twins, item.knobs):
            continue
        # an enumeration per schedule too: the memory-free ranking puts the interleaved twin
        # first, whose plans may not fit, and the 1F1B twin that holds the answer waited behind
        # every longer pipeline's MILP (README job: found at 4.9 s instead of 0.7 s)
        first.setdefault((p, item.knobs.micro_batch_size, item.knobs.schedule) if p <= ENUM_STAGES
                         else (p, 0, ""), item)
    enums = sorted((x for k, x in first.items() if k[0] <= ENUM_STAGES), key=lambda x: (x.knobs.num_stages, x.bound_s, x.index))
    yield from enums
    threshold = best.threshold()
    memory = {k: knob_bound(x.knobs, x.ctx, pricer.pure_part(x.keys), enough=threshold, packed=False)
              for k, x in first.items() if k[0] > ENUM_STAGES}
    longer = sorted((k for k in memory if memory[k] < threshold), key=memory.get)
    head = sorted(longer[:WARM_RERANK],
                  key=lambda k: knob_bound(first[k].knobs, first[k].ctx, pricer.pure_part(first[k].keys),
                                           enough=threshold, packed=1))
    yield from (first[k] for k in head + longer[WARM_RERANK:])
    seen = {id(x) for x in first.values()}
    yield from (x for x in ranked if id(x) not in seen)
