"""The plan (DESIGN §3, §4): one logical pipeline, stages of replicas, global knobs.

``Plan.from_json`` accepts any plan of the documented form, hand-written ones included;
``predicted``, ``solver``, ``launch`` and the hashes are outputs and may be absent.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.spec.quantities import PositiveInt

SCHEMA_ID = "planner.plan/v1"

_FROZEN = ConfigDict(frozen=True, extra="forbid")

# Schedules with two chunks per rank on the V stage map (chunk 0 of rank r is stage r, chunk 1
# stage 2p - 1 - r; planner.simulate.zero_bubble), and those that split a backward into input
# and weight gradients (the cost model prices their W part, StageTiming.backward_weight_s).
V_SCHEDULES = ("zb-v", "dualpipev")
SPLIT_BACKWARD_SCHEDULES = ("zb-h1", *V_SCHEDULES)

# '<node name>:<local GPU index>', the index in canonical ASCII form, so that one GPU has one id
# ("a100:0", never "a100:00" or a non-ASCII digit beside it).
DEVICE_ID = re.compile(r"^(?P<node>[^:\s]+):(?P<index>0|[1-9][0-9]*)$")


def parse_device(device: str) -> tuple[str, int]:
    """``"a100-0:3"`` -> ``("a100-0", 3)``; ``ValueError`` for anything else."""
    m = DEVICE_ID.match(device)
    if m is None:
        raise ValueError(f"device id {device!r} is not '<node name>:<local GPU index>' "
                         "(an index such as 0, 1, 12)")
    return m["node"], int(m["index"])


class Replica(BaseModel):
    """``tp`` x the plan's ``context_parallel`` GPUs of one type inside one node, taking
    ``micro_batch_share`` sequences.  Device ``k`` is tensor-parallel rank ``k % tp`` of
    context-parallel rank ``k // tp`` (tp innermost, then cp: Megatron's rank order)."""

    model_config = _FROZEN

    gpu_type: str
    tp: PositiveInt
    micro_batch_share: PositiveInt
    devices: tuple[str, ...] = Field(description="'<node>:<local index>', tp x context_parallel of them")

    @model_validator(mode="after")
    def _devices_match_tp(self):
        # a multiple of tp here; the plan checks the exact tp x context_parallel (Plan._devices_match_cp)
        if len(self.devices) % self.tp:
            raise ValueError(f"a replica with tp={self.tp} needs {self.tp} devices, "
                             f"got {len(self.devices)}")
        for d in self.devices:
            parse_device(d)
        return self

    @property
    def node(self) -> str:
        return self.devices[0].rpartition(":")[0]


class Stage(BaseModel):
    model_config = _FROZEN

    index: int = Field(ge=0)
    blocks: tuple[int, int] = Field(description="[first, last) transformer blocks")
    embedding: bool = False
    head: bool = False
    replicas: tuple[Replica, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self):
        first, last = self.blocks
        if first < 0 or last < first:
            raise ValueError(f"blocks must be [first, last) with 0 <= first <= last, got {list(self.blocks)}")
        return self

    @property
    def num_blocks(self) -> int:
        return self.blocks[1] - self.blocks[0]


class Objective(BaseModel):
    model_config = _FROZEN

    kind: Literal["throughput", "cost", "throughput-under-budget", "cost-above-floor"] = "throughput"
    budget_usd_per_hour: float | None = None
    min_tokens_per_s: float | None = None


class DynamicShares(BaseModel):
    """The shares may change at run time (``planner run --dynamic-batching``, issue 21): whole
    sequences move between the replicas of a stage between steps, the micro-batch size stays.
    The stages' ``micro_batch_share`` are the starting point; these are the bounds."""

    model_config = _FROZEN

    min_share: PositiveInt = 1
    max_step_fraction: float = Field(default=0.5, gt=0, le=1)
    dead_band: float = Field(default=0.05, ge=0, lt=1)


class PlanInputs(BaseModel):
    model_config = _FROZEN

    cluster: str
    cluster_sha256: str | None = None
    model: dict[str, Any] | str
    training: dict[str, Any]
    profiles: dict[str, Any] | None = Field(
        default=None, description="which cost entries were measured and which estimated")


