"""The figures of docs/schedules.md: every schedule at unit times (p = 4, m = 8) on the
action-list executor, and the planner's predicted speed-up over 1F1B on a realistic plan
(Llama-3-8B on cluster_specs/dgx-a100-pod.yaml, four stages of eight blocks, four tp-8
replicas each).  Run from the repository root: ``python scripts/schedule_figures.py``."""

from __future__ import annotations

from planner.cost import evaluate
from planner.plan import Plan
from planner.simulate.actions import StageTimes, execute, generate
from planner.spec import load_cluster

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zb-v", 2), ("dualpipev", 2))


def unit_table(p: int = 4, m: int = 8) -> None:
    print(f"p = {p}, m = {m}; a rank's F = I = W = 1 (B = 2), a chunk 1/v of it; work per rank {3 * m}")
    print("| schedule | makespan | bubble | bubble fraction | peak in flight per rank (whole stages) |")
    print("|---|---:|---:|---:|---|")
    for name, v in SCHEDULES:
        run = execute(generate(name, p, m, v), StageTimes(1 / v, 1 / v, 1 / v))
        peak = ", ".join(f"{x / v:g}" for x in run.peak_in_flight)
        print(f"| {name} | {run.makespan_s:g} | {run.makespan_s - 3 * m:g} | {run.bubble_fraction:.1%} | {peak} |")


def _plan(schedule: str, m: int, v: int, p: int = 4, d: int = 4) -> Plan:
    stages = [{"index": s, "blocks": [8 * s, 8 * s + 8], "embedding": s == 0, "head": s == p - 1,
               "replicas": [{"gpu_type": "A100-SXM4-80GB", "tp": 8, "micro_batch_share": 1,
                             "devices": [f"dgx-{s * d + r}:{g}" for g in range(8)]} for r in range(d)]}
              for s in range(p)]
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "dgx-a100-pod", "model": "llama3-8b",
                   "training": {"global_batch_size": d * m, "seq_len": 4096, "precision": "bf16"}},
        "micro_batch_size": d, "num_micro_batches": m, "schedule": schedule, "virtual_stages": v,
        "recompute": "none", "zero_stage": 1, "sequence_parallel": True, "stages": stages})


def realistic_table(micro_batches=(8, 16, 32)) -> None:
    cluster = load_cluster("cluster_specs/dgx-a100-pod.yaml")
    print("| m | schedule | pipeline s | iteration s | speed-up over 1f1b | peak GiB (max over GPUs) |")
    print("|---:|---|---:|---:|---:|---:|")
    for m in micro_batches:
        base = None
        for name, v in SCHEDULES[1:]:
            ev = evaluate(cluster, _plan(name, m, v))
            base = base or ev.iteration_time_s
            peak = max(ev.peak_memory_bytes.values()) / 2**30
            print(f"| {m} | {name} | {ev.pipeline_time_s:.4f} | {ev.iteration_time_s:.4f} | "
                  f"{base / ev.iteration_time_s:.3f} | {peak:.2f} |")


if __name__ == "__main__":
    unit_table()
    print()
    realistic_table()
