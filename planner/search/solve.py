"""``solve(cluster, model, training, ...)``: branch and bound over the global knobs, an exact
MILP (planner.search.core) per knob tuple, devices named at the end, every answer
re-evaluated with ``planner.cost.evaluate``.

Per knob tuple (micro-batch size, schedule, recompute, ZeRO, stages) the stage options are
priced with the cost model (space.py) and the core MILP finds the best assignment of node
classes, TP, replica counts and block ranges to stages.  Knob tuples whose cheap lower bound
(core.problem.quick_bound) cannot beat the K-th best plan found so far are pruned; the proved
bound is the least, over all tuples, of the MILP's dual bound or the pruning bound.  The plans
found without proof that it prunes against (warm start, relaxations, local search) come from
incumbent.py.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable

from planner.cost import topology_for
from planner.errors import InfeasibleError, InputError
from planner.plan.model import SolverReport
from planner.search import apart, clock
from planner.search.answer import SHORT_UNITS, SearchResult, finish
from planner.search.background import BackgroundWarmStart, concurrent_allowed
from planner.search.baselines import BASELINE_SHARE, admits, seed
from planner.search.bound import KnobBound
from planner.search.classes import class_infos, classes_without_bf16, per_node_view
from planner.search.core import enum
from planner.search.core.milp import MilpSettings
from planner.search.floors import TupleFloors, floors_until
from planner.search.given import given_candidates
from planner.search.incumbent import Best, Shared, exact_solver, priced
from planner.search.knobs import check_expert_degrees, enumerate_knobs
from planner.search.mixed import class_pairs
from planner.search.objectives import ObjectiveSpec, parse_objective
from planner.search.per_tuple import loses_tie, prunes, solve_tuple
from planner.search.phases import (
    ANY_PLAN_GAP,
    COUNTS,
    answer_found,
    distinct,
    elapsed,
    own_wall_guard,
    rest_of_limit,
)
from planner.search.queue import BoundLevel, Pending, Ranked
from planner.search.schedules import schedules_for
from planner.search.space import Pricer
from planner.search.stats import SearchStats
from planner.search.support_plans import SearchState, too_big
from planner.search.tuple_inputs import TupleInputs
from planner.search.twins import gpipe_dominated, one_stage_zb_h1_twins
from planner.search.warm import WARM_KEYS_ABOVE, warm_start

MEGATRON_LAUNCHERS = ("megatron", "deepspeed")


def check_args(training, time_limit_s, top_k: int, launcher: str | None) -> None:
    """The search's arguments, each refused with what would be valid."""
    check_time_limit(time_limit_s)
    if top_k < 1:
        raise InputError(f"--top must be at least 1, got {top_k}")
    if launcher is not None and launcher not in MEGATRON_LAUNCHERS:
        raise InputError(f"unknown launcher {launcher!r}; choose megatron or deepspeed")
    if launcher is not None and training.mixed_stages:
        raise InputError(f"mixed stages (--mixed-stages, training.mixed_stages) contradict --launcher {launcher}: "
                         "its layouts have the same GPUs, TP and share in every replica of a stage; drop one of the two")
    if launcher is not None and not schedules_for(training, launcher):
        raise InputError(f"training.schedules ({', '.join(training.schedules)}) holds no schedule --launcher "
                         f"{launcher} can run (it has no zero-bubble schedule); add 1f1b, gpipe or interleaved-1f1b")


def check_time_limit(time_limit_s) -> None:
    """A time limit is a positive, finite number of seconds (nan and inf are not)."""
    if not time_limit_s or not math.isfinite(time_limit_s) or time_limit_s <= 0:
        raise InputError(f"the time limit must be a positive number of seconds, got {time_limit_s}")


