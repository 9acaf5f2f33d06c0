"""Mixture-of-Experts rows against published measurements: ``python -m planner.cost.fidelity_moe``
(run by ``make fidelity`` after the main table).

The rows (tests/fidelity/moe-megatron-bridge/rows.yaml, written by hand with their source) are
NVIDIA's Megatron-Bridge DGX-H100 throughput for GPT-OSS-120B in bf16 with expert parallelism
8: given to the cost model as stated, nothing fitted. They stay out of ``fidelity.SETS`` (and so
out of validation.yaml and the trust levels): two rows of one model on one machine, with a
stand-in attention (catalog source line) and a recompute mode the model lacks, are a check of
the MoE terms, not a measure of the H100 model's error.

Plan of a row (Megatron's layout): ``pp`` stages of equal blocks, each on ``gpus / pp`` GPUs
packed node by node, ``(gpus / pp) / tp`` replicas of ``tp`` GPUs with the per-replica
micro-batch, ``expert_parallel = ep`` (consecutive replicas, as Megatron groups data-parallel
ranks), ``num_micro_batches = GBS / (MBS x replicas)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SET_DIR = ROOT / "tests" / "fidelity" / "moe-megatron-bridge"
# The recipes' framework facts (rows.yaml): Transformer Engine flash attention, overlapped
# gradient reduction.
CONTEXT = {"flash_attention": True, "grad_reduce_overlap": True}


@dataclass(frozen=True)
class MoeRow:
    id: str
    measured_s: float           # GBS x seq / (tokens/s/GPU x GPUs)
    predicted_s: float
    fits: bool
    peak_gib: float
    ep_comm_s: float
    source_tflops_per_gpu: float    # the source's own model-FLOPs count
    model_tflops_per_gpu: float     # this package's count at the measured time

    @property
    def signed_error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


@cache
def load_rows() -> tuple[dict, ...]:
    import yaml
    doc = yaml.safe_load((SET_DIR / "rows.yaml").read_text(encoding="utf-8"))
    return tuple({**doc["plan_defaults"], **row, "cluster": doc["cluster"]} for row in doc["rows"])


def measured_iteration_s(row: dict) -> float:
    return row["global_batch_size"] * row["seq_len"] / (row["tokens_per_s_per_gpu"] * row["gpus"])


def build_plan(row: dict):
    """The row's plan (module docstring)."""
    from planner.plan import Plan
    from planner.spec import load_model
    model = load_model(row["model"])
    tp, pp, gpus, mbs = row["tp"], row["pp"], row["gpus"], row["micro_batch_size"]
    per_stage = gpus // pp
    dp = per_stage // tp
    blocks = model.num_layers // pp
    stages = []
    for s in range(pp):
        replicas = []
        for r in range(dp):
            first = s * per_stage + r * tp
            replicas.append({"gpu_type": "H100-SXM5-80GB", "tp": tp, "micro_batch_share": mbs,
                             "devices": [f"h100-{(first + t) // 8}:{(first + t) % 8}" for t in range(tp)]})
        stages.append({"index": s, "blocks": [s * blocks, (s + 1) * blocks], "embedding": s == 0,
                       "head": s == pp - 1, "replicas": replicas})
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "dgx-h100-8x8", "model": row["model"],
                   "training": {"global_batch_size": row["global_batch_size"], "seq_len": row["seq_len"],
                                "precision": row["precision"]}},
        "micro_batch_size": mbs * dp, "num_micro_batches": row["global_batch_size"] // (mbs * dp),
        "schedule": row["schedule"], "recompute": row["recompute"], "zero_stage": row["zero_stage"],
        "sequence_parallel": row["sequence_parallel"], "expert_parallel": row["ep"], "stages": stages})


def predict_rows(calibration=None) -> list[MoeRow]:
    from planner.cost.evaluate import evaluate
    from planner.cost.flops import model_flops_per_iteration
    from planner.spec import load_cluster, load_model
    out = []
    for row in load_rows():
        cluster = load_cluster(SET_DIR / row["cluster"])
        plan = build_plan(row)
        ev = evaluate(cluster, plan, calibration=calibration, **CONTEXT)
        measured = measured_iteration_s(row)
        flops = model_flops_per_iteration(load_model(row["model"]), row["global_batch_size"], row["seq_len"])
        out.append(MoeRow(row["id"], measured, ev.iteration_time_s, ev.fits,
                          max(ev.peak_memory_bytes.values()) / 2**30, ev.breakdown_s.get("ep_comm", 0.0),
                          float(row["model_tflops_per_gpu"]), flops / (measured * row["gpus"]) / 1e12))
    return out


def main() -> None:
    rows = predict_rows()
    print("\nMixture-of-Experts rows (tests/fidelity/moe-megatron-bridge: Megatron-Bridge DGX-H100, "
          "not fitted, not in the trust levels)")
    print(f"{'row':28} {'measured s':>10} {'predicted s':>11} {'error':>7} {'ep_comm s':>9} "
          f"{'peak GiB':>8}  TFLOP/s/GPU source / ours")
    for r in rows:
        print(f"{r.id:28} {r.measured_s:10.3f} {r.predicted_s:11.3f} {100 * r.signed_error:+6.1f}% "
              f"{r.ep_comm_s:9.3f} {r.peak_gib:8.1f}{'' if r.fits else ' (over 80)'}  "
              f"{r.source_tflops_per_gpu:.0f} / {r.model_tflops_per_gpu:.0f}")
    print("(negative error: predicted too fast; the source counts fewer model FLOPs than planner.cost.flops, "
          "see rows.yaml; attention is a stand-in, catalog gpt-oss-120b)")


if __name__ == "__main__":
    main()
