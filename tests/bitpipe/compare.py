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
        ev = {s: evaluate(cluster, Plan.from_json(plan_data(s, gbs))) for s in ("1f1b", "interleaved-1f1b", "bitpipe")}
        t = {s: e.iteration_time_s for s, e in ev.items()}
        peak_gib = {s: max(e.peak_memory_bytes.values()) / 2**30 for s, e in ev.items()}
        rows.append({"global_batch": gbs, **t, "over_1f1b": t["1f1b"] / t["bitpipe"],
                     "over_interleaved": t["interleaved-1f1b"] / t["bitpipe"], "peak_gib": peak_gib})
    return rows


def unit_table(cases=((4, 8), (8, 8), (8, 16), (8, 32), (8, 64), (16, 16), (16, 64))) -> list[tuple]:
    """(p, m, 1F1B, interleaved v=2, BitPipe, BitPipe's peak chunk activations) at unit chunk
    times F = 1, B = 2 (a whole stage F = 2, B = 4 for 1F1B: equal work per rank)."""
    from planner.simulate.actions import StageTimes, execute, generate

    chunk, whole = StageTimes(forward_s=1, backward_s=2), StageTimes(forward_s=2, backward_s=4)
    out = []
    for p, m in cases:
        run = execute(generate("bitpipe", p, m), chunk)
        out.append((p, m, execute(generate("1f1b", p, m), whole).makespan_s,
                    execute(generate("interleaved-1f1b", p, m, 2), chunk).makespan_s,
                    run.makespan_s, max(run.peak_in_flight)))
    return out


if __name__ == "__main__":
    for row in unit_table():
        print("p={} m={}: 1f1b {} interleaved {} bitpipe {} (peak {} chunks)".format(*row))
    for r in compare():
        print(f"m={r['global_batch']:3d}  1f1b {r['1f1b']:.3f} s  interleaved {r['interleaved-1f1b']:.3f} s  "
              f"bitpipe {r['bitpipe']:.3f} s  speed-up over 1f1b {r['over_1f1b']:.3f}x, "
              f"over interleaved {r['over_interleaved']:.3f}x; peak GiB "
              + ", ".join(f"{k} {v:.1f}" for k, v in r["peak_gib"].items()))
