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
from dataclasses import dataclass, field

from planner.cost import evaluate, topology_for
from planner.cost.flops import model_flops_per_iteration
from planner.errors import InfeasibleError, InputError
from planner.plan import Plan
from planner.plan.model import SolverReport
from planner.search import clock
from planner.search.baselines import BASELINE_SHARE, admits, seed
from planner.search.bound import KnobBound
from planner.search.classes import class_infos, classes_without_bf16
from planner.search.core import enum
from planner.search.core.milp import MilpSettings
from planner.search.core.problem import relative_gap
from planner.search.diagnose import explain_infeasible
from planner.search.floors import TupleFloors, tuple_floors
from planner.search.incumbent import (
    WARM_KEYS_ABOVE,
    Best,
    Shared,
    exact_solver,
    priced,
    relaxed,
    warm_start,
)
from planner.search.naming import build_plan
from planner.search.objectives import ObjectiveSpec, parse_objective
from planner.search.per_tuple import loses_tie, prunes, solve_tuple
from planner.search.queue import BoundLevel, Pending, Ranked
from planner.search.schedules import schedules_for
from planner.search.space import Pricer, enumerate_knobs, make_context

SPACE = ("stages 1..L; contiguous uneven block ranges; per stage one node class, a TP degree "
         "(power of two within a node, dividing the heads), n replicas (the fewest giving their "
         "largest share), shares differing by at most one; micro-batch size x count = global "
         "batch; training.schedules of gpipe/1f1b/interleaved-1f1b(v=2)/zb-h1 "
         "(zb-h1 priced by a lower bound, its plans exactly; not with a launcher); recompute none/selective/full; ZeRO 0/1; "
         "idle GPUs allowed (docs/search-space.md)")
MEGATRON_LAUNCHERS = ("megatron", "deepspeed")


@dataclass
class SearchResult:
    plans: list[Plan]
    evaluations: list
    report: SolverReport
    idle: list[str] = field(default_factory=list)
    # Assumptions the prices rest on, one line each: GPU types priced at a stand-in matmul peak
    # in the training precision (tf32 without TF32 tensor cores, no fp32 figures; GpuType.precision_note).
    warnings: list[str] = field(default_factory=list)

    @property
    def plan(self) -> Plan:
        return self.plans[0]

    @property
    def evaluation(self):
        return self.evaluations[0]

    @property
    def solver(self) -> SolverReport:
        return self.report


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
    try:
        return _search(cluster, model, training, objective, time_limit_s, top_k, launcher, state=state, **options)
    except KeyboardInterrupt:
        if "best" not in state or not state["best"].items:
            raise
        stats, bounds = state["stats"], state["bounds"]
        stats["interrupted"] = True
        stats["unexplored"] = max(1, stats["unexplored"])
        # Every tuple not yet done is bounded by the heap's least bound when it was last read
        # (the heap's least only grows); before the heap there is no bound on the unranked.
        if "frontier" in stats:
            bounds.append(stats["frontier"])
        else:
            bounds.clear()
        return _finish(*(state[k] for k in ("cluster", "model", "training", "spec", "classes")), state["best"],
                       bounds, stats, *(state[k] for k in ("t0", "profiles", "launcher")))


