"""The search's answer: its plans named and re-evaluated, the solver report (status, gap,
bound, the space searched, the baselines beaten) and the GPUs the answer leaves idle, with
the reason that can be given for them (solve.py hands over what the search reached)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from planner.cost import evaluate, topology_for
from planner.cost.flops import model_flops_per_iteration
from planner.errors import InfeasibleError
from planner.plan import Plan
from planner.plan.model import SolverReport
from planner.search.classes import class_infos, classes_without_bf16
from planner.search.core.problem import relative_gap
from planner.search.diagnose import explain_infeasible
from planner.search.given import as_answer
from planner.search.knobs import context_degrees
from planner.search.naming import build_plan
from planner.search.objectives import ObjectiveSpec
from planner.search.schedules import schedules_for


@dataclass
class SearchResult:
    plans: list[Plan]
    evaluations: list
    report: SolverReport
    idle: list[str] = field(default_factory=list)
    # What a user should know about the inputs, one line each (input_warnings): GPU types
    # priced at a stand-in matmul peak in the training precision, a sequence past the model's
    # trained context, expert-parallel degrees on a dense model.
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


def finish(cluster, model, training, spec, classes, best, bounds, stats, t0, profiles, launcher):
    if not best.items:
        raise InfeasibleError(explain_infeasible(cluster, model, training, spec, classes, stats, launcher))
    plans, evals = [], []
    objective = spec.to_plan_objective()
    for cand in best.items:
        plan = _plan_of(cand, cluster, model, training, classes, objective)
        ev = evaluate(cluster, plan, profiles=profiles, model=model)
        plans.append(plan)
        evals.append(ev)
    top = best.items[0]
    # the classes as the user's nodes group (not the per-node view's, classes.per_node_view):
    # its idle GPUs are told per class of identical nodes
    as_classes = class_infos(topology_for(cluster), training.precision)
    time_like = spec.kind in ("throughput", "throughput-under-budget")
    value = evals[0].iteration_time_s if time_like else top.key[0]
    bound = min(bounds) if bounds else None
    agg = aggregate_compute_bound_s(model, training, classes)
    if bound is not None:
        bound = min(bound, value)
    complete = stats.unexplored == 0 and stats.milp_optimal
    gap = relative_gap(value, bound) if bound is not None else (0.0 if complete else None)
    # proved either way: every tuple solved or pruned, or the least bound of those left (each
    # unexplored or unproved one adds its own to ``bounds``) already at the answer's value (a
    # review found "feasible, gap 0%" with 990 tuples left, all bounded above the answer)
    status = "optimal" if gap is not None and gap <= 1e-6 else "feasible"
    wall = time.monotonic() - t0
    report_fields = {
        "method": "milp", "status": status, "objective": value, "bound": bound if bound is not None else (value if complete else None),
        "gap": gap, "wall_s": wall, "space": _space(training, launcher),
        "candidates": stats.solved + stats.pruned, "knob_tuples": stats.knobs,
        "knob_tuples_solved": stats.solved, "knob_tuples_pruned": stats.pruned,
        "knob_tuples_infeasible": stats.empty, "knob_tuples_unexplored": stats.unexplored,
        "knob_tuples_too_big": stats.too_big,
        "knob_tuples_gpipe_twins": stats.twins,
        "aggregate_compute_bound_s": agg, "objective_kind": spec.kind, "node_classes": len(as_classes),
        "objective_unit": OBJECTIVE_UNITS[spec.kind]}
    found = best.found_at(top)
    if found is not None:       # when the answer first entered: the rest of the time went to proving it
        report_fields["answer_found_s"] = max(0.0, found - t0)
    if stats.interrupted:
        report_fields["interrupted"] = True
    if stats.given:      # plans given whole (given.py): how many, and whether one is the answer
        report_fields["given_incumbents"] = stats.given
        report_fields["answer_is_given"] = top.plan is not None
    if stats.too_big:       # tuples too big for the exact MILP: how many better plans their LPs' options gave
        report_fields["support_plans"] = stats.support_plans
        report_fields["path_bounds"] = stats.path_bounds
        report_fields["path_bounds_lifted"] = stats.path_lifted
    if stats.polished:      # unproved MILPs' plans improved by local search (per_tuple.py)
        report_fields["polished_milp_plans"] = stats.polished
    if stats.shared_warm_start is not None:     # the throughput warm start's plans, under a cost objective
        report_fields["shared_warm_start_plans"] = stats.shared_warm_start
    base_s = _evaluated_baseline_s(cluster, model, training, classes, objective, profiles, stats.baseline, top, value) \
        if time_like else None
    report_fields.update(_baseline_fields(stats.baseline, value, top, time_like, base_s))
    # The search priced each plan with the cost model's pieces; evaluate prices the whole plan.
    # They must agree (tests hold them to 1e-9); report the worst disagreement, not hide it.
    if time_like:
        report_fields["priced_vs_evaluated_rel"] = max(
            abs(ev.iteration_time_s - c.time_s) / ev.iteration_time_s for ev, c in zip(evals, best.items))
    final = []
    for k, (plan, ev, cand) in enumerate(zip(plans, evals, best.items)):
        own = ev.iteration_time_s if time_like else cand.key[0]
        fields = report_fields if k == 0 else _runner_up_fields(report_fields, own, stats.baseline, cand, time_like,
                                                                base_s)
        rep = SolverReport(**{**fields, "objective": own})
        update = {"predicted": ev.predicted(), "solver": rep}
        try:
            from planner.plan.rankmap import build_launch
            update["launch"] = build_launch(cluster, plan)
        except ImportError:  # pragma: no cover - rankmap ships with the package
            pass
        final.append(plan.model_copy(update=update))
    report = SolverReport(**report_fields)
    idle = idle_gpus(as_classes, final[0], cluster, spec, proved=status == "optimal",
                     unsearched=_unsearched(classes, training, launcher))
    for c in classes_without_bf16(topology_for(cluster)) if training.precision == "bf16" else []:
        idle.append(f"{c.num_gpus} GPUs of {c.name} idle: {c.gpu.name} has no bf16; train with "
                    "--precision fp16 (or fp32 / tf32) to use them")
    return SearchResult(plans=final, evaluations=evals, report=report, idle=idle,
                        warnings=input_warnings(cluster, model, training))


def input_warnings(cluster, model, training) -> list[str]:
    """Lines about inputs that are valid but likely not what was meant, or that the prices
    rest on assumptions for; the CLI prints them before the search, code reads
    ``SearchResult.warnings``."""
    out = []
    if model.max_seq_len and training.seq_len > model.max_seq_len:
        out.append(f"{model.name} is defined for sequences of at most {model.max_seq_len} tokens; "
                   f"planning for {training.seq_len} (a longer context than it was trained with)")
    out.extend(cluster.precision_notes(training.precision))
    if not model.is_moe and any(e > 1 for e in training.expert_parallel_degrees):
        # not an error (EP 1 is the dense model's only degree, and the search takes it), but a
        # degree that does nothing is worth a word: often the wrong model was named
        out.append(f"{model.name} has no experts; expert-parallel degrees "
                   f"{','.join(map(str, training.expert_parallel_degrees))} are ignored (dense models run EP 1)")
    return out


def _runner_up_fields(fields: dict, value: float, base, cand, time_like: bool, base_s: float | None = None) -> dict:
    """The report of the k-th plan of ``--top`` (k >= 2): the same bound (on the best plan of
    the space), but its own gap to it, status and baselines; it was the answer's copy, so
    plan 5 read "optimal, gap 0" while a baseline was 10% faster."""
    bound = fields["bound"]
    gap = relative_gap(value, bound) if bound is not None else None
    status = "optimal" if fields["status"] == "optimal" and gap is not None and gap <= 1e-6 else "feasible"
    return {**fields, "gap": gap, "status": status, **_baseline_fields(base, value, cand, time_like, base_s)}


PRICED_REL = 1e-9       # the search's price of a plan and evaluate's agree to this, but for shared cores


def _evaluated_baseline_s(cluster, model, training, classes, objective, profiles, base, top, value: float):
    """The best baseline's iteration time under ``evaluate``, where the search priced the
    answer apart from it (nodes whose ``cores`` the plan oversubscribes: the search prices
    without processor sharing, docs/profiles.md), so that the two compare alike; None where
    they agree, and the search's own price of the baseline stands."""
    if base is None or base.best is None or abs(value - top.time_s) <= PRICED_REL * value:
        return None
    plan = _plan_of(base.best, cluster, model, training, classes, objective)
    return evaluate(cluster, plan, profiles=profiles, model=model).iteration_time_s


