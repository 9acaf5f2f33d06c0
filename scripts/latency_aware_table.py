"""The figures of docs/schedules.md "Latency-aware (CrossPipe)": predicted speed-up of the
latency-aware schedule over 1F1B on two-datacenter plans, and greedy-vs-exact gaps.

    PYTHONPATH=. python scripts/latency_aware_table.py [--quick]

Plans: p one-GPU stages (A100-80GB, tp 1), the first p/2 in datacenter A and the rest in B,
joined by a link of the given latency and 25 Gbit/s; intra-DC 100 Gbit/s NICs.  Micro-batch
1 x 2048 tokens, bf16.  Memory cap min(m, p) micro-batches per rank (1F1B's peak over ranks).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

CLUSTER = """
name: two-dc-{p}
zones:
  - {{name: dc-a, region: r1}}
  - {{name: dc-b, region: r2}}
nodes:
  - {{name: a, count: {half}, zone: dc-a, gpu: A100-SXM4-80GB, gpus_per_node: 1, network_bandwidth: 100 Gbit/s}}
  - {{name: b, count: {half}, zone: dc-b, gpu: A100-SXM4-80GB, gpus_per_node: 1, network_bandwidth: 100 Gbit/s}}
links:
  - between: [dc-a, dc-b]
    bandwidth: 25 Gbit/s
    latency: {latency_ms} ms
