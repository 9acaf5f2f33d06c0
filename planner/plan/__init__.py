"""The Plan model, JSON (de)serialisation, the JSON Schema and the rank map."""

from planner.plan.model import (
    SCHEMA_ID, LaunchInfo, LaunchNode, LaunchRank, Objective, Plan, PlanInputs, Predicted, Replica,
    SolverReport, Stage,
)

__all__ = [
    "SCHEMA_ID", "LaunchInfo", "LaunchNode", "LaunchRank", "Objective", "Plan", "PlanInputs",
    "Predicted", "Replica", "SolverReport", "Stage",
]
