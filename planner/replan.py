"""Re-planning after the cluster changed: is the old plan still valid, how fast would it be
now, and what does a fresh search give?  This is what a CI job runs on every change of the
cluster spec (``planner replan CLUSTER PLAN``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.diff import device_changes
from planner.errors import InfeasibleError, InputError, InputErrors, Location
from planner.migrate import Migration, migration
from planner.plan import Plan, check_plan
from planner.plan.check import check_layout, plan_training
from planner.repair import relabel, repair
from planner.spec import Cluster, load_model


@dataclass
class Option:
    """One plan replan may answer with, priced on the new cluster with its migration."""
    source: str                           # "old plan", "old plan repaired", "fresh search"
    plan: Plan
    evaluation: object
    migration: Migration
    score: float                          # the objective's value, migration amortised (lower wins)


@dataclass
class ReplanResult:
    old_valid: bool
    old_problems: list[str]               # why the old plan no longer runs (empty when valid)
    old_evaluation: object | None         # the old plan priced on the new cluster, when valid
    search: object                        # planner.search.SearchResult on the new cluster
    chosen: Option                        # the answer: the old plan (repaired) or the fresh one
    fresh: Option                         # the fresh search's plan, nodes renamed to keep state
    fresh_as_named: Migration             # what the fresh plan would move with the search's names
    repaired: Option | None = None        # the old plan kept or repaired (None: not repairable)
    rejected: list[str] = field(default_factory=list)   # options over --max-moved-fraction
    # devices by stage, old plan against the answer (planner.diff.device_changes, as `diff`)
    kept_devices: int = 0                 # serving the same stage in both plans
    moved_devices: list[str] = field(default_factory=list)     # in both, another stage now
    added_devices: list[str] = field(default_factory=list)     # only in the answer
    removed_devices: list[str] = field(default_factory=list)   # only in the old plan

    @property
    def plan(self) -> Plan:
        return self.chosen.plan

    @property
    def evaluation(self):
        return self.chosen.evaluation

    @property
    def migration(self) -> Migration:
        return self.chosen.migration

    @property
    def speedup(self) -> float | None:
        """Chosen tokens/s over the old plan's on the new cluster (None when the old is invalid)."""
        if self.old_evaluation is None:
            return None
        return self.chosen.evaluation.tokens_per_s / self.old_evaluation.tokens_per_s

    @property
    def vs_fresh(self) -> float:
        """Chosen tokens/s over the fresh plan's (1.0 when the fresh plan is the answer)."""
        return self.chosen.evaluation.tokens_per_s / self.fresh.evaluation.tokens_per_s


class InconsistentPlan(InputErrors):
    """The old plan contradicts itself, whatever the cluster: bad input (exit 2), not a
    cluster change (exit 4).  ``errors`` as ``InputErrors``, each naming the field."""

    def _text(self) -> str:
        return ("the old plan is inconsistent in itself, on any cluster: bad input, not a cluster "
                "change (`planner evaluate` refuses it too):\n" + super()._text())


def _recorded_gpu_types(plan: Plan) -> set[str]:
    """The GPU types the plan's own cost records name (``inputs.profiles`` keys such as
    ``A100-SXM4-80GB/block/mb1/tp1``, ``predicted.trust``): types it was priced on."""
    names: set[str] = set()
    for keys in (plan.inputs.profiles or {}).values():
        if isinstance(keys, list):
            names.update(k.rsplit("/", 3)[0] for k in keys if isinstance(k, str) and k.count("/") >= 3)
    for row in (plan.predicted.trust or []) if plan.predicted is not None else []:
        if isinstance(row, dict) and isinstance(row.get("gpu_type"), str):
            names.add(row["gpu_type"])
    return {n.strip().lower() for n in names}


def _unknown_gpu_types(cluster: Cluster, plan: Plan, file: str) -> list[InputError]:
    """A replica's ``gpu_type`` that names a GPU type known nowhere: not a catalog id, not a GPU
    of ``cluster``, not one the plan was priced on.  A known type on a node that now holds
    another is a cluster change (``old_plan_status``); an unknown one no cluster ever held."""
    from planner import catalog

    here = sorted({n.gpu.name for n in cluster.node_list})
    known = {n.strip().lower() for n in here} | _recorded_gpu_types(plan)
    errors = []
    for i, stage in enumerate(plan.stages):
        for j, rep in enumerate(stage.replicas):
            if rep.gpu_type.strip().lower() in known or catalog.find_gpu(rep.gpu_type) is not None:
                continue
            errors.append(InputError(
                f"gpu_type {rep.gpu_type!r} is no GPU type the planner knows: not a catalog id "
                f"(`planner catalog gpus`), not a GPU of cluster {cluster.name!r} ({', '.join(here)}), "
                "and not one the plan's cost records (inputs.profiles) name",
                Location(file, field=f"stages[{i}].replicas[{j}].gpu_type")))
    return errors