def _plan_of(cand, cluster, model, training, classes, objective) -> Plan:
    """``cand`` as a named plan: a plan given whole as it was, else built from its layout."""
    return (as_answer(cand, cluster, model, training, objective) if cand.plan is not None
            else build_plan(cluster, model, training, classes, cand.knobs, cand.layout, objective))


def _baseline_fields(base, value: float, top, time_like: bool, base_s: float | None = None) -> dict:
    """The best baseline (baselines.py) and its objective value over ``value``'s: >= 1 for the
    answer, which is at least as good (the baselines seeded the incumbents), where the search
    priced both as ``evaluate`` does; plans 2..K of ``--top`` may be below it
    (_runner_up_fields).  ``base_s``: the baseline evaluated, where the search's prices leave
    out shared cores (``_evaluated_baseline_s``); the ratio then compares the two evaluated,
    and may fall below 1 (a review found 0.54 against a baseline priced without the sharing
    the answer's evaluation held), and each rule's ratio compares the search's prices."""
    if base is None or base.best is None:
        return {"baselines_priced": base.priced if base else 0, "baselines_complete": base.complete if base else True}
    def value_of(c):
        return c.time_s if time_like else c.key[0]
    ours = value if time_like else top.key[0]
    theirs = value_of(base.best) if base_s is None else base_s
    ratio = theirs / ours if ours > 0 else None
    if ratio is not None and abs(ratio - 1.0) <= 1e-9:
        ratio = 1.0         # the answer is the baseline, priced twice (0.9999999999999998 read as "worse")
    ours_priced = ours if base_s is None else top.time_s
    return {"baseline": base.name, "baseline_objective": theirs,
            "baseline_ratio": ratio,
            # each rule's best over the answer; under the time objectives a lower bound on it
            # where the baselines' pricing skipped tuples (baselines.seed)
            "baseline_ratio_by_rule": ({r: (base.rule_floor_s(r) if time_like else value_of(c)) / ours_priced
                                        for r, c in sorted(base.by_rule.items())} if ours_priced > 0 else None),
            "baselines_priced": base.priced, "baselines_wall_s": base.wall_s, "baselines_complete": base.complete}