def _search(cluster, model, training, objective, time_limit_s, top_k, launcher, *, state: dict,
            budget_usd_per_hour: float | None = None, min_tokens_per_s: float | None = None, profiles=None,
            gap_rel: float = 0.0, progress: Callable[[str], None] | None = None) -> SearchResult:
    t0, wall_t0 = clock.now(), time.monotonic()     # t0: work done under a work clock
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
    spec = parse_objective(objective, budget_usd_per_hour, min_tokens_per_s)
    # The limit covers the whole answer: after the search come naming devices, evaluating the
    # plan and its rank map (0.2-0.3 s for 16,384 GPUs here), and HiGHS stops up to ~0.4 s past
    # an interrupt; the search's own deadline leaves room for both.
    finish_s = min(FINISH_SHARE * time_limit_s, FINISH_MARGIN_S + FINISH_S_PER_GPU * cluster.num_gpus)
    deadline = t0 + time_limit_s - finish_s
    if clock.active() is not None:      # the user's wall-clock guard leaves the same room
        clock.active().wall_stop = wall_t0 + time_limit_s - finish_s
    topo = topology_for(cluster)
    classes = class_infos(topo, training.precision)
    no_bf16 = classes_without_bf16(topo) if training.precision == "bf16" else []
    if not classes:
        raise InfeasibleError(f"no GPU type of cluster {cluster.name!r} computes in bf16 "
                              f"({', '.join(sorted({c.gpu.name for c in no_bf16}))}); train with "
                              "--precision fp16 (training.precision: fp16), or fp32 / tf32")
    if spec.needs_prices and any(c.node_price_usd_per_hour is None for c in classes):
        missing = sorted({c.gpu.name for c in classes if c.node_price_usd_per_hour is None})
        raise InputError(f"objective {spec.kind!r} needs prices, but nodes of {', '.join(missing)} have "
                         "none; add price_per_hour to those node groups")
    pricer = Pricer(model, training, classes, topo, profiles)
    knob_bound = KnobBound(pricer)
    knob_bound.set_deadline(deadline)
    knobs_list = enumerate_knobs(model, training, classes, launcher)
    settings = MilpSettings(time_limit_s=time_limit_s, gap_rel=gap_rel)
    best = Best(top_k)
    bounds: list[float] = []
    stats = {"knobs": len(knobs_list), "solved": 0, "pruned": 0, "empty": 0, "unexplored": 0,
             "milp_optimal": True}
    state.update(cluster=cluster, model=model, training=training, spec=spec, classes=classes, best=best,
                 bounds=bounds, stats=stats, t0=wall_t0, profiles=profiles, launcher=launcher)
    contexts: dict = {}
    say = progress or (lambda msg: None)
    # Rank every knob tuple by a bound that needs no per-stage pricing, then price and solve
    # them in that order: good incumbents come early and prune the rest (branch and bound).
    ranked = []
    dominated = gpipe_dominated(knobs_list, same_only=top_k > 1) | one_stage_zb_h1_twins(knobs_list)
    usable: dict[int, list] = {}
    for i, knobs in enumerate(knobs_list):
        if clock.now() > deadline:
            stats["unexplored"] = len(knobs_list) - i
            break
        if knobs in dominated:     # pruned: its 1F1B twin bounds it (gpipe_dominated)
            stats["pruned"] += 1
            stats["twins"] = stats.get("twins", 0) + 1
            continue
        # no cost function reads the schedule from ctx; ZeRO-2/3's per-micro-batch reduce-scatters
        # and ZeRO-3's gathers read m, ZeRO-3's gathers the resharding
        ck = (knobs.recompute, knobs.zero_stage, knobs.reshard_after_forward,
              knobs.num_micro_batches if knobs.zero_stage >= 2 else 0)
        ctx = contexts.get(ck) or contexts.setdefault(ck, make_context(model, training, knobs, profiles))
        keys = usable.get(knobs.micro_batch_size)
        if keys is None:    # one list per B: the bounds cache by it
            keys = usable[knobs.micro_batch_size] = usable_keys(pricer, knobs, launcher, spec)
            if spec.budget_usd_per_hour is not None:    # for the reason when nothing fits (diagnose.py)
                kept = {k.cls for k in keys}
                for k in pricer.option_keys(knobs):
                    if k.cls not in kept:
                        info = pricer.classes[k.cls]
                        stats.setdefault("over_budget", {})[info.name] = info.least_rent(k.tp, 1)
        if not keys:        # no replica count gives an allowed share (training.micro_batch_sizes)
            stats["no_options"] = stats.get("no_options", 0) + 1
        clock.charge(len(keys))         # the bound's work, for a deterministic search
        ranked.append(Ranked(knob_bound(knobs, ctx, keys, memory=False), i, knobs, ctx, keys))
    ranked.sort(key=lambda t: (t.bound_s, t.index))
    say(f"{len(ranked)} knob tuples ranked by their lower bound"
        + (f" ({len(dominated)} GPipe tuples left out for their 1F1B twins)" if dominated else ""))
    time_like = spec.kind in ("throughput", "throughput-under-budget")
    tokens = training.global_batch_size * training.seq_len
    # throughput needs no prices: its value is the time bound itself (no floors to compute for
    # c's 12,000 tuples)
    floors = ({knobs: tuple_floors(pricer, knobs, ctx, keys) for _, _, knobs, ctx, keys in ranked}
              if spec.needs_prices else {})
    no_floors = TupleFloors(0.0, 0.0)
    if ranked:      # for the reason when no plan meets a budget or a floor (diagnose.py)
        stats["least_price_usd_per_hour"] = min((f.price_usd_per_hour for f in floors.values()), default=None)
        if spec.budget_usd_per_hour is not None and not any(t.keys for t in ranked):
            # the budget rents no option at all: what the cheapest option rents
            one_per_b = {t.knobs.micro_batch_size: t.knobs for t in ranked}.values()
            stats["least_price_usd_per_hour"] = min(
                pricer.classes[k.cls].least_rent(k.tp, k.replicas) for kn in one_per_b for k in pricer.option_keys(kn))
        stats["least_time_s"] = ranked[0].bound_s
        if time_like:       # the least time bound bounds every plan, for a Ctrl-C before the heap
            stats["frontier"] = ranked[0].bound_s
        stats["tokens_per_iteration"] = tokens
    # the layouts a person would write, first: every answer is at least as good (baselines.py)
    stats["baseline"] = seed(pricer, ranked, spec, launcher, best,
                             stop_at=min(deadline, clock.now() + BASELINE_SHARE * time_limit_s),
                             deadline=min(deadline, clock.now() + 2 * BASELINE_SHARE * time_limit_s))
    big = bool(ranked) and max(len(t.keys) for t in ranked) > WARM_KEYS_ABOVE
    warm = time_like and big
    warm_done: set = set()
    if warm:
        warm_start(pricer, knob_bound, ranked, spec, training, best, settings, deadline, launcher, say,
                   done=warm_done)
    elif big:
        # the cost objectives: the throughput path's warm start, its plans re-keyed into
        # ``best`` (incumbent.Shared); without it the cost search began from nothing and at the
        # default limit returned plans dearer per token than the throughput answer (issue 18)
        shared = Shared(top_k, best, spec, lambda c: admits(spec, c, training))
        warm_start(pricer, knob_bound, ranked, ObjectiveSpec(), training, shared, settings, deadline, launcher,
                   say, done=set())
        stats["shared_warm_start"] = len(shared.items)
    # A heap on the bounds: a tuple first comes up with its memory-free bound, is then given
    # its memory-aware bound and goes back in, then the same with the packed bottleneck's
    # knapsacks and with its LPs (each level dearer than the last); it is priced and solved
    # when it comes up once more.  The least bound in the heap bounds the rest.  Bounds are
    # on the objective's value (floors.py: the time bound, or for the cost objectives the
    # price and work floors it gives); ``tb`` is the tuple's time bound behind it.
    heap = []
    for tb, i, knobs, ctx, keys in ranked:
        value = floors.get(knobs, no_floors).value(spec, tb, tokens)
        if math.isinf(value):           # no plan: none fits, or over the budget / under the floor
            stats["empty"] += 1
            stats["out_of_reach"] = stats.get("out_of_reach", 0) + math.isfinite(tb)
            continue
        heap.append(Pending(value, i, BoundLevel.MEMORY_FREE, knobs, ctx, keys, tb))
    heapq.heapify(heap)
    j = 0
    while heap:
        kb, i, level, knobs, ctx, keys, tb = heap[0]
        stats["frontier"] = kb          # for a Ctrl-C: no tuple left is below it (solve)
        if clock.now() > deadline:
            stats["unexplored"] += len(heap)
            bounds.append(kb)
            break
        if prunes(spec, kb, best.threshold(), gap_rel):
            stats["pruned"] += len(heap)
            bounds.append(kb)
            break
        heapq.heappop(heap)
        if loses_tie(spec, kb, tb, best, gap_rel):     # this tuple only: the next may be faster
            stats["pruned"] += 1
            bounds.append(kb)
            continue
        floor = floors.get(knobs, no_floors)
        if level < BoundLevel.LP:
            # memory-aware, then with the packed bottleneck's knapsacks, then with its LPs
            # (packed.py), which only help to prune: asked to show the time from which the
            # tuple's value reaches the pruning threshold
            cut = best.threshold() * (1 - gap_rel)
            enough = floor.time_enough(spec, cut, tokens)
            on = (lambda classes, floor=floor, cut=cut: _enough_on(spec, floor.on_classes(classes), cut, tokens)) \
                if spec.needs_prices else None
            tb2 = max(tb, knob_bound(knobs, ctx, keys, enough=enough, packed=level, enough_on=on))
            value = max(kb, floor.value(spec, tb2, tokens))
            by_classes = knob_bound.by_classes(knobs, keys) if spec.needs_prices else {}
            if by_classes:
                value = max(value, floor.by_classes(spec, by_classes, tokens))
            if math.isinf(value):
                stats["empty"] += 1
                stats["out_of_reach"] = stats.get("out_of_reach", 0) + math.isfinite(tb2)
                continue
            heapq.heappush(heap, Pending(value, i, level + 1, knobs, ctx, keys, tb2))
            continue
        j += 1
        small = enum.fits_size(knobs.num_stages, len(keys), model.num_layers // knobs.block_unit)
        if not small and len(keys) ** 2 * max(1, knobs.num_stages - 1) > MAX_PAIR_TERMS and warm:
            stats["too_big"] = stats.get("too_big", 0) + 1     # see below: too big to build
            relaxed(pricer, knobs, ctx, keys, kb, spec, launcher, best, bounds, stats, settings, deadline,
                    gap_rel, time_like)
            continue
        # pricing cannot be interrupted (mixed stages' take up to ~2 s on lab-mixed): start it
        # only when the longest so far still fits in the time left
        if clock.now() + stats.get("price_s", 0.0) > deadline:
            stats["unexplored"] += len(heap) + 1
            bounds.append(kb)
            break
        started = clock.now()
        prob, qb = priced(pricer, knobs, ctx, keys, spec, launcher)
        stats["price_s"] = max(stats.get("price_s", 0.0), clock.now() - started)
        if qb is None:
            stats["empty"] += 1
            continue
        lb = max(kb, floor.value(spec, max(qb, tb), tokens))
        if prunes(spec, lb, best.threshold(), gap_rel) or loses_tie(spec, lb, max(qb, tb), best, gap_rel):
            stats["pruned"] += 1
            bounds.append(lb)
            continue
        K = len(prob.options)
        pairs = K * K * max(1, knobs.num_stages - 1)
        if not enum.fits(prob) and (pairs > MAX_PAIR_TERMS or pairs / PAIR_TERMS_PER_S > deadline - clock.now()):
            # the pairwise send constraints alone would make the MILP too big to build in the
            # time we have: leave this tuple unexplored (its bound still counts)
            stats["too_big"] = stats.get("too_big", 0) + 1
            relaxed(pricer, knobs, ctx, keys, lb, spec, launcher, best, bounds, stats, settings, deadline,
                    gap_rel, time_like)
            continue
        say(f"[{j}/{len(ranked)}] {knobs.label()}: {K} options, bound {lb:.4g}{' s' if time_like else ''}")
        milp = exact_solver(prob)
        solve_tuple(milp, prob, knobs, spec, training, best, bounds, stats, settings, deadline, top_k, lb,
                    time_lb=max(qb, tb))
    if warm and stats["unexplored"] and clock.now() < deadline:
        # time left over with tuples too big for the exact MILP (not when every tuple was solved
        # or pruned: nothing better than the answer, by more than gap_rel, is left to find):
        # more incumbents on option subsets
        warm_start(pricer, knob_bound, ranked, spec, training, best, settings, deadline, launcher, say,
                   share=1.0, done=warm_done, milp_share=1.0)
    return _finish(cluster, model, training, spec, classes, best, bounds, stats, wall_t0, profiles, launcher)


FINISH_MARGIN_S = 0.4       # HiGHS's reaction to the interrupt callback (0.2-0.4 s measured on scenario c)
FINISH_S_PER_GPU = 2e-5     # naming, evaluating and rank-mapping the answer, per GPU of the cluster
FINISH_SHARE = 0.1          # at most this share of the time limit is kept for them
MAX_PAIR_TERMS = 100_000    # option pairs x boundaries a MILP may carry (pulp builds ~1e5/s)
PAIR_TERMS_PER_S = 50_000   # a pessimistic build rate, to keep within the time limit


def _finish(cluster, model, training, spec, classes, best, bounds, stats, t0, profiles, launcher):
    if not best.items:
        raise InfeasibleError(explain_infeasible(cluster, model, training, spec, classes, stats))
    plans, evals = [], []
    objective = spec.to_plan_objective()
    for cand in best.items:
        plan = build_plan(cluster, model, training, classes, cand.knobs, cand.layout, objective)
        ev = evaluate(cluster, plan, profiles=profiles, model=model)
        plans.append(plan)
        evals.append(ev)
    top = best.items[0]
    time_like = spec.kind in ("throughput", "throughput-under-budget")
    value = evals[0].iteration_time_s if time_like else top.key[0]
    bound = min(bounds) if bounds else None
    agg = aggregate_compute_bound_s(model, training, classes)
    if bound is not None:
        bound = min(bound, value)
    complete = stats["unexplored"] == 0 and stats["milp_optimal"]
    gap = relative_gap(value, bound) if bound is not None else (0.0 if complete else None)
    status = "optimal" if complete and (gap or 0.0) <= 1e-6 else "feasible"
    wall = time.monotonic() - t0
    report_fields = {
        "method": "milp", "status": status, "objective": value, "bound": bound if bound is not None else (value if complete else None),
        "gap": gap, "wall_s": wall, "space": _space(training, launcher),
        "candidates": stats["solved"] + stats["pruned"], "knob_tuples": stats["knobs"],
        "knob_tuples_solved": stats["solved"], "knob_tuples_pruned": stats["pruned"],
        "knob_tuples_infeasible": stats["empty"], "knob_tuples_unexplored": stats["unexplored"],
        "knob_tuples_too_big": stats.get("too_big", 0),
        "knob_tuples_gpipe_twins": stats.get("twins", 0),
        "aggregate_compute_bound_s": agg, "objective_kind": spec.kind, "node_classes": len(classes),
        "objective_unit": OBJECTIVE_UNITS[spec.kind]}
    if stats.get("interrupted"):
        report_fields["interrupted"] = True
    if "shared_warm_start" in stats:     # the throughput warm start's plans, under a cost objective
        report_fields["shared_warm_start_plans"] = stats["shared_warm_start"]
    report_fields.update(_baseline_fields(stats.get("baseline"), value, top, time_like))
    # The search priced each plan with the cost model's pieces; evaluate prices the whole plan.
    # They must agree (tests hold them to 1e-9); report the worst disagreement, not hide it.
    if time_like:
        report_fields["priced_vs_evaluated_rel"] = max(
            abs(ev.iteration_time_s - c.time_s) / ev.iteration_time_s for ev, c in zip(evals, best.items))
    final = []
    for plan, ev, cand in zip(plans, evals, best.items):
        rep = SolverReport(**{**report_fields, "objective": ev.iteration_time_s if time_like else cand.key[0]})
        update = {"predicted": ev.predicted(), "solver": rep}
        try:
            from planner.plan.rankmap import build_launch
            update["launch"] = build_launch(cluster, plan)
        except ImportError:  # pragma: no cover - rankmap ships with the package
            pass
        final.append(plan.model_copy(update=update))
    report = SolverReport(**report_fields)
    idle = idle_gpus(classes, final[0], cluster, spec, proved=status == "optimal",
                     unsearched=_unsearched(classes, training, launcher))
    for c in classes_without_bf16(topology_for(cluster)) if training.precision == "bf16" else []:
        idle.append(f"{c.num_gpus} GPUs of {c.name} idle: {c.gpu.name} has no bf16; train with "
                    "--precision fp16 (or fp32 / tf32) to use them")
    return SearchResult(plans=final, evaluations=evals, report=report, idle=idle,
                        warnings=cluster.precision_notes(training.precision))


def _baseline_fields(base, value: float, top, time_like: bool) -> dict:
    """The best baseline (baselines.py) and its objective value over the answer's: >= 1, the
    answer is at least as good (the baselines seeded the incumbents)."""
    if base is None or base.best is None:
        return {"baselines_priced": base.priced if base else 0}
    def value_of(c):
        return c.time_s if time_like else c.key[0]
    ours = value if time_like else top.key[0]
    theirs = value_of(base.best)
    return {"baseline": base.name, "baseline_objective": theirs,
            "baseline_ratio": theirs / ours if ours > 0 else None,
            # each rule's best over the answer; under the time objectives a lower bound on it
            # where the baselines' pricing skipped tuples (baselines.seed)
            "baseline_ratio_by_rule": ({r: (base.rule_floor_s(r) if time_like else value_of(c)) / ours
                                        for r, c in sorted(base.by_rule.items())} if ours > 0 else None),
            "baselines_priced": base.priced, "baselines_wall_s": base.wall_s, "baselines_complete": base.complete}


def _space(training, launcher: str | None) -> str:
    """The searched space, as the plan's solver report states it."""
    space = SPACE
    sharded = [z for z in training.zero_stages if z >= 2]
    if sharded:     # only when listed: the default space's report keeps its words
        space += "; also ZeRO " + "/".join(map(str, sorted(set(sharded))))
        if 3 in sharded:
            space += " (reshard_after_forward " + "/".join(
                sorted({str(r).lower() for r in training.reshard_after_forward})) + ")"
    if launcher:
        return space + f"; launcher {launcher}: same tp and replicas per stage, equal shares"
    if training.mixed_stages:
        return space + ("; also mixed stages: two node classes of one zone, a TP degree and 1, 2, 4, ... "
                        "whole nodes (GPU slices of a one-node class) each, shares split by peak FLOP/s")
    return space


def _enough_on(spec: ObjectiveSpec, floors: TupleFloors, cut: float, tokens: float) -> float:
    """The time bound from which the plans on one set of classes (their ``floors``) reach
    ``cut``; -inf when their price alone does (nothing to show)."""
    if floors.value(spec, 0.0, tokens) >= cut:
        return -math.inf
    return floors.time_enough(spec, cut, tokens)


def usable_keys(pricer: Pricer, knobs, launcher: str | None, spec: ObjectiveSpec) -> list:
    """The tuple's options less those no plan of the search can use: with a launcher, replica
    counts that do not split B evenly (its layouts have equal shares); under a budget, options
    whose own rent is over it (a one-node class is rented whole by any plan on it).  Without
    the latter, a class the budget cannot rent kept the bounds low and the gap open.  Mixed
    stages (``training.mixed_stages``) come as their stand-ins (mixed.StandIn), never with a
    launcher (its layouts are uniform)."""
    keys = pricer.option_keys(knobs)
    if launcher:
        keys = [k for k in keys if knobs.micro_batch_size % k.replicas == 0]
    else:
        keys = [*keys, *pricer.stand_ins(knobs)]
    if spec.budget_usd_per_hour is not None:
        cap = spec.budget_usd_per_hour * (1 + 1e-12)
        keys = [k for k in keys if k.full_least_rent(pricer.classes) <= cap]
    return keys


def gpipe_dominated(knobs_list: list, same_only: bool = False) -> set:
    """The GPipe tuples whose 1F1B twin (same micro-batches, recompute, ZeRO and stages) is in
    the space.  Every GPipe plan is a 1F1B plan of its twin at least as good: the same
    stages keep the same per-micro-batch times, syncs and steps; 1F1B's pipeline time
    ``sum_s c_s + (m-1) max_s c_s`` (c_s = f + b + both sends) is at most GPipe's
    ``sum_s (f + sf) + (m-1) max_s (f + sf) + sum_s (b + sb) + (m-1) max_s (b + sb)`` (a max of
    sums is at most the sum of the maxima; planner.cost.schedule), and 1F1B holds at most
    min(p - s, m) micro-batches in flight where GPipe holds m.  Prices are the same.  So the
    twin's best is at least as good for every objective the search prices (CPU core sharing,
    which only the final evaluate prices, is outside it), its bound bounds the GPipe tuple
    too, and with one plan asked for, the GPipe tuple is pruned.  With --top K
    (``same_only``) a GPipe plan may be among the K best and only the tuples whose plans
    repeat their twin's times go: one stage or one micro-batch (the same sums and maxima;
    1F1B holds one micro-batch in flight where GPipe holds m), which would list the same
    layout twice."""
    ones = {(k.micro_batch_size, k.recompute, k.zero_stage, k.reshard_after_forward, k.num_stages) for k in knobs_list if k.schedule == "1f1b"}
    return {k for k in knobs_list if k.schedule == "gpipe"
            and (k.micro_batch_size, k.recompute, k.zero_stage, k.reshard_after_forward, k.num_stages) in ones
            and (not same_only or k.num_stages == 1 or k.num_micro_batches == 1)}


def one_stage_zb_h1_twins(knobs_list: list) -> set:
    """The one-stage zb-h1 tuples whose 1F1B twin (same micro-batches, recompute, ZeRO) is in
    the space: with one stage ZB-H1 is 1F1B (the same rows, schedules.py, and one micro-batch
    in flight under both, planner.cost.in_flight_micro_batches), so each of its plans is the
    twin's at the same time and memory; kept, it would list the same layout twice."""
    ones = {(k.micro_batch_size, k.recompute, k.zero_stage, k.reshard_after_forward) for k in knobs_list
            if k.schedule == "1f1b" and k.num_stages == 1}
    return {k for k in knobs_list if k.schedule == "zb-h1" and k.num_stages == 1
            and (k.micro_batch_size, k.recompute, k.zero_stage, k.reshard_after_forward) in ones}


def aggregate_compute_bound_s(model, training, classes) -> float:
    """Iteration time if every GPU ran the model's FLOPs at its matmul peak in the training
    precision (``GpuType.peak_flops_for``; a bound no plan beats)."""
    flops = model_flops_per_iteration(model, training.global_batch_size, training.seq_len)
    peak = sum(c.gpu.peak_flops_for(training.precision) * c.node_class.num_gpus for c in classes)
    return flops / peak


# The unit of solver.objective and solver.bound in the plan, per objective (the summary
# converts cost to USD per million tokens; the JSON keeps the solver's own value).
OBJECTIVE_UNITS = {"throughput": "s per iteration",
                   "throughput-under-budget": "s per iteration",
                   "cost": "USD/hour x s per iteration (USD per token = value / 3600 / tokens per iteration)",
                   "cost-above-floor": "USD/hour"}

# What leaving GPUs idle wins under each objective (the reason given for idle GPUs).
IDLE_GAIN = {"throughput": "shorten the iteration",
             "throughput-under-budget": "shorten the iteration within the budget",
             "cost": "lower the cost per token",
             "cost-above-floor": "meet the tokens/s floor for fewer USD/hour"}


def _unsearched(classes, training, launcher) -> str:
    """What the searched space leaves out that could use idle GPUs: mixed stages, where two
    classes share a zone and they were not searched."""
    zones = [c.zone for c in classes]
    if training.mixed_stages or launcher or len(set(zones)) == len(zones):
        return ""
    return "mixed stages, which --mixed-stages also searches"


def idle_gpus(classes, plan: Plan, cluster, spec: ObjectiveSpec | None = None, proved: bool = True,
              unsearched: str = "") -> list[str]:
    """GPUs the plan leaves idle, per class, with the reason we can give: proved, that no plan
    using them does better under the objective; otherwise only that the best plan found does
    not use them."""
    used = set(plan.devices())
    used_nodes = {d.rpartition(":")[0] for d in used}
    used_zones = sorted({c.zone for c in classes if used_nodes & set(c.node_class.node_names)})
    gain = IDLE_GAIN[(spec or ObjectiveSpec()).kind]
    out = []
    for c in classes:
        devs = [f"{n}:{i}" for n in c.node_class.node_names for i in range(c.gpus_per_node)]
        idle = [d for d in devs if d not in used]
        if not idle:
            continue
        if proved:
            why = (f"the optimum under the cost model does not use them: using them (as more replicas "
                   f"or more stages) does not {gain}")
            if unsearched:
                why += f" (in the space searched: not {unsearched})"
        else:
            why = (f"the best plan found does not use them (not proved: the search stopped with a gap; "
                   f"a plan using them might {gain})")
        node_price, budget = c.node_price_usd_per_hour, (spec.budget_usd_per_hour if spec else None)
        if budget is not None and node_price is not None and len(idle) == len(devs):
            if node_price > budget:
                why = f"one of its nodes rents for {node_price:.2f} USD/hour, over the budget of {budget:g}"
            elif plan.predicted is not None and plan.predicted.usd_per_hour + node_price > budget:
                why += (f"; one of its nodes ({node_price:.2f} USD/hour) would take the plan's "
                        f"{plan.predicted.usd_per_hour:.2f} USD/hour over the budget of {budget:g}")
        if len(idle) == len(devs) and c.zone not in used_zones:
            links = [cluster.link(c.zone, z) for z in used_zones]
            bw = [f"{lk.bandwidth_Bps * 8 / 1e9:g} Gbit/s, {lk.latency_s * 1e3:g} ms to {z}"
                  for lk, z in zip(links, used_zones) if lk is not None]
            if bw:
                why += f"; zone {c.zone} is behind {'; '.join(bw)}"
        out.append(f"{len(idle)} of {len(devs)} GPUs of {c.name} idle: {why}")
    return out
