"""Predicted BitPipe speed-up over 1F1B and interleaved 1F1B at the BitPipe repository's GPT
example settings (8 pipeline stages, 96 layers, micro-batch 1, fp16, global batch 16) on one
DGX A100 node (cluster_specs/dgx-a100-pod.yaml, node dgx-0), and at larger global batches.

    PYTHONPATH=. python tests/bitpipe/compare.py
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def plan_data(schedule: str, global_batch: int, p: int = 8) -> dict:
    per = 96 // p
    stages = [{"index": i, "blocks": [i * per, (i + 1) * per], "embedding": i == 0, "head": i == p - 1,
               "replicas": [{"gpu_type": "A100-SXM4-80GB", "tp": 1, "micro_batch_share": 1,
                             "devices": [f"dgx-0:{i}"]}]} for i in range(p)]
    return {"schema": "planner.plan/v1",
            "inputs": {"cluster": "dgx-a100-pod", "model": str(HERE / "gpt-96l-3072h.yaml"),
                       "training": {"global_batch_size": global_batch, "seq_len": 1024, "precision": "fp16"}},
            "micro_batch_size": 1, "num_micro_batches": global_batch, "schedule": schedule,
            "virtual_stages": 2 if schedule == "interleaved-1f1b" else 1, "stages": stages}


def compare(global_batches=(16, 32, 64)) -> list[dict]:
    from planner.cost import evaluate
    from planner.plan import Plan
    from planner.spec import load_cluster

    cluster = load_cluster(ROOT / "cluster_specs" / "dgx-a100-pod.yaml")
    rows = []
    for gbs in global_batches:
        t = {s: evaluate(cluster, Plan.from_json(plan_data(s, gbs))).iteration_time_s
             for s in ("1f1b", "interleaved-1f1b", "bitpipe")}
        rows.append({"global_batch": gbs, **t, "over_1f1b": t["1f1b"] / t["bitpipe"],
                     "over_interleaved": t["interleaved-1f1b"] / t["bitpipe"]})
    return rows


if __name__ == "__main__":
    for r in compare():
        print(f"m={r['global_batch']:3d}  1f1b {r['1f1b']:.3f} s  interleaved {r['interleaved-1f1b']:.3f} s  "
              f"bitpipe {r['bitpipe']:.3f} s  speed-up over 1f1b {r['over_1f1b']:.3f}x, "
              f"over interleaved {r['over_interleaved']:.3f}x")
