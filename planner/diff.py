"""What changed between two plans (``planner diff A.json B.json``): first the inputs each plan
was made for (model, training settings, cluster), then the global settings (degrees, schedule,
micro-batches, recompute, ZeRO), each stage (blocks, GPUs, TP, replicas, shares, devices),
which devices joined, left or changed stage, and the predictions.  Stages are matched by index;
a stage only one plan has is listed with the other side empty.  Plans for different jobs
(another model, sequence length, global batch or precision) still get their predictions'
ratios, with a warning that those compare different jobs, not two layouts of one."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner import catalog
from planner.plan import Plan
from planner.spec.training import KERNEL_CHOICES

SETTINGS = ("micro_batch_size", "num_micro_batches", "schedule", "virtual_stages", "recompute",
            "zero_stage", "reshard_after_forward", "zero_shard_degree", "sequence_parallel", "context_parallel")
# inputs.training keys that define the job: with any of them changed, a prediction's ratio mixes
# the layout's effect with the job's.  The other keys are the search's freedoms.
JOB_TRAINING = ("global_batch_size", "seq_len", "precision")
PREDICTED = ("iteration_time_s", "tokens_per_s", "samples_per_s", "mfu", "usd_per_hour", "usd_per_million_tokens")


@dataclass
class PlanDiff:
    inputs: list[dict] = field(default_factory=list)        # {field, a, b}: "model", "training.seq_len"...
    settings: list[dict] = field(default_factory=list)      # {field, a, b}
    stages: list[dict] = field(default_factory=list)        # {stage, field, a, b}
    devices_added: list[str] = field(default_factory=list)
    devices_removed: list[str] = field(default_factory=list)
    devices_moved: list[dict] = field(default_factory=list)  # {device, a, b}: stage in each
    predicted: list[dict] = field(default_factory=list)     # {field, a, b, ratio}

    @property
    def same(self) -> bool:
        """No change in the inputs, layout, settings or predictions."""
        return not (self.inputs or self.settings or self.stages or self.devices_added or self.devices_removed
                    or self.devices_moved or any(r["a"] != r["b"] for r in self.predicted))

    @property
    def job_changes(self) -> list[str]:
        """The inputs that make A and B different jobs (model, JOB_TRAINING), in row order."""
        job = {"model", *(f"training.{k}" for k in JOB_TRAINING)}
        return [r["field"] for r in self.inputs if r["field"] in job or r["field"].startswith("model.")]

    @property
    def comparable(self) -> bool:
        """Whether the predictions' ratios compare two layouts of one job."""
        return not self.job_changes

    def warnings(self) -> list[str]:
        if self.comparable:
            return []
        return [(f"the plans are for different jobs ({', '.join(self.job_changes)} differ): the predicted "
                 "time, throughput and cost ratios compare different jobs, not two layouts of one")]

    def as_dict(self) -> dict:
        return {"same": self.same, "comparable": self.comparable, "warnings": self.warnings(),
                "inputs": self.inputs, "settings": self.settings, "stages": self.stages,
                "devices_added": self.devices_added, "devices_removed": self.devices_removed,
                "devices_moved": self.devices_moved, "predicted": self.predicted}


def degrees(plan: Plan) -> dict:
    """Pipeline stages, and per stage the TP degrees and replica counts (data parallelism)."""
    return {"pipeline_stages": len(plan.stages),
            "tp_per_stage": [sorted({r.tp for r in s.replicas}) for s in plan.stages],
            "replicas_per_stage": [len(s.replicas) for s in plan.stages],
            "gpus": len(plan.devices())}


def _model_name(model: dict | str) -> str | None:
    return model if isinstance(model, str) else model.get("name")


def _model_mapping(model: dict | str) -> dict | None:
    """The model's mapping: a catalog name resolved as the planner loads it (``load_model``),
    written out as a plan writes a model; None for a name the catalog does not know."""
    if isinstance(model, dict) and set(model) == {"name"}:
        model = model["name"]   # load_model reads a mapping of a name alone as that name
    if not isinstance(model, str):
        return model
    found = catalog.find_model(model)
    return None if found is None else found.to_mapping()


def _model_rows(a: dict | str, b: dict | str) -> list[tuple]:
    """The model by name; under one name (an edited model file, or a catalog name against a
    mapping), the fields that differ.  A name the catalog does not know is never the same as a
    mapping: the row then shows both as written."""
    if _model_name(a) != _model_name(b):
        return [("model", _model_name(a), _model_name(b))]
    if a == b:
        return []
    ma, mb = _model_mapping(a), _model_mapping(b)
    if ma is None or mb is None:
        return [("model", a, b)]
    return [(f"model.{k}", ma.get(k), mb.get(k)) for k in sorted(ma.keys() | mb.keys())]


