"""The warm start: the best-ranked knob tuples solved on a few options each, capped in time,
before the exact pass (or beside it, background.py), for incumbents the branch and bound
prunes against; gives no bounds.  Each longer tuple first on the options its own position
LPs weigh (support_plans.py), then on ``warm_keys``."""

from __future__ import annotations

import math

from planner.search import clock
from planner.search.core import enum
from planner.search.incumbent import (
    ENUM_STAGES,
    POLISH_SHARE,
    WARM_HORIZON_S,
    WARM_TUPLE_SHARE,
    Candidate,
    add_twins,
    best_of,
    exact_solver,
    polish_into,
    priced,
    share_until,
)
from planner.search.knobs import Knobs
from planner.search.support_plans import Planning, support_plan
from planner.search.twin_plans import BOUND_ONLY_TWINS, has_exact_twin, twin_index

WARM_KEYS_ABOVE = 48        # options per stage above which a warm start pays for itself
WARM_RERANK = 8            # first stage counts re-ranked by the knapsack bound
WARM_SHARE = 0.5            # of the time left, for the warm start's enumerations
WARM_MILP_SHARE = 0.3       # of the time left, for its MILPs of longer pipelines


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
    on_support = Planning(pricer, knob_bound, spec, launcher, best, settings, stop_milp)
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
        # first on the options its position LPs (just run by _cannot_beat) weighed: e's
        # 12-stage tuple 2.278 s -> 2.144 s, where the MILP on warm_keys found none better;
        # then its twins on its layout, polished (c + zb-h1's plan comes from there)
        if knobs.num_stages > ENUM_STAGES and not late and support_plan(on_support, knobs, ctx, keys):
            add_twins(pricer, twins, best_of(best, knobs), spec, launcher, best,
                      share_until(stop_milp, POLISH_SHARE, settings))
        prob, qb = priced(pricer, knobs, ctx, warm_keys(pricer, knobs, keys), spec, launcher)
        if qb is None:
            continue
        cut = best.threshold()
        # one long pipeline's MILP may take all the warm start's time to prove what it found in
        # its first seconds: cap it, so that more stage counts get their try
        solver = exact_solver(prob)
        if late and not isinstance(solver, enum.CoreEnum):
            break                   # a MILP is not milliseconds
        until = None if late else share_until(stop_milp if knobs.num_stages > ENUM_STAGES else stop,
                                              WARM_TUPLE_SHARE, settings)
        sol = solver.solve(settings, deadline=until, cutoff=cut if math.isfinite(cut) else None)
        if sol.ok and sol.objective < best.threshold():
            say(f"warm start {knobs.label()}: {sol.objective:.4g} s")
            cand = Candidate.of(prob, sol.assign, sol.objective, knobs, spec)
            best.add(cand)
            found[knobs] = (ctx, keys, prob, sol.assign)
            if not late and knobs.num_stages > ENUM_STAGES:
                # at once, so that the next MILPs have its cutoff (c: 2.565 s to 2.409 s)
                polish_into(pricer, knobs, ctx, keys, prob, sol.assign, spec, launcher, best,
                            share_until(stop_milp, POLISH_SHARE, settings))
                polished.add(knobs)
            # the polished plan where it leads, else the one found (its time exact either way)
            add_twins(pricer, twins, best_of(best, knobs) or cand, spec, launcher, best,
                      share_until(stop_milp, POLISH_SHARE, settings))
    # the incumbent was found on a few options of its tuple: local search on all of them
    top = best.items[0] if best.items else None
    if top is not None and top.knobs in found and top.knobs not in polished:
        ctx, keys, prob, assign = found[top.knobs]
        polish_into(pricer, top.knobs, ctx, keys, prob, assign, spec, launcher, best,
                    share_until(deadline, POLISH_SHARE, settings))


def _cannot_beat(knob_bound, knobs, ctx, keys, threshold: float) -> bool:
    """Whether the tuple's bound on ``keys`` shows it cannot beat ``threshold``: the cheap
    level first; a MILP (longer pipelines) only after the packed levels too, which cost
    milliseconds to a tenth of a second where a capped warm-start MILP that finds nothing
    costs its whole cap (b: four p = 3-4 tuples bounded at 0.25-0.28 s against a 0.389 s
    incumbent ran 0.5-1.4 s each; their packed bounds rule them out, as the search's own
    pass does later)."""
    levels = (False,) if knobs.num_stages <= ENUM_STAGES else (False, 1, 2)
    return any(knob_bound(knobs, ctx, keys, enough=threshold, packed=level) >= threshold for level in levels)


def _steady(knobs: Knobs) -> bool:
    """Whether the pipeline reaches a steady state: at least as many micro-batches as stages."""
    return knobs.num_micro_batches >= knobs.num_stages


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

    A longer pipeline's first is one with at least as many micro-batches as stages where its
    stage count has one (``_steady``): the memory-free and memory-aware bounds underrate the
    fill of a pipeline that never reaches a steady state (bubble (p - 1) / (m + p - 1), over
    half), so the best-ranked tuple of a stage count was often one of m = 3-6 on 6-13 stages
    (c with zb-h1 alone: p = 8's was m = 3, whose plans are 2.426 s where m = 8 gives 1.932 s;
    no warm-start MILP beat the 2.005-s baseline in 30 s, 1.918 s after).

    A longer ZB-H1 tuple with an exact twin (twin_plans.py) is not among the stage counts'
    firsts: its rows only bound its time, so it ranks first and its capped MILP rarely finds
    a plan (c: none in 2-3 s each, and the interleaved tuple that finds the answer's layout
    never ran); its plans come from the twins' layouts (``add_twins``).  Once such a twin plan
    holds the incumbent, the rule is lifted (the second pass, ``later_warm_start``): the
    schedule has shown it wins here, and its tuples' support plans find its plans (c + zb-h1:
    the interleaved answer's ZB-H1 twin, polished, 1.866 s; then the p = 10 ZB-H1 tuple's
    support plan 1.828 s, where ZB-H1 alone finds 1.828 s and 300 s of the mixed space 1.826 s).
    """
    first: dict[tuple, tuple] = {}
    # once a bound-only schedule holds the incumbent (its twin plan won), its tuples are where
    # the next plans are: they may be firsts again
    bound_only_won = bool(best.items) and best.items[0].knobs.schedule in BOUND_ONLY_TWINS
    # per stage count a tuple that reaches a steady state first, where one does (stable: in
    # the ranking's order otherwise)
    for item in sorted(ranked, key=lambda x: x.knobs.num_stages > ENUM_STAGES and not _steady(x.knobs)):
        p = item.knobs.num_stages
        if (p > ENUM_STAGES and item.knobs.schedule in BOUND_ONLY_TWINS and has_exact_twin(twins, item.knobs)
                and not bound_only_won):
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