def _schedule_words(entry) -> str:
    """A schedule as the space states it: its virtual stages, and how its time is priced
    (the registry's fields, planner/search/schedules.py)."""
    notes = [f"v={entry.virtual_stages}"] if entry.virtual_stages > 1 else []
    if not entry.exact:
        notes.append("rows bound its time, its plans priced exactly")
    if not entry.launchers:     # neither Megatron-LM nor DeepSpeed runs it
        notes.append("torch pipelining only")
    return entry.name + (f" ({'; '.join(notes)})" if notes else "")


def _space(training, launcher: str | None) -> str:
    """The searched space, as the plan's solver report states it: the freedoms ``training``
    lists, not the defaults', so a plan searched with fewer says so."""
    stages = f"stages 1..{training.max_stages}" if training.max_stages else "stages 1..L"
    sizes = "micro-batch size x count = global batch" + (
        ", per-replica sizes " + "/".join(map(str, training.micro_batch_sizes)) if training.micro_batch_sizes else "")
    zero = "ZeRO " + "/".join(map(str, sorted(set(training.zero_stages))))
    if 3 in training.zero_stages:
        zero += " (reshard_after_forward " + "/".join(
            sorted({str(r).lower() for r in training.reshard_after_forward})) + ")"
    # "whole nodes": the proof covers this space only, and a sweep found a cluster where a
    # second identical node made the proved optimum slower (the one-node class's in-node
    # pipeline left the space); the report says so rather than claim more
    space = (f"{stages}; contiguous uneven block ranges; per stage one node class (whole nodes of a class "
             "of several, GPU slices of a one-node class), a TP degree "
             f"(power of two up to {training.max_tp} within a node, dividing the heads), n replicas "
             "(the fewest giving their largest share), shares differing by at most one; "
             f"{sizes}; schedules " + ", ".join(map(_schedule_words, schedules_for(training, launcher)))
             + "; recompute " + "/".join(training.recompute_modes) + f"; {zero}; "
             "idle GPUs allowed (docs/search-space.md)")
    cps = sorted({cp for cp in context_degrees(training, launcher) if cp > 1})
    if cps:
        space += "; also context parallel " + "/".join(map(str, cps)) + " (replicas of tp x cp GPUs)"
    eps = sorted({ep for ep in training.expert_parallel_degrees if ep > 1})
    if eps:
        space += "; also expert parallel " + "/".join(map(str, eps)) + " (MoE models)"
    if tuple(training.zero_shard_degrees) != ("all",):
        space += "; ZeRO shard groups " + "/".join(map(str, training.zero_shard_degrees)) + " (HSDP)"
    if launcher:
        return space + f"; launcher {launcher}: same tp and replicas per stage, equal shares"
    if training.mixed_stages:
        return space + ("; also mixed stages: two node classes of one zone, a TP degree and 1, 2, 4, ... "
                        "whole nodes (GPU slices of a one-node class) each, shares split by peak FLOP/s")
    return space


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
# the same, short, for progress lines
SHORT_UNITS = {"throughput": "s", "throughput-under-budget": "s", "cost": "USD/h x s", "cost-above-floor": "USD/h"}

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