def input_rows(a: Plan, b: Plan) -> list[dict]:
    """What each plan was made for, where it differs: model, ``inputs.training``, cluster.
    ``inputs.profiles`` is left out: which cost entries were measured follows from the layout
    and the profile files, not from the job."""
    ia, ib = a.inputs, b.inputs
    rows = _model_rows(ia.model, ib.model)
    # the kernel choices are settings rows, read with their absent-key meaning (training_choice)
    rows += [(f"training.{k}", ia.training.get(k), ib.training.get(k))
             for k in sorted(ia.training.keys() | ib.training.keys()) if k not in KERNEL_CHOICES]
    rows.append(("cluster", ia.cluster, ib.cluster))
    # a plan from before fingerprints has none: that is no evidence the spec changed
    if ia.cluster_sha256 and ib.cluster_sha256:
        rows.append(("cluster_sha256", ia.cluster_sha256, ib.cluster_sha256))
    return [{"field": k, "a": va, "b": vb} for k, va, vb in rows if va != vb]


def _stage_fields(stage) -> dict:
    return {"blocks": list(stage.blocks), "embedding": stage.embedding, "head": stage.head,
            "gpu_types": sorted({r.gpu_type for r in stage.replicas}),
            "tp": [r.tp for r in stage.replicas], "replicas": len(stage.replicas),
            "micro_batch_shares": [r.micro_batch_share for r in stage.replicas],
            "devices": [list(r.devices) for r in stage.replicas]}


def _stage_of(plan: Plan) -> dict[str, int]:
    return {d: s.index for s in plan.stages for r in s.replicas for d in r.devices}


@dataclass(frozen=True)
class DeviceChanges:
    """How each device's stage changed from plan A to plan B.  One meaning for `planner diff`
    and `planner replan` (which counted a device new to B as moved): a device moved when it
    serves a stage in both plans, another one in B; added or removed when only one plan has it."""

    kept: list[str]          # the same stage in both
    moved: list[dict]        # {device, a, b}: its stage in each
    added: list[str]         # only in B
    removed: list[str]       # only in A


def device_changes(a: Plan, b: Plan) -> DeviceChanges:
    sa, sb = _stage_of(a), _stage_of(b)
    both = sorted(set(sa) & set(sb))
    return DeviceChanges(kept=[d for d in both if sa[d] == sb[d]],
                         moved=[{"device": d, "a": sa[d], "b": sb[d]} for d in both if sa[d] != sb[d]],
                         added=sorted(set(sb) - set(sa)), removed=sorted(set(sa) - set(sb)))


def diff_plans(a: Plan, b: Plan) -> PlanDiff:
    out = PlanDiff(inputs=input_rows(a, b))
    rows = [(k, getattr(a, k), getattr(b, k)) for k in SETTINGS]
    # the kernels as each plan was priced (an old plan without the attention key: unfused)
    rows += [(k, a.training_choice(k), b.training_choice(k)) for k in KERNEL_CHOICES]
    rows.append(("objective", a.objective.model_dump(), b.objective.model_dump()))
    rows += [(k, v, degrees(b)[k]) for k, v in degrees(a).items()]
    out.settings = [{"field": k, "a": va, "b": vb} for k, va, vb in rows if va != vb]
    for i in range(max(len(a.stages), len(b.stages))):
        fa = _stage_fields(a.stages[i]) if i < len(a.stages) else {}
        fb = _stage_fields(b.stages[i]) if i < len(b.stages) else {}
        for k in fa.keys() | fb.keys():
            if fa.get(k) != fb.get(k):
                out.stages.append({"stage": i, "field": k, "a": fa.get(k), "b": fb.get(k)})
    out.stages.sort(key=lambda r: (r["stage"], list(_stage_fields(a.stages[0])).index(r["field"])))
    devices = device_changes(a, b)
    out.devices_added, out.devices_removed, out.devices_moved = devices.added, devices.removed, devices.moved
    pa = a.predicted.model_dump() if a.predicted else {}
    pb = b.predicted.model_dump() if b.predicted else {}
    for k in PREDICTED:
        va, vb = pa.get(k), pb.get(k)
        if va is None and vb is None:
            continue
        ratio = vb / va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va else None
        out.predicted.append({"field": k, "a": va, "b": vb, "ratio": ratio})
    return out