def solve(cluster, model, training, objective: str | ObjectiveSpec = "throughput", time_limit_s: float = 60.0,
          top_k: int = 1, launcher: str | None = None, deterministic: bool = False, work_budget: int | None = None,
          **options) -> SearchResult:
    """The best plan(s) of the space (keyword options: budget_usd_per_hour, min_tokens_per_s,
    profiles, gap_rel, progress).  Ctrl-C (KeyboardInterrupt) keeps the best plan found so
    far: it comes back with status feasible, ``solver.interrupted`` and the bound proved up to
    then (none while the cost objectives' warm start ran: only the heap bounds them); with no
    plan found yet the interrupt goes on.

    ``deterministic`` (or a ``work_budget``): the search's deadlines count work, not seconds
    (clock.py): ``work_budget`` units, by default ``clock.default_budget(time_limit_s)``,
    stand for the time limit, so identical inputs give identical plans on any machine; the
    wall-clock limit still stops it (``solver.wall_clock_bound``)."""
    if not (deterministic or work_budget is not None):
        return _guarded(cluster, model, training, objective, time_limit_s, top_k, launcher, **options)
    check_time_limit(time_limit_s)
    if work_budget is not None and (isinstance(work_budget, bool) or not isinstance(work_budget, int)
                                    or work_budget < 1):
        raise InputError(f"the work budget must be a whole number of units, at least 1, got {work_budget}")
    with clock.work_clock(time_limit_s, work_budget) as wc:
        result = _guarded(cluster, model, training, objective, time_limit_s, top_k, launcher, **options)
    budget = work_budget if work_budget is not None else clock.default_budget(time_limit_s)
    result.report = SolverReport(**result.report.model_dump(), deterministic=True, work_budget=budget,
                                 work_units=wc.units, wall_clock_bound=wc.wall_clock_bound)
    return result


def _guarded(cluster, model, training, objective, time_limit_s, top_k, launcher, **options) -> SearchResult:
    """The search, keeping the best plan found on Ctrl-C (solve); ``watch`` (a
    watch.SearchWatch) lets a display read the best plan, bound and gap while it runs."""
    watch = options.pop("watch", None)
    state: dict = watch.state if watch is not None else {}
    for key in ("subspace", "asked_training", "node_view"):     # a watch's state from an earlier search
        state.pop(key, None)
    try:
        classes = class_infos(topology_for(cluster), training.precision)
        if training.mixed_stages and class_pairs(classes):     # else the flag adds nothing: one search
            return _pure_first(cluster, model, training, objective, time_limit_s, top_k, launcher, state, options)
        if per_node_view(classes, training):
            return _per_node_too(cluster, model, training, objective, time_limit_s, top_k, launcher, state, options)
        return _search(cluster, model, training, objective, time_limit_s, top_k, launcher, state=state, **options)
    except KeyboardInterrupt:
        _stop_background(state)
        if "best" not in state or not state["best"].items:
            raise
        stats, bounds = state["stats"], state["bounds"]
        stats.interrupted = True
        stats.unexplored = max(1, stats.unexplored)
        # Every tuple not yet done is bounded by the heap's least bound when it was last read
        # (the heap's least only grows); before the heap there is no bound on the unranked.
        # In the pure phase of a mixed search (_pure_first) the bounds cover only its subspace.
        if stats.frontier is not None and not state.get("subspace"):
            bounds.append(stats.frontier)
        else:
            bounds.clear()
        # the training asked for: in a mixed search's first phase the state holds its copy
        # without mixed stages, which the plan would record (and a replan of it search)
        asked = state.get("asked_training", state["training"])
        result = finish(state["cluster"], state["model"], asked, state["spec"], state["classes"], state["best"],
                        bounds, stats, *(state[k] for k in ("t0", "profiles", "launcher")))
        if "node_view" in state and not state.get("subspace"):     # in the second view of _per_node_too
            return _node_view_result(result, state, cluster, top_k)
        return result
    finally:
        _stop_background(state)     # an error in the search: its warm start does not run on


