"""Re-planning after the cluster changed: is the old plan still valid, how fast would it be
now, and what does a fresh search give?  This is what a CI job runs on every change of the
cluster spec (``planner replan CLUSTER PLAN``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.errors import InputError
from planner.plan import Plan, check_plan
from planner.plan.check import plan_training
from planner.spec import Cluster, load_model


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


def _stage_of_device(plan: Plan) -> dict[str, int]:
    return {d: s.index for s in plan.stages for r in s.replicas for d in r.devices}


def old_plan_status(cluster: Cluster, old: Plan, profiles=None, file: str = "<plan>"):
    """(problems, evaluation): why ``old`` no longer runs on ``cluster`` (devices gone, memory
    over), or ``([], its evaluation on the new cluster)``."""
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
           file: str = "<plan>") -> ReplanResult:
    """``profiles``: as ``planner.api.resolve_profiles`` gives them (the API and CLI call this
    through ``api.replan``)."""
    from planner import api

    # The model and training are the job itself: without them there is nothing to re-plan (exit 2).
    model = load_model(old.inputs.model)
    training = plan_training(old, file)
    problems, old_ev = old_plan_status(cluster, old, profiles, file)
    objective = old.objective
    result = api.plan(cluster, model, training, objective=objective.kind, time_limit_s=time_limit_s,
                      budget_usd_per_hour=objective.budget_usd_per_hour,
                      min_tokens_per_s=objective.min_tokens_per_s, profiles=profiles)
    before, after = _stage_of_device(old), _stage_of_device(result.plan)
    kept = sum(1 for d, s in after.items() if before.get(d) == s)
    moved = sorted(d for d, s in after.items() if d in before and before[d] != s)
    return ReplanResult(old_valid=not problems, old_problems=problems, old_evaluation=old_ev,
                        search=result, kept_devices=kept, moved_devices=moved)
