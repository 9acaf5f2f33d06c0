"""Dynamic-batching benchmark (issue 21): ``python -m planner.bench_dynamic [--steps N] [--json]``.

On this CPU, data-parallel plans of 2 and 3 replicas (one process each, gloo) where the last
replica is made ``--factor`` times slower in a controlled way (it sleeps ``factor - 1`` times
each action's compute time, ``planner run --slow-rank``). For each:

- static: equal shares for all steps;
- dynamic: the same plan with ``--dynamic-batching`` from equal shares; its measurements go to
  ``planner rebalance``;
- rebalanced: the plan ``rebalance`` wrote, run static, against the step time it predicted.

Reported: median step time of each (the dynamic run's over its second half, after the
controller settled), static / dynamic, the steps until the shares stayed within one sequence
of their final value, and rebalance's predicted vs measured step time. A benchmark, not a
test: timings on a shared machine vary from run to run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

GPU = "A100-SXM4-80GB"  # the runner trains on the CPU whatever the plan's GPU type says
MODEL = {"name": "bench-dyn", "num_layers": 2, "hidden_size": 192, "num_attention_heads": 4,
         "vocab_size": 256}
SEQ_LEN = 64
MICRO_BATCH = 12


def make_plan(replicas: int):
    from planner.launch.dynamic import largest_remainder
    from planner.plan import Plan

    shares = largest_remainder([MICRO_BATCH / replicas] * replicas, MICRO_BATCH, 1)
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "local", "model": MODEL,
                   "training": {"global_batch_size": 2 * MICRO_BATCH, "seq_len": SEQ_LEN}},
        "micro_batch_size": MICRO_BATCH, "num_micro_batches": 2, "schedule": "1f1b",
        "stages": [{"index": 0, "blocks": [0, 2], "embedding": True, "head": True, "replicas": [
            {"gpu_type": GPU, "tp": 1, "micro_batch_share": s, "devices": [f"a:{j}"]}
            for j, s in enumerate(shares)]}]})


def _median_after(times: list[float], skip: int) -> float:
    return statistics.median(times[skip:])


def settled_at(history: list[list[int]]) -> int:
    """The first step from which every share stays within one sequence of its final value."""
    final = history[-1]
    for i in range(len(history)):
        if all(all(abs(a - b) <= 1 for a, b in zip(h, final)) for h in history[i:]):
            return i
    return len(history)


def bench_one(replicas: int, steps: int, factor: float) -> dict:
    from planner.launch.dynamic_run import settings_for
    from planner.launch.measurements import load
    from planner.launch.runner import run_plan
    from planner.rebalance import rebalance, rebalanced_plan

    plan = make_plan(replicas)
    slow = {replicas - 1: factor}
    static = run_plan(plan, steps=steps, slowdown=slow, measure=True)
    history: list[list[int]] = []
    dyn = run_plan(plan, steps=steps, slowdown=slow, dynamic=settings_for(plan), on_step=lambda *a: None,
                   on_shares=lambda step, sh: history.append([sh[k] for k in sorted(sh)]))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.json"
        # the dynamic run's measurements: its shares varied, so each replica's fixed cost per
        # step can be told from its cost per sequence (a static run's cannot)
        path.write_text(json.dumps(dyn.measurements))
        doc, times = load(str(path), plan)
    reb = rebalance(plan, times, [s["step_time_s"] for s in doc["steps"]])
    new_plan = rebalanced_plan(plan, reb)
    rerun = run_plan(new_plan, steps=steps, slowdown=slow)
    static_s = _median_after(static.step_time_s, 1)
    dynamic_s = _median_after(dyn.step_time_s, steps // 2)
    rebalanced_s = _median_after(rerun.step_time_s, 1)
    return {
        "replicas": replicas, "slow_factor": factor, "steps": steps,
        "static_median_s": static_s, "dynamic_median_s": dynamic_s,
        "static_over_dynamic": static_s / dynamic_s,
        "dynamic_shares": history, "shares_settled_at_step": settled_at(history),
        "rebalance_shares": [reb.shares[k] for k in sorted(reb.shares)],
        "rebalance_predicted_s": reb.predicted_step_s, "rebalanced_measured_s": rebalanced_s,
        "prediction_error": reb.predicted_step_s / rebalanced_s - 1.0,
    }


def format_row(r: dict) -> str:
    return (f"{r['replicas']} replicas, last {r['slow_factor']:g}x slower: static {r['static_median_s'] * 1e3:.1f} ms, "
            f"dynamic {r['dynamic_median_s'] * 1e3:.1f} ms (x{r['static_over_dynamic']:.2f}); shares "
            f"{'/'.join(map(str, r['dynamic_shares'][0]))} -> {'/'.join(map(str, r['dynamic_shares'][-1]))}, "
            f"settled at step {r['shares_settled_at_step']}; rebalance {'/'.join(map(str, r['rebalance_shares']))} "
            f"predicted {r['rebalance_predicted_s'] * 1e3:.1f} ms, measured {r['rebalanced_measured_s'] * 1e3:.1f} ms "
            f"({100 * r['prediction_error']:+.0f}%)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.bench_dynamic", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--factor", type=float, default=3.0, help="how much slower the last replica is")
    ap.add_argument("--replicas", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for n in args.replicas:
        rows.append(bench_one(n, args.steps, args.factor))
        if not args.json:
            print(format_row(rows[-1]), flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