def _pure_first(cluster, model, training, objective, time_limit_s, top_k, launcher, state: dict,
                options: dict) -> SearchResult:
    """A search with mixed stages, in two phases: the space without them for
    MIXED_PURE_SHARE of the time, then the whole space with the rest, its plans the first
    incumbents.  Mixed stages' stand-ins bound loosely and make the position LPs ~6x dearer
    (a sweep's 42-GPU H100 + T4 + V100 case: 0.21 s against 0.035 s a tuple, at 114 options
    against 33), so in one phase the search got through fewer tuples than without them and
    returned a plan 17% slower (7.80 s against 6.64 s at 20 s), in the space that holds the
    other one.  The bound and gap are the second phase's, over the whole space."""
    check_args(training, time_limit_s, top_k, launcher)     # before the first phase, which runs without them
    work = clock.active()       # a deterministic search's: the phases count its work, not seconds
    wall_t0, t0 = time.monotonic(), elapsed(work)
    pure = training.model_copy(update={"mixed_stages": False})
    # Until the second phase has its own state (_search pops it), a Ctrl-C or a watch reads
    # the first phase's bounds, which cover only its subspace (_guarded, watch.py)
    state.update(subspace=True, asked_training=training)
    try:
        first = _search(cluster, model, pure, objective, MIXED_PURE_SHARE * time_limit_s, top_k, launcher,
                        state=state, **options)
    except InfeasibleError:
        first = None    # no plan without mixed stages (the memory they pool may be what fits)
    seeds = list(state["best"].items) if first is not None else []
    used, rest_s = rest_of_limit(work, t0, time_limit_s)
    with own_wall_guard(work):
        result = _search(cluster, model, training, objective, rest_s, top_k, launcher, state=state, seeds=seeds,
                         wall_stop_at=wall_t0 + time_limit_s - _finish_s(time_limit_s, cluster), **options)
    top = state["best"].items[0]
    from_pure = any(c is top for c in seeds)
    report = result.report.model_dump()
    extra = {"wall_s": time.monotonic() - wall_t0, "pure_phase_s": used, "answer_from_pure_phase": from_pure}
    extra.update(answer_found(first, report, from_pure, extra["wall_s"]))
    result.report = SolverReport(**{**report, **extra})
    return result


def _per_node_too(cluster, model, training, objective, time_limit_s, top_k, launcher, state: dict,
                  options: dict) -> SearchResult:
    """A small cluster with a class of several nodes, searched in two views (classes.per_node_view):
    as classes (stages take whole nodes) for PER_NODE_FIRST_SHARE of the limit, or less
    where proved sooner, then per node (stages share a node, none spans two) with the rest,
    the first view's plans given whole as its first incumbents (given.py) and its bound kept:
    the answer is the better view's, the bound the lesser of the two."""
    check_args(training, time_limit_s, top_k, launcher)
    work = clock.active()
    wall_t0, t0 = time.monotonic(), elapsed(work)
    given = list(options.pop("incumbents", None) or ())       # a replan's old plan: both views get it
    state.update(subspace=True)     # a Ctrl-C in the first view: its bounds are not the union's
    try:
        first = _search(cluster, model, training, objective, PER_NODE_FIRST_SHARE * time_limit_s, top_k, launcher,
                        state=state, incumbents=given, **options)
    except InfeasibleError as exc:
        first, no_plan = None, exc
    used, rest_s = rest_of_limit(work, t0, time_limit_s)
    if first is not None and options.get("gap_rel", 0.0) >= ANY_PLAN_GAP:
        return first        # any plan will do (a hint's check, hint_checks.py): the first view's is one
    if first is not None:
        bound = first.report.bound
    else:       # no plan there: none to bound where its space was done, else no bound at all
        stats = state.get("stats")
        bound = math.inf if stats is not None and stats.unexplored == 0 and stats.milp_optimal else None
    state["node_view"] = {"given": given, "first": first, "used": used, "wall_t0": wall_t0}
    with own_wall_guard(work):
        try:
            # twice the plans asked where more than one is: the first view's plans may come again
            # from this one (distinct); for one, a repeat is the same answer, and a second plan
            # kept would hold the pruning threshold at the second best (a review: tuples bounded
            # 10% above the answer were solved, and 990 left "unexplored" at a 0% gap)
            result = _search(cluster, model, training, objective, rest_s, top_k if top_k == 1 else 2 * top_k, launcher,
                             state=state, incumbents=given + (first.plans if first is not None else []), per_node=True,
                             outer_bounds=[0.0 if bound is None else bound],
                             wall_stop_at=wall_t0 + time_limit_s - _finish_s(time_limit_s, cluster), **options)
        except InfeasibleError:
            if first is None:
                raise no_plan from None     # the view as classes explains it (whole nodes, as documented)
            raise
    return _node_view_result(result, state, cluster, top_k)