def check_old_plan(cluster: Cluster, old: Plan, file: str = "<plan>") -> None:
    """Raise ``InconsistentPlan`` when ``old`` contradicts itself: the checks ``planner
    evaluate`` applies that need no cluster (``check_layout``: stages, blocks against its
    model, shares, batch, schedule, devices used once) and a ``gpu_type`` known nowhere.  What
    is left for ``old_plan_status`` is what a changed cluster explains: devices gone, another
    GPU type on a node, memory."""
    errors: list[InputError] = []
    try:
        check_layout(old, file=file)
    except InputErrors as exc:
        errors.extend(exc.errors)
    errors.extend(_unknown_gpu_types(cluster, old, file))
    if errors:
        raise InconsistentPlan(errors)


def old_plan_status(cluster: Cluster, old: Plan, profiles=None, file: str = "<plan>"):
    """(problems, evaluation): why ``old`` no longer runs on ``cluster`` (devices gone, memory
    over), or ``([], its evaluation on the new cluster)``.  ``replan`` calls it on a plan that
    passed ``check_old_plan``: the problems are then the cluster's doing."""
    from planner.cost import evaluate

    try:
        check_plan(cluster, old, file=file)
        ev = evaluate(cluster, old, profiles=profiles, check=False)
    except InputError as exc:
        return str(exc).splitlines(), None
    if not ev.fits:
        return list(ev.memory_problems), None
    return [], ev


def replan(cluster: Cluster, old: Plan, time_limit_s: float = 60.0, profiles=None,
           file: str = "<plan>", migration_steps: int | None = None,
           max_moved_fraction: float | None = None, **search_options) -> ReplanResult:
    """``profiles``: as ``planner.api.resolve_profiles`` gives them (the API and CLI call this
    through ``api.replan``).  The old plan (repaired after lost nodes) is the first candidate:
    the fresh search's plan replaces it only when it is better under the objective, with the
    migration's time spread over ``migration_steps`` steps when given, and moves at most
    ``max_moved_fraction`` of the state."""
    from planner import api
    from planner.cost import evaluate, topology_for

    if migration_steps is not None and migration_steps < 1:
        raise InputError(f"--migration-steps must be at least 1, got {migration_steps}")
    if max_moved_fraction is not None and not 0 <= max_moved_fraction <= 1:
        raise InputError(f"--max-moved-fraction must be between 0 and 1, got {max_moved_fraction}")
    # A plan that contradicts itself is bad input (exit 2), not a cluster change (exit 4): it
    # would otherwise be "repaired" and migrated from, and its model (a 40-layer llama3-8b, a
    # llama3-70b of 32 blocks) searched for.  The model and training are the job itself:
    # without them there is nothing to re-plan (exit 2).
    check_old_plan(cluster, old, file)
    model = load_model(old.inputs.model)
    training = plan_training(old, file)
    problems, old_ev = old_plan_status(cluster, old, profiles, file)
    check_precision_runs(cluster, old, training, file)
    topo = topology_for(cluster)
    objective = old.objective
    # the old plan, or its repair, first: it is the search's first incumbent (search/given.py),
    # so the search prunes what cannot beat it and answers it when nothing does
    fixed = old if not problems else repair(cluster, old, topo)
    fixed_ev = None
    if fixed is not None:
        fixed_ev = old_ev if fixed is old else evaluate(cluster, fixed, profiles=profiles, check=False)
        if fixed_ev is not None and not fixed_ev.fits:
            fixed_ev = None
    result = api.plan(cluster, model, training, objective=objective.kind, time_limit_s=time_limit_s,
                      budget_usd_per_hour=objective.budget_usd_per_hour,
                      min_tokens_per_s=objective.min_tokens_per_s, profiles=profiles,
                      incumbents=[fixed] if fixed_ev is not None else [], **search_options)

    def option(source: str, plan: Plan, ev) -> Option:
        mig = migration(old, plan, model, topo)
        return Option(source, plan, ev, mig, _score(objective, ev, mig, migration_steps))

    fresh_plan, fresh_ev = result.plan, result.evaluation
    renamed = relabel(fresh_plan, old, model, topo)
    renamed_ev = evaluate(cluster, renamed, profiles=profiles, check=False)
    if abs(renamed_ev.iteration_time_s - fresh_ev.iteration_time_s) <= 1e-9 * fresh_ev.iteration_time_s:
        fresh_plan, fresh_ev = _finished(cluster, renamed, renamed_ev), renamed_ev
    fresh = option("fresh search", fresh_plan, fresh_ev)
    repaired = None
    if fixed_ev is not None:
        repaired = option("old plan" if fixed is old else "old plan repaired", _finished(cluster, fixed, fixed_ev),
                          fixed_ev)
    # The search's answer is at least as good as the old plan without its migration; with
    # it (--migration-steps), or over --max-moved-fraction, the old plan may still win.
    # ties go to the old plan: same value, fewer bytes moved
    options = [o for o in (repaired, fresh) if o is not None]
    allowed = [o for o in options if max_moved_fraction is None
               or o.migration.moved_fraction <= max_moved_fraction + 1e-12]
    rejected = [f"{o.source}: moves {o.migration.moved_fraction:.1%} of the state, over "
                f"--max-moved-fraction {max_moved_fraction:g}" for o in options if o not in allowed]
    if not allowed:
        raise InfeasibleError("no plan moves at most --max-moved-fraction of the state: "
                              + "; ".join(rejected) + ("" if repaired else "; the old plan cannot be repaired"))
    chosen = min(allowed, key=lambda o: (o.score, o.migration.moved_bytes))
    devices = device_changes(old, chosen.plan)
    return ReplanResult(old_valid=not problems, old_problems=problems, old_evaluation=old_ev,
                        search=result, chosen=chosen, fresh=fresh,
                        fresh_as_named=migration(old, result.plan, model, topo), repaired=repaired,
                        rejected=rejected, kept_devices=len(devices.kept),
                        moved_devices=[m["device"] for m in devices.moved], added_devices=devices.added,
                        removed_devices=devices.removed)


