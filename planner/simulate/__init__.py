"""Event-driven execution of a plan's pipeline schedule (DESIGN §1: simulate)."""

from planner.simulate.engine import SimEvent, SimResult, SimStage, as_sim_stages, simulate_pipeline
from planner.simulate.schedules import SCHEDULES, stage_orders

__all__ = ["SCHEDULES", "SimEvent", "SimResult", "SimStage", "as_sim_stages", "simulate_pipeline",
           "stage_orders"]