def _node_view_result(result: SearchResult, state: dict, cluster, top_k: int) -> SearchResult:
    """The second view's result as the two views' (``_per_node_too``, or a Ctrl-C in the
    second view, ``_guarded``): its report's given plans the caller's (a replan's old one),
    not the first view's; its counts both views'; its plans once each up to a swap of
    identical nodes, K of them."""
    view = state["node_view"]
    given, first = view["given"], view["first"]
    top = state["best"].items[0]
    from_first = first is not None and any(top.plan is p for p in first.plans)
    report = result.report.model_dump()
    extra = {"wall_s": time.monotonic() - view["wall_t0"], "per_node_view": True, "class_view_s": view["used"],
             "answer_from_class_view": from_first}
    kept_old = any(top.plan is p for p in given) or (
        from_first and bool(first.report.model_extra.get("answer_is_given")) and top.plan is first.plans[0])
    for key in ("given_incumbents", "answer_is_given"):
        report.pop(key, None)
    if given:
        extra.update(given_incumbents=len(given), answer_is_given=kept_old)
    if first is not None:       # the work of both views
        extra.update({k: report[k] + getattr(first.report, k) for k in COUNTS})
    extra.update(answer_found(first, report, from_first, extra["wall_s"]))
    result.report = SolverReport(**{**report, **extra})
    return distinct(result, topology_for(cluster), top_k)


def _finish_s(time_limit_s: float, cluster) -> float:
    """What the limit keeps for the answer after the search: naming devices, evaluating the
    plan and its rank map (0.2-0.3 s for 16,384 GPUs here), and HiGHS stops up to ~0.4 s past
    an interrupt; the search's own deadline (and its wall guard) leaves room for both."""
    return min(FINISH_SHARE * time_limit_s, FINISH_MARGIN_S + FINISH_S_PER_GPU * cluster.num_gpus)


MIXED_PURE_SHARE = 0.3      # of the time limit, for the space without mixed stages first (_pure_first)
PER_NODE_FIRST_SHARE = 0.5  # of the time limit, for the view as classes first (_per_node_too)


def _stop_background(state: dict) -> None:
    """Stop the warm start beside the heap, if it still runs, keeping what it found, and close
    the incumbents; its own error gives way to the one already on its way."""
    background = state.pop("background", None)
    if background is not None:
        background.stop(raise_error=False)
    if "best" in state:
        state["best"].close()