class Predicted(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    iteration_time_s: float
    tokens_per_s: float
    samples_per_s: float
    mfu: float
    usd_per_hour: float | None = None
    usd_per_million_tokens: float | None = None
    breakdown_s: dict[str, float]
    peak_memory_bytes: dict[str, float]
    trust: list[dict[str, Any]] | None = Field(
        default=None, description="per GPU type: validated on measured runs (and the error), calibrated, "
        "profiled, micro-benchmarked on one GPU, or datasheet-only")


# The solver fields a plan file keeps: what was proved about the plan and in what space.
# How long the search ran and how many knob tuples it reached (wall_s, candidates,
# knob_tuples_*) differ from run to run; they go to stderr and `plan --report FILE`, so that
# the same inputs give the same plan bytes.  A field not listed here stays out of the plan.
PLAN_SOLVER_FIELDS = ("method", "status", "objective", "bound", "gap", "space", "objective_kind",
                      "objective_unit", "node_classes", "aggregate_compute_bound_s",
                      "priced_vs_evaluated_rel", "interrupted", "baseline", "baseline_objective",
                      "baseline_ratio")


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number it holds (json writes those), within dicts and
    lists too; anything else as is."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


class SolverReport(BaseModel):
    """How a plan was found.  The search's own report also carries the run's timing and
    counters as extra fields; ``for_plan`` keeps what belongs in the plan file."""

    model_config = ConfigDict(frozen=True, extra="allow")

    method: str
    status: Literal["optimal", "feasible", "infeasible"]
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    space: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _plain_numbers(cls, data: Any) -> Any:
        # the counters come from numpy arithmetic in places: a numpy integer is no int to json
        return {k: _plain(v) for k, v in data.items()} if isinstance(data, dict) else data

    def _fields(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in type(self).model_fields}, **(self.model_extra or {})}

    def for_plan(self) -> SolverReport:
        """This report less the run's timing and counters (``PLAN_SOLVER_FIELDS``)."""
        return SolverReport(**{k: v for k, v in self._fields().items() if k in PLAN_SOLVER_FIELDS})

    def run_stats(self) -> dict[str, Any]:
        """The run's timing and counters: what ``for_plan`` leaves out."""
        return {k: v for k, v in self._fields().items() if k not in PLAN_SOLVER_FIELDS and v is not None}


class LaunchNode(BaseModel):
    model_config = _FROZEN

    node: str
    node_rank: int
    nproc_per_node: int


class LaunchRank(BaseModel):
    model_config = _FROZEN

    rank: int
    device: str
    stage: int
    replica: int
    tp_rank: int


class LaunchInfo(BaseModel):
    model_config = _FROZEN

    nodes: tuple[LaunchNode, ...]
    ranks: tuple[LaunchRank, ...]


