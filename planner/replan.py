"""Re-planning after the cluster changed: is the old plan still valid, how fast would it be
now, and what does a fresh search give?  This is what a CI job runs on every change of the
cluster spec (``planner replan CLUSTER PLAN``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.errors import InputError
from planner.plan import Plan, check_plan
from planner.spec import Cluster, Training, load_model


@dataclass
class ReplanResult:
    old_valid: bool
    old_problems: list[str]               # why the old plan no longer runs (empty when valid)
    old_evaluation: object | None         # the old plan priced on the new cluster, when valid
    search: object                        # planner.search.SearchResult on the new cluster
    kept_devices: int = 0                 # devices serving the same stage in both plans
    moved_devices: list[str] = field(default_factory=list)

    @property
    def plan(self) -> Plan:
        return self.search.plan

    @property
    def speedup(self) -> float | None:
        """New tokens/s over the old plan's on the new cluster (None when the old is invalid)."""
        if self.old_evaluation is None:
            return None
        return self.search.evaluation.tokens_per_s / self.old_evaluation.tokens_per_s


def _training_of(plan: Plan) -> Training:
    spec = dict(plan.inputs.training)
    known = {k: spec[k] for k in ("global_batch_size", "seq_len", "precision") if k in spec}
    return Training(**known)


def _stage_of_device(plan: Plan) -> dict[str, int]:
    return {d: s.index for s in plan.stages for r in s.replicas for d in r.devices}


def replan(cluster: Cluster, old: Plan, time_limit_s: float = 60.0, profiles=None,
           file: str = "<plan>") -> ReplanResult:
    from planner.cost import evaluate
    from planner.search import solve

    model = load_model(old.inputs.model)
    training = _training_of(old)
    problems: list[str] = []
    old_ev = None
    try:
        check_plan(cluster, old, model, file=file)
        old_ev = evaluate(cluster, old, profiles=profiles, model=model)
    except InputError as exc:
        problems = str(exc).splitlines()
    objective = old.objective
    result = solve(cluster, model, training, objective=objective.kind, time_limit_s=time_limit_s,
                   budget_usd_per_hour=objective.budget_usd_per_hour,
                   min_tokens_per_s=objective.min_tokens_per_s, profiles=profiles)
    before, after = _stage_of_device(old), _stage_of_device(result.plan)
    kept = sum(1 for d, s in after.items() if before.get(d) == s)
    moved = sorted(d for d, s in after.items() if d in before and before[d] != s)
    return ReplanResult(old_valid=not problems, old_problems=problems, old_evaluation=old_ev,
                        search=result, kept_devices=kept, moved_devices=moved)
