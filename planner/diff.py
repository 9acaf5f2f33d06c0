"""What changed between two plans (``planner diff A.json B.json``): the global settings
(degrees, schedule, micro-batches, recompute, ZeRO), each stage (blocks, GPUs, TP, replicas,
shares, devices), which devices joined, left or changed stage, and the predictions.  Stages
are matched by index; a stage only one plan has is listed with the other side empty."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.plan import Plan
from planner.spec.training import KERNEL_CHOICES

SETTINGS = ("micro_batch_size", "num_micro_batches", "schedule", "virtual_stages", "recompute",
            "zero_stage", "reshard_after_forward", "zero_shard_degree", "sequence_parallel", "context_parallel")
PREDICTED = ("iteration_time_s", "tokens_per_s", "samples_per_s", "mfu", "usd_per_hour", "usd_per_million_tokens")


@dataclass
class PlanDiff:
    settings: list[dict] = field(default_factory=list)      # {field, a, b}
    stages: list[dict] = field(default_factory=list)        # {stage, field, a, b}
    devices_added: list[str] = field(default_factory=list)
    devices_removed: list[str] = field(default_factory=list)
    devices_moved: list[dict] = field(default_factory=list)  # {device, a, b}: stage in each
    predicted: list[dict] = field(default_factory=list)     # {field, a, b, ratio}

    @property
    def same(self) -> bool:
        """No change in the layout, settings or predictions."""
        return not (self.settings or self.stages or self.devices_added or self.devices_removed
                    or self.devices_moved or any(r["a"] != r["b"] for r in self.predicted))

    def as_dict(self) -> dict:
        return {"same": self.same, "settings": self.settings, "stages": self.stages,
                "devices_added": self.devices_added, "devices_removed": self.devices_removed,
                "devices_moved": self.devices_moved, "predicted": self.predicted}


def degrees(plan: Plan) -> dict:
    """Pipeline stages, and per stage the TP degrees and replica counts (data parallelism)."""
    return {"pipeline_stages": len(plan.stages),
            "tp_per_stage": [sorted({r.tp for r in s.replicas}) for s in plan.stages],
            "replicas_per_stage": [len(s.replicas) for s in plan.stages],
            "gpus": len(plan.devices())}


def _stage_fields(stage) -> dict:
    return {"blocks": list(stage.blocks), "embedding": stage.embedding, "head": stage.head,
            "gpu_types": sorted({r.gpu_type for r in stage.replicas}),
            "tp": [r.tp for r in stage.replicas], "replicas": len(stage.replicas),
            "micro_batch_shares": [r.micro_batch_share for r in stage.replicas],
            "devices": [list(r.devices) for r in stage.replicas]}


def _stage_of(plan: Plan) -> dict[str, int]:
    return {d: s.index for s in plan.stages for r in s.replicas for d in r.devices}


def diff_plans(a: Plan, b: Plan) -> PlanDiff:
    out = PlanDiff()
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
    sa, sb = _stage_of(a), _stage_of(b)
    out.devices_added = sorted(set(sb) - set(sa))
    out.devices_removed = sorted(set(sa) - set(sb))
    out.devices_moved = [{"device": d, "a": sa[d], "b": sb[d]} for d in sorted(set(sa) & set(sb)) if sa[d] != sb[d]]
    pa = a.predicted.model_dump() if a.predicted else {}
    pb = b.predicted.model_dump() if b.predicted else {}
    for k in PREDICTED:
        va, vb = pa.get(k), pb.get(k)
        if va is None and vb is None:
            continue
        ratio = vb / va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va else None
        out.predicted.append({"field": k, "a": va, "b": vb, "ratio": ratio})
    return out
