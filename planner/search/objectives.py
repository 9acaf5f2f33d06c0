"""The four objectives (DESIGN §6) and how a plan's value is compared under each.

- ``throughput``: minimise iteration time (maximise tokens/s).
- ``cost``: minimise USD per token = USD/hour x iteration time / tokens per iteration, i.e.
  minimise price x time (node-hours; egress is added by the final evaluation only).
- ``throughput-under-budget``: minimise time with USD/hour (nodes) <= budget.
- ``cost-above-floor``: minimise USD/hour with tokens/s >= floor; ties go to the faster plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import InputError

KINDS = ("throughput", "cost", "throughput-under-budget", "cost-above-floor")
ALIASES = {"tokens": "throughput", "usd-per-token": "cost", "budget": "throughput-under-budget",
           "floor": "cost-above-floor"}


@dataclass(frozen=True)
class ObjectiveSpec:
    kind: str = "throughput"
    budget_usd_per_hour: float | None = None
    min_tokens_per_s: float | None = None

    @property
    def needs_prices(self) -> bool:
        return self.kind != "throughput"

    def key(self, price_usd_per_hour: float, time_s: float) -> tuple[float, ...]:
        """Smaller is better."""
        if self.kind == "cost":
            return (price_usd_per_hour * time_s,)
        if self.kind == "cost-above-floor":
            return (price_usd_per_hour, time_s)
        return (time_s,)

    def to_plan_objective(self):
        from planner.plan.model import Objective
        return Objective(kind=self.kind, budget_usd_per_hour=self.budget_usd_per_hour,
                         min_tokens_per_s=self.min_tokens_per_s)


def parse_objective(objective: str | ObjectiveSpec = "throughput", budget_usd_per_hour: float | None = None,
                    min_tokens_per_s: float | None = None) -> ObjectiveSpec:
    """Resolve flags into one objective; contradictions are input errors (exit 2)."""
    if isinstance(objective, ObjectiveSpec):
        return objective
    kind = ALIASES.get(str(objective), str(objective))
    if kind not in KINDS:
        raise InputError(f"unknown objective {objective!r}; choose one of {', '.join(KINDS)}")
    if budget_usd_per_hour is not None and min_tokens_per_s is not None:
        raise InputError("give either a USD/hour budget or a tokens/s floor, not both")
    if budget_usd_per_hour is not None:
        if not math.isfinite(budget_usd_per_hour) or budget_usd_per_hour <= 0:
            raise InputError(f"the budget must be a positive, finite number of USD/hour, got {budget_usd_per_hour}")
        if kind == "cost":
            raise InputError("a USD/hour budget goes with the throughput objective, not 'cost' "
                             "(cost already minimises USD per token)")
        if kind == "cost-above-floor":
            raise InputError("a USD/hour budget goes with the throughput objective, not 'cost-above-floor' "
                             "(which takes a tokens/s floor: --min-tokens-per-s)")
        kind = "throughput-under-budget"
    if min_tokens_per_s is not None:
        if not math.isfinite(min_tokens_per_s) or min_tokens_per_s <= 0:
            raise InputError(f"the tokens/s floor must be a positive, finite number, got {min_tokens_per_s}")
        if kind in ("throughput", "throughput-under-budget"):
            raise InputError(f"a tokens/s floor goes with the cost objective (minimise USD/hour above "
                             f"the floor), not {kind!r}; use --objective cost")
        kind = "cost-above-floor"
    if kind == "throughput-under-budget" and budget_usd_per_hour is None:
        raise InputError("objective throughput-under-budget needs a USD/hour budget")
    if kind == "cost-above-floor" and min_tokens_per_s is None:
        raise InputError("objective cost-above-floor needs a tokens/s floor")
    return ObjectiveSpec(kind, budget_usd_per_hour, min_tokens_per_s)