class Plan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    schema_id: Literal["planner.plan/v1"] = Field(default=SCHEMA_ID, alias="schema")
    inputs: PlanInputs
    objective: Objective = Field(default_factory=Objective)
    micro_batch_size: PositiveInt
    num_micro_batches: PositiveInt
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev", "bitpipe", "latency-aware"] = "1f1b"
    virtual_stages: PositiveInt = 1
    pipeline_actions: tuple[tuple[str, ...], ...] | None = Field(
        default=None, description="latency-aware only: per stage (rank), its ordered actions, "
                                  "'F0.3' = forward of chunk 0 on micro-batch 3 (F, I, W); the "
                                  "launchers run exactly these")
    recompute: Literal["none", "selective", "full", "op"] = "none"
    zero_stage: Literal[0, 1, 2, 3] = 0
    reshard_after_forward: bool | None = Field(
        default=None, description="ZeRO-3 only (FSDP2's reshard_after_forward): true frees the "
                                  "gathered parameters after each forward (gathered again in "
                                  "backward); false keeps them to the last backward; absent: true")
    zero_shard_degree: PositiveInt | None = Field(
        default=None, description="HSDP (zero_stage >= 1): the ZeRO shards span groups of this many "
                                  "consecutive replicas of a stage (and their context_parallel ranks), "
                                  "the groups replicate each other; it divides every stage's replica "
                                  "count; absent: one group of all the stage's replicas")
    sequence_parallel: bool = False
    # Context parallelism (ring attention, Megatron-Core / torchtitan): each micro-batch's
    # sequences are split over this many GPUs of every replica; 1 (no split) is left out of the JSON.
    context_parallel: PositiveInt = 1
    expert_parallel: PositiveInt = Field(
        default=1, description="MoE models: each group of this many consecutive replicas of a "
                               "stage splits the experts (Megatron --expert-model-parallel-size); "
                               "it must divide every stage's replica count")
    dynamic_shares: DynamicShares | None = None
    stages: tuple[Stage, ...] = Field(min_length=1)
    predicted: Predicted | None = None
    solver: SolverReport | None = None
    launch: LaunchInfo | None = None

    @model_validator(mode="after")
    def _reshard_needs_zero3(self):
        # FSDP2's reshard_after_forward exists only where the parameters are sharded (ZeRO-3)
        if self.reshard_after_forward is not None and self.zero_stage != 3:
            raise ValueError(f"reshard_after_forward applies only to zero_stage 3 (FSDP2), "
                             f"this plan has zero_stage {self.zero_stage}: remove it")
        return self

    @model_validator(mode="after")
    def _shard_degree_fits(self):
        d = self.zero_shard_degree
        if d is None:
            return self
        if self.zero_stage == 0:
            raise ValueError(f"zero_shard_degree {d} needs zero_stage 1, 2 or 3 (it sizes the ZeRO "
                             "shard groups); this plan has zero_stage 0: remove it")
        if self.expert_parallel > 1:
            # the experts' shards span n/ep replicas (planner.cost.moe); HSDP's groups of those
            # are not modelled
            raise ValueError(f"zero_shard_degree {d} with expert_parallel {self.expert_parallel}: "
                             "HSDP is modelled for dense stages only; remove zero_shard_degree")
        for i, st in enumerate(self.stages):
            if len(st.replicas) % d:
                raise ValueError(f"zero_shard_degree {d} must divide every stage's replica count: "
                                 f"stage {i} has {len(st.replicas)} replicas")
        return self

    @model_validator(mode="after")
    def _devices_match_cp(self):
        cp = self.context_parallel
        for i, st in enumerate(self.stages):
            for j, r in enumerate(st.replicas):
                if len(r.devices) != r.tp * cp:
                    with_cp = f" and context_parallel={cp}" if cp > 1 else ""
                    raise ValueError(f"stages[{i}].replicas[{j}]: a replica with tp={r.tp}{with_cp} "
                                     f"needs {r.tp * cp} devices, got {len(r.devices)}")
        return self

    # -- (de)serialisation ---------------------------------------------------------------
    @classmethod
    def from_json(cls, data: dict, file: str = "<plan>") -> Plan:
        """Validate plan data; problems are ``InputErrors`` naming the field paths."""
        from planner.spec.source import document_from_data, validate_model

        return validate_model(cls, document_from_data(data, file))

    def to_json(self) -> dict:
        return json.loads(self.dumps())

    def dumps(self) -> str:
        """Canonical bytes: sorted keys, so the same plan gives the same file."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        if data.get("context_parallel") == 1:  # plans without CP keep their bytes
            del data["context_parallel"]
        if data.get("expert_parallel") == 1:   # dense plans' bytes stay as before the field
            del data["expert_parallel"]
        return json.dumps(data, sort_keys=True, indent=2) + "\n"

    # -- convenience ---------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def reshards_after_forward(self) -> bool:
        """ZeRO-3's reshard_after_forward, absent meaning FSDP2's default (true)."""
        return self.reshard_after_forward is not False

    def shard_replicas(self, num_replicas: int) -> int:
        """Replicas per ZeRO shard group in a stage of ``num_replicas``: ``zero_shard_degree``
        (HSDP), absent meaning all of them."""
        return num_replicas if self.zero_shard_degree is None else self.zero_shard_degree

    def training_choice(self, name: str):
        """A kernel choice of the training spec (``attention``, ``cross_entropy``, ``elementwise``)
        as the plan was priced with it; an absent key means what it meant when the plan was
        written (planner.spec.training.plan_kernel_choice: attention unfused, the others their
        field's default)."""
        from planner.spec.training import plan_kernel_choice
        return plan_kernel_choice(self.inputs.training or {}, name)

    def devices(self) -> list[str]:
        return [d for s in self.stages for r in s.replicas for d in r.devices]