def check_precision_runs(cluster: Cluster, old: Plan, training, file: str) -> None:
    """``InfeasibleError`` when no GPU of ``cluster`` computes in the old plan's precision (bf16
    on Volta or Turing alone), with advice replan can take: it has no --precision, it keeps
    the old plan's training, so the way on is a plan made for fp16 or an edited old plan.  The
    search's own refusal names `planner plan`'s flag."""
    if training.precision != "bf16" or any(n.gpu.supports_bf16 for n in cluster.node_list):
        return
    types = ", ".join(sorted({n.gpu.name for n in cluster.node_list}))
    model = _model_argument(old.inputs.model)
    raise InfeasibleError(
        f"no GPU type of cluster {cluster.name!r} computes in bf16 ({types}), the precision {file} was "
        f"planned for (inputs.training.precision); replan keeps the old plan's training, so plan again "
        f"in fp16: `planner plan CLUSTER --model {model} --global-batch-size {training.global_batch_size} "
        f"--seq-len {training.seq_len} --precision fp16`, or set inputs.training.precision to fp16 "
        f"(or fp32 / tf32) in {file} and run replan on it")


def _model_argument(model) -> str:
    """What `planner plan --model` takes for the old plan's model: its catalog name where the
    plan's mapping is that catalog entry, else a file the user writes it to."""
    from planner import catalog

    name = model if isinstance(model, str) else model.get("name")
    found = catalog.find_model(name) if isinstance(name, str) else None
    if found is not None and (isinstance(model, str) or found.to_mapping() == model):
        return name
    return "MODEL.yaml"


def _score(objective, ev, mig: Migration, steps: int | None) -> float:
    """The objective's value (lower wins) with the migration's time spread over ``steps``
    iterations when given: iteration time, cost per token, or rent under a tokens/s floor."""
    time_s = ev.iteration_time_s + (mig.time_s / steps if steps else 0.0)
    kind = objective.kind
    price = ev.usd_per_hour
    if objective.budget_usd_per_hour is not None and price is not None \
            and price > objective.budget_usd_per_hour * (1 + 1e-12):
        return math.inf
    if kind in ("throughput", "throughput-under-budget"):
        return time_s
    if kind == "cost":
        return (price or 0.0) * time_s
    tokens_per_s = ev.tokens_per_s * ev.iteration_time_s / time_s
    return price if tokens_per_s >= objective.min_tokens_per_s * (1 - 1e-12) else math.inf


def _finished(cluster: Cluster, plan: Plan, ev) -> Plan:
    """``plan`` with its prediction on the new cluster and its rank map."""
    from planner.plan.rankmap import build_launch

    return plan.model_copy(update={"predicted": ev.predicted(), "launch": build_launch(cluster, plan)})