def _search(cluster, model, training, objective, time_limit_s, top_k, launcher, *, state: dict,
            budget_usd_per_hour: float | None = None, min_tokens_per_s: float | None = None, profiles=None,
            gap_rel: float = 0.0, progress: Callable[[str], None] | None = None, incumbents=(),
            seeds=(), wall_stop_at: float | None = None, per_node: bool = False,
            outer_bounds: tuple | list = ()) -> SearchResult:
    wall_t0 = time.monotonic()
    check_args(training, time_limit_s, top_k, launcher)
    spec = parse_objective(objective, budget_usd_per_hour, min_tokens_per_s)
    check_expert_degrees(model, training)
    finish_s = _finish_s(time_limit_s, cluster)
    if clock.active() is not None:      # the user's wall-clock guard leaves the same room
        # (``wall_stop_at``: a later phase's is the whole search's, _pure_first)
        clock.active().wall_stop = wall_t0 + time_limit_s - finish_s if wall_stop_at is None else wall_stop_at
    # work done under a work clock; read after the guard is set: a mixed search's second phase
    # (_pure_first) starts past the first phase's guard, where now() is inf (no deadline at all)
    t0 = clock.now()
    deadline = t0 + time_limit_s - finish_s
    topo = topology_for(cluster)
    classes = class_infos(topo, training.precision, per_node=per_node)
    no_bf16 = classes_without_bf16(topo) if training.precision == "bf16" else []
    if not classes:
        raise InfeasibleError(f"no GPU type of cluster {cluster.name!r} computes in bf16 "
                              f"({', '.join(sorted({c.gpu.name for c in no_bf16}))}); train with "
                              "--precision fp16 (training.precision: fp16), or fp32 / tf32")
    if spec.needs_prices and any(c.node_price_usd_per_hour is None for c in classes):
        raise cluster.missing_prices(f"objective {spec.kind!r}",
                                     {c.gpu.name for c in classes if c.node_price_usd_per_hour is None})
    pricer = Pricer(model, training, classes, topo, profiles)
    knob_bound = KnobBound(pricer)
    knob_bound.set_deadline(deadline)
    knobs_list = enumerate_knobs(model, training, classes, launcher)
    settings = MilpSettings(time_limit_s=time_limit_s, gap_rel=gap_rel)
    # in the per-node view a layout on one node and its copy on an identical one are one plan
    best = Best(top_k, [topo.node_class_of(c.node_class.node_names[0]).node_names for c in classes]
                if per_node else None)
    bounds: list[float] = list(outer_bounds)    # a first phase's (_per_node_too): the answer's bound is the least
    stats = SearchStats(knobs=len(knobs_list))
    # plans given whole (a replan's old plan) first: their value is the cutoff from the start
    for cand in given_candidates(cluster, model, training, spec, incumbents, profiles,
                                 lambda c: admits(spec, c, training)):
        best.add(cand)
        stats.given += 1
    for cand in seeds:      # the pure phase's plans (_pure_first): candidates of this space too
        best.add(cand)
    state.update(cluster=cluster, model=model, training=training, spec=spec, classes=classes, best=best,
                 bounds=bounds, stats=stats, t0=wall_t0, profiles=profiles, launcher=launcher)
    if training.mixed_stages or per_node:   # a second phase: its bounds are the whole space's now
        state.pop("subspace", None)
    inputs = TupleInputs(pricer, launcher, spec)
    say = progress or (lambda msg: None)
    # Rank every knob tuple by a bound that needs no per-stage pricing, then price and solve
    # them in that order: good incumbents come early and prune the rest (branch and bound).
    ranked = []
    dominated = gpipe_dominated(knobs_list, same_only=top_k > 1) | one_stage_zb_h1_twins(knobs_list)
    for i, knobs in enumerate(knobs_list):
        if clock.now() > deadline:
            stats.unexplored = len(knobs_list) - i
            bounds.append(0.0)      # the unranked have no bound but the trivial one
            break
        if knobs in dominated:     # pruned: its 1F1B twin bounds it (gpipe_dominated)
            stats.pruned += 1
            stats.twins += 1
            continue
        ctx = inputs.context(knobs)
        keys, first = inputs.keys(knobs)
        if first and spec.budget_usd_per_hour is not None:     # for the reason when nothing fits (diagnose.py)
            kept = {k.cls for k in keys}
            for k in pricer.option_keys(knobs):
                if k.cls not in kept:
                    info = pricer.classes[k.cls]
                    stats.over_budget[info.name] = info.least_rent(k.width, 1)
        if not keys:        # no replica count gives an allowed share (training.micro_batch_sizes)
            stats.no_options += 1
        clock.charge(len(keys) / clock.RANK_PER_UNIT)   # the bound's work, for a deterministic search
        ranked.append(Ranked(knob_bound(knobs, ctx, keys, memory=False), i, knobs, ctx, keys))
    ranked.sort(key=lambda t: (t.bound_s, t.index))
    say(f"{len(ranked)} knob tuples ranked by their lower bound"
        + (f" ({len(dominated)} GPipe tuples left out for their 1F1B twins)" if dominated else ""))
    time_like = spec.kind in ("throughput", "throughput-under-budget")
    tokens = training.global_batch_size * training.seq_len
    # throughput needs no prices: its value is the time bound itself (no floors to compute for
    # c's 12,000 tuples)
    floors = floors_until(pricer, ranked, deadline) if spec.needs_prices else {}
    no_floors = TupleFloors(0.0, 0.0)
    if ranked:      # for the reason when no plan meets a budget or a floor (diagnose.py)
        stats.least_price_usd_per_hour = min((f.price_usd_per_hour for f in floors.values()), default=None)
        if spec.budget_usd_per_hour is not None and not any(t.keys for t in ranked):
            # the budget rents no option at all: what the cheapest option rents
            one_per_b = {t.knobs.micro_batch_size: t.knobs for t in ranked}.values()
            stats.least_price_usd_per_hour = min(
                pricer.classes[k.cls].least_rent(k.width, k.replicas) for kn in one_per_b for k in pricer.option_keys(kn))
        stats.least_time_s = ranked[0].bound_s
        if time_like:       # the least time bound bounds every plan, for a Ctrl-C before the heap
            stats.frontier = ranked[0].bound_s
        stats.tokens_per_iteration = tokens
    # the layouts a person would write, first: every answer is at least as good (baselines.py)
    stats.baseline = seed(pricer, ranked, spec, launcher, best,
                          stop_at=min(deadline, clock.now() + BASELINE_SHARE * time_limit_s),
                          deadline=min(deadline, clock.now() + 2 * BASELINE_SHARE * time_limit_s))
    big = bool(ranked) and max(len(t.keys) for t in ranked) > WARM_KEYS_ABOVE
    warm = time_like and big
    warm_done: set = set()

    def first_warm_start(bound: KnobBound) -> None:
        if warm:
            warm_start(pricer, bound, ranked, spec, training, best, settings, deadline, launcher, say,
                       done=warm_done)
            return
        # the cost objectives: the throughput path's warm start, its plans re-keyed into
        # ``best`` (incumbent.Shared); without it the cost search began from nothing and at the
        # default limit returned plans dearer per token than the throughput answer (issue 18)
        shared = Shared(top_k, best, spec, lambda c: admits(spec, c, training))
        warm_start(pricer, bound, ranked, ObjectiveSpec(), training, shared, settings, deadline, launcher,
                   say, done=set())
        stats.shared_warm_start = len(shared.items)

    def later_warm_start(bound: KnobBound) -> None:
        """On to the tuples the first pass did not reach, with all the time left."""
        warm_start(pricer, bound, ranked, spec, training, best, settings, deadline, launcher, say,
                   share=1.0, done=warm_done, milp_share=1.0)

    if big and concurrent_allowed():     # beside the heap, with a bound of its own (background.py)
        own = KnobBound(pricer)
        own.set_deadline(deadline)

        def beside() -> None:
            first_warm_start(own)
            # its MILPs take no time from the heap's here: on to the next tuples until the
            # deadline, as the pass after the heap does in line (c: 1.986 s -> 1.979 s)
            if warm:
                later_warm_start(own)
        state["background"] = BackgroundWarmStart(beside).start()
    elif big:
        first_warm_start(knob_bound)
    # A heap on the bounds: a tuple first comes up with its memory-free bound, is then given
    # its memory-aware bound and goes back in, then the same with the packed bottleneck's
    # knapsacks and with its LPs (each level dearer than the last; a tuple too big for the
    # exact MILP also with the max terms apart); it is priced and solved when it comes up
    # once more.  The least bound in the heap bounds the rest.  Bounds are
    # on the objective's value (floors.py: the time bound, or for the cost objectives the
    # price and work floors it gives); ``tb`` is the tuple's time bound behind it.
    heap = []
    for tb, i, knobs, ctx, keys in ranked:
        value = floors.get(knobs, no_floors).value(spec, tb, tokens, capacity=False)
        if math.isinf(value):           # no plan: none fits, or over the budget / under the floor
            stats.out_of_reach_tuple(tb)
            continue
        heap.append(Pending(value, i, BoundLevel.MEMORY_FREE, knobs, ctx, keys, tb))
    heapq.heapify(heap)
    tuple_state = SearchState(pricer, knob_bound, spec, launcher, best, settings, deadline, bounds=bounds, stats=stats,
                              gap_rel=gap_rel, time_like=time_like)
    j = 0
    while heap:
        kb, i, level, knobs, ctx, keys, tb = heap[0]
        stats.frontier = kb          # for a Ctrl-C: no tuple left is below it (solve)
        if clock.now() > deadline:
            stats.unexplored += len(heap)
            bounds.append(kb)
            break
        if prunes(spec, kb, best.threshold(), gap_rel):
            stats.pruned += len(heap)
            bounds.append(kb)
            break
        heapq.heappop(heap)
        if loses_tie(spec, kb, tb, best, gap_rel):     # this tuple only: the next may be faster
            stats.pruned += 1
            bounds.append(kb)
            continue
        floor = floors.get(knobs, no_floors)
        small = enum.fits_size(knobs.num_stages, len(keys), model.num_layers // knobs.block_unit)
        too_big_to_build = not small and len(keys) ** 2 * max(1, knobs.num_stages - 1) > MAX_PAIR_TERMS
        step = _next_level(level, knob_bound.orders_apply(knobs, keys),
                           too_big_to_build and apart.applies(knobs, keys))
        if step is not None:
            # memory-aware, then with the packed bottleneck's knapsacks, then with its LPs
            # (packed.py), then per order of the classes (position_lp.orders), then for a
            # tuple too big for the exact MILP with the max terms apart (apart.py), which only
            # help to prune: asked to show the time from which the tuple's value reaches the
            # pruning threshold
            next_level, packed, ordered = step
            cut = best.threshold() * (1 - gap_rel)
            if spec.needs_prices:
                # the floors alone (the capacity floor joins here) may settle the tuple: no plan
                # under the budget or floor, or a bound that prunes it without a knob bound
                early = max(kb, floor.value(spec, tb, tokens))
                if math.isinf(early):
                    stats.out_of_reach_tuple(tb)
                    continue
                if prunes(spec, early, best.threshold(), gap_rel):
                    heapq.heappush(heap, Pending(early, i, next_level, knobs, ctx, keys, tb))
                    continue
            enough = floor.time_enough(spec, cut, tokens)
            on = (lambda classes, floor=floor, cut=cut: _enough_on(spec, floor.on_classes(classes), cut, tokens)) \
                if spec.needs_prices else None
            tb2 = max(tb, knob_bound(knobs, ctx, keys, enough=enough, packed=packed, enough_on=on, ordered=ordered))
            value = max(kb, floor.value(spec, tb2, tokens))
            by_classes = knob_bound.by_classes(knobs, keys) if spec.needs_prices else {}
            if by_classes:
                value = max(value, floor.by_classes(spec, by_classes, tokens))
            if math.isinf(value):
                stats.out_of_reach_tuple(tb2)
                continue
            heapq.heappush(heap, Pending(value, i, next_level, knobs, ctx, keys, tb2))
            continue
        j += 1
        if too_big_to_build and warm:
            too_big(tuple_state, knobs, ctx, keys, kb)      # see below: too big to build
            continue
        # pricing cannot be interrupted (mixed stages' take up to ~2 s on lab-mixed): start it
        # only when the longest so far still fits in the time left
        if clock.now() + stats.price_s > deadline:
            stats.unexplored += len(heap) + 1
            bounds.append(kb)
            break
        started = clock.now()
        prob, qb = priced(pricer, knobs, ctx, keys, spec, launcher)
        stats.price_s = max(stats.price_s, clock.now() - started)
        if qb is None:
            stats.empty += 1
            continue
        lb = max(kb, floor.value(spec, max(qb, tb), tokens))
        if prunes(spec, lb, best.threshold(), gap_rel) or loses_tie(spec, lb, max(qb, tb), best, gap_rel):
            stats.pruned += 1
            bounds.append(lb)
            continue
        K = len(prob.options)
        pairs = K * K * max(1, knobs.num_stages - 1)
        if not enum.fits(prob) and (pairs > MAX_PAIR_TERMS or pairs / PAIR_TERMS_PER_S > deadline - clock.now()):
            # the pairwise send constraints alone would make the MILP too big to build in the
            # time we have: leave this tuple unexplored (its bound still counts)
            too_big(tuple_state, knobs, ctx, keys, lb)
            continue
        say(f"[{j}/{len(ranked)}] {knobs.label()}: {K} options, bound {lb:.4g} {SHORT_UNITS[spec.kind]}")
        milp = exact_solver(prob)
        solve_tuple(milp, prob, knobs, spec, training, best, bounds, stats, settings, deadline, top_k, lb,
                    time_lb=max(qb, tb))
    ended = state.pop("background").stop() if "background" in state else True
    if warm and ended and stats.unexplored and clock.now() < deadline:
        # time left over with tuples too big for the exact MILP (not when every tuple was solved
        # or pruned: nothing better than the answer, by more than gap_rel, is left to find):
        # more incumbents on option subsets
        later_warm_start(knob_bound)
    best.close()
    return finish(cluster, model, training, spec, classes, best, bounds, stats, wall_t0, profiles, launcher)


FINISH_MARGIN_S = 0.4       # HiGHS's reaction to the interrupt callback (0.2-0.4 s measured on scenario c)
FINISH_S_PER_GPU = 2e-5     # naming, evaluating and rank-mapping the answer, per GPU of the cluster
FINISH_SHARE = 0.1          # at most this share of the time limit is kept for them
MAX_PAIR_TERMS = 100_000    # option pairs x boundaries a MILP may carry (pulp builds ~1e5/s)
PAIR_TERMS_PER_S = 50_000   # a pessimistic build rate, to keep within the time limit


def _next_level(level: int, ordered: bool, apart_: bool) -> tuple[BoundLevel, int, bool] | None:
    """The level a heap entry at ``level`` climbs to next, with the knob bound's ``packed``
    and ``ordered`` arguments for it; None when it is priced and solved.  ``ordered``: the
    class orders can lift its bound (KnobBound.orders_apply); ``apart_``: it is too big for
    the exact MILP and the max terms apart can (apart.applies)."""
    if level < BoundLevel.LP:
        return BoundLevel(level + 1), level, False
    if level == BoundLevel.LP and ordered:
        return BoundLevel.ORDERED, 2, True
    if level in (BoundLevel.LP, BoundLevel.ORDERED) and apart_:
        return BoundLevel.APART, 3, ordered
    return None


def _enough_on(spec: ObjectiveSpec, floors: TupleFloors, cut: float, tokens: float) -> float:
    """The time bound from which the plans on one set of classes (their ``floors``) reach
    ``cut``; -inf when their price alone does (nothing to show)."""
    if floors.value(spec, 0.0, tokens) >= cut:
        return -math.inf
    return floors.time_enough(spec, cut, tokens)