"""


def _plan(model: str, layers: int, p: int, m: int) -> dict:
    half = p // 2
    devices = [f"a-{i}:0" for i in range(half)] + [f"b-{i}:0" for i in range(half)]
    per = layers // p
    return {
        "schema": "planner.plan/v1",
        "inputs": {"cluster": f"two-dc-{p}", "model": model,
                   "training": {"global_batch_size": m, "seq_len": 2048, "precision": "bf16"}},
        "micro_batch_size": 1, "num_micro_batches": m, "schedule": "1f1b", "recompute": "full",
        "stages": [{"index": i, "blocks": [per * i, per * (i + 1) if i < p - 1 else layers],
                    "embedding": i == 0, "head": i == p - 1,
                    "replicas": [{"gpu_type": "A100-SXM4-80GB", "tp": 1, "micro_batch_share": 1,
                                  "devices": [d]}]} for i, d in enumerate(devices)]}


def speedups(quick: bool) -> list[dict]:
    from planner import api
    from planner.plan.check import plan_from_data
    from planner.simulate.latency_greedy import greedy
    from planner.spec import load_cluster

    rows = []
    settings = [("megatron-gpt-1.7b", 24, 4), ("megatron-gpt-7.5b", 36, 4), ("llama2-7b", 32, 8)]
    if quick:
        settings = settings[:1]
    with tempfile.TemporaryDirectory() as tmp:
        for model, layers, p in settings:
            for m in (2 * p, 4 * p):
                for latency_ms in (30, 50, 100):
                    path = Path(tmp) / f"c{p}-{latency_ms}.yaml"
                    path.write_text(CLUSTER.format(p=p, half=p // 2, latency_ms=latency_ms))
                    cluster = load_cluster(path)
                    plan = plan_from_data(_plan(model, layers, p, m))
                    t0 = time.monotonic()
                    res = api.latency_schedule(cluster, plan)
                    # stricter: each rank no more than under 1F1B (p - r), not just the max over ranks
                    strict = greedy(dataclasses.replace(res.problem, memory_cap=tuple(
                        min(m, p - r) for r in range(p)))).makespan_s
                    rows.append({
                        "model": model, "p": p, "m": m, "latency_ms": latency_ms,
                        "f_ms": 1e3 * res.before.stages[1].forward_s,
                        "send_ms": 1e3 * res.before.stages[p // 2 - 1].send_forward_s,
                        "one_f_one_b_s": res.before.pipeline_time_s,
                        "one_f_one_b_nonblocking_s": res.before_retimed_s,
                        "latency_aware_s": res.after.pipeline_time_s,
                        "rule": res.greedy_rule,
                        "latency_aware_per_rank_cap_s": strict,
                        "less_time_per_rank_cap_vs_1f1b": 1 - strict / res.before.pipeline_time_s,
                        "less_time_vs_1f1b": 1 - res.after.pipeline_time_s / res.before.pipeline_time_s,
                        "less_time_vs_1f1b_nonblocking": 1 - res.after.pipeline_time_s / res.before_retimed_s,
                        "iteration_speedup": res.before.iteration_time_s / res.after.iteration_time_s,
                        "fits": res.after.fits, "wall_s": time.monotonic() - t0})
    return rows


def plan_gaps(quick: bool) -> list[dict]:
    """Greedy against the MILP on the two-datacenter plans where the MILP reaches (p = 4, m <= 6)."""
    from planner import api
    from planner.plan.check import plan_from_data
    from planner.spec import load_cluster

    rows = []
    models = [("megatron-gpt-1.7b", 24), ("megatron-gpt-7.5b", 36)][: 1 if quick else 2]
    with tempfile.TemporaryDirectory() as tmp:
        for model, layers in models:
            for m in (4, 6):
                for latency_ms in (30, 100):
                    path = Path(tmp) / f"c{latency_ms}.yaml"
                    path.write_text(CLUSTER.format(p=4, half=2, latency_ms=latency_ms))
                    res = api.latency_schedule(load_cluster(path), plan_from_data(_plan(model, layers, 4, m)),
                                               exact=True, time_limit_s=120)
                    rows.append({"model": model, "p": 4, "m": m, "latency_ms": latency_ms,
                                 "greedy_s": res.greedy_s, "rule": res.greedy_rule, "exact_s": res.exact.makespan_s,
                                 "bound_s": res.exact.bound_s, "status": res.exact.status, "gap": res.gap,
                                 "solver_wall_s": res.exact.wall_s, "one_f_one_b_s": res.before.pipeline_time_s})
    return rows


def gaps(quick: bool) -> dict:
    from planner.simulate.actions import StageTimes
    from planner.simulate.latency import make_problem
    from planner.simulate.latency_gap import greedy_gap

    rng = random.Random(2025)
    out = []
    n = 6 if quick else 30
    for _ in range(n):
        p, m = rng.randint(2, 4), rng.randint(2, 6)
        # a 30-100 ms link at a random boundary, compute per stage 20-80 ms, W 30-50% of B
        cut = rng.randrange(p - 1)
        lat = [0.0005] * (p - 1)
        lat[cut] = rng.uniform(0.03, 0.1)
        sts = []
        for s in range(p):
            f = rng.uniform(0.02, 0.08)
            b = 2 * f * rng.uniform(0.9, 1.1)
            w = b * rng.uniform(0.3, 0.5)
            # a send is its boundary's latency plus a 1-10 ms transfer
            fwd = lat[s] + rng.uniform(0.001, 0.01) if s < p - 1 else 0.0
            bwd = lat[s - 1] + rng.uniform(0.001, 0.01) if s > 0 else 0.0
            sts.append(StageTimes(f, b - w, w, send_forward_s=fwd, send_backward_s=bwd))
        prob = make_problem(sts, m, lat, rng.randint(1, min(m, p)))
        g = greedy_gap(prob, time_limit_s=60)
        out.append({"p": p, "m": m, "cap": prob.memory_cap[0], **g.to_json()})
    proved = [r for r in out if r["status"] == "optimal"]
    gaps_ = [r["gap"] for r in out]
    return {"cases": out, "n": len(out), "proved_optimal": len(proved),
            "gap_mean": statistics.fmean(gaps_), "gap_max": max(gaps_),
            "greedy_optimal": sum(1 for r in out if r["gap"] <= 1e-9),
            "solver_wall_max_s": max(r["solver_wall_s"] for r in out)}


def scale() -> dict:
    from planner.simulate.actions import StageTimes
    from planner.simulate.latency import make_problem
    from planner.simulate.latency_greedy import greedy

    # 64 equal stages (F = I = W = 50 ms), a 50 ms link in the middle, 0.5 ms elsewhere, 1.5 ms
    # transfers
    lat = [0.0005] * 63
    lat[31] = 0.05
    st = [StageTimes(0.05, 0.05, 0.05, send_forward_s=lat[i] + 0.0015 if i < 63 else 0.0,
                     send_backward_s=lat[i - 1] + 0.0015 if i > 0 else 0.0) for i in range(64)]
    prob = make_problem(st, 256, lat)
    t0, c0 = time.monotonic(), time.process_time()
    g = greedy(prob)
    return {"p": 64, "m": 256, "greedy_wall_s": time.monotonic() - t0, "greedy_cpu_s": time.process_time() - c0,
            "makespan_s": g.makespan_s, "rule": g.rule, "by_rule_s": g.by_rule_s}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    result = {"speedups": speedups(args.quick), "gaps": gaps(args.quick), "plan_gaps": plan_gaps(args.quick),
              "scale": scale()}
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
