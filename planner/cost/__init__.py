"""Cost model (DESIGN §5): per-layer FLOPs and bytes, compute time per GPU type (profile
first, roofline fallback), collective times over the topology, memory per device, and the
iteration time as a sum of named terms.  See docs/internals.md (cost) for the API the search
relies on."""

from planner.cost.calibration import (
    Calibration,
    CommCalibration,
    GpuCalibration,
    default_calibration,
    load_calibration,
)
from planner.cost.comm import dp_exposed_s, dp_sync_time_s, p2p_time_s, ring_allreduce_s, shared_link_time_s
from planner.cost.compute import ReplicaTiming, optimizer_time_s, replica_compute
from planner.cost.context import CostContext
from planner.cost.evaluate import context_for_plan, evaluate, topology_for
from planner.cost.memory import in_flight_micro_batches, replica_memory, replica_memory_bytes, stage_params
from planner.cost.result import Evaluation
from planner.cost.schedule import StageTiming, iteration_time_s, pipeline_breakdown, pipeline_time_s

__all__ = [
    "Calibration", "CommCalibration", "CostContext", "Evaluation", "GpuCalibration", "ReplicaTiming",
    "StageTiming", "context_for_plan", "default_calibration", "dp_exposed_s", "dp_sync_time_s",
    "evaluate", "in_flight_micro_batches", "iteration_time_s", "load_calibration", "optimizer_time_s",
    "p2p_time_s", "pipeline_breakdown", "pipeline_time_s", "replica_compute", "replica_memory",
    "replica_memory_bytes", "ring_allreduce_s", "shared_link_time_s", "stage_params", "topology_for",
]
