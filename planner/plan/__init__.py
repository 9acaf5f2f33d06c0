"""The Plan model, JSON (de)serialisation, the JSON Schema and the rank map."""

from planner.plan.check import check_plan, load_plan, plan_from_data
from planner.plan.model import (
    SCHEMA_ID,
    LaunchInfo,
    LaunchNode,
    LaunchRank,
    Objective,
    Plan,
    PlanInputs,
    Predicted,
    Replica,
    SolverReport,
    Stage,
)
from planner.plan.rankmap import build_launch
from planner.plan.schema import plan_schema, validate_plan_json

__all__ = [
    "SCHEMA_ID", "LaunchInfo", "LaunchNode", "LaunchRank", "Objective", "Plan", "PlanInputs",
    "Predicted", "Replica", "SolverReport", "Stage", "build_launch", "check_plan", "load_plan",
    "plan_from_data", "plan_schema", "validate_plan_json",
]
