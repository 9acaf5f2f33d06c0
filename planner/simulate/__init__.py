"""Event-driven execution of a plan's pipeline schedule (DESIGN §1: simulate)."""

from planner.simulate.engine import SimEvent, SimResult, SimStage, as_sim_stages, simulate_pipeline
from planner.simulate.plan import PlanSimulation, simulate_plan, timeline_rows
from planner.simulate.schedules import SCHEDULES, stage_orders

__all__ = [
           "SCHEDULES",
           "PlanSimulation",
           "SimEvent",
           "SimResult",
           "SimStage",
           "as_sim_stages",
           "simulate_pipeline",
           "simulate_plan",
           "stage_orders",
           "timeline_rows",
]
