"""``planner rebalance CLUSTER PLAN --measurements FILE -o NEW.json``: new micro-batch shares
on the same devices from a run's measured times (``planner.rebalance``); with ``--blocks`` the
block split between the pipeline stages first (``planner.rebalance_blocks``)."""

from __future__ import annotations

import click

from planner.cli.common import check_writable, console, echo_json, write_atomic


@click.command()
@click.argument("cluster_file", metavar="CLUSTER", type=click.Path(dir_okay=False))
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--measurements", "measurements_file", required=True, type=click.Path(dir_okay=False),
              help="The file `planner run PLAN --measurements FILE` wrote.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the rebalanced plan here.")
@click.option("--blocks", is_flag=True,
              help="Also re-solve the contiguous block split over the same stages (1f1b, interleaved-1f1b).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def rebalance(cluster_file, plan_file, measurements_file, output, blocks, as_json):
    """Re-solve PLAN's micro-batch shares from measured per-replica speeds, same devices and
    stages, and report the predicted step time; with --blocks, the block split first (measured
    time per block per replica, every split or the closed form's DP optimum priced by the
    schedule's action-list executor, memory checked). Exit 2 for bad input (measurements of
    another plan, a replica missing or twice in a step, a time that is not positive or longer
    than its step, shares not adding up to the micro-batch, --blocks on a one-stage plan or
    another schedule). The written plan has no predicted or solver block (both were for the
    old shares); `planner evaluate` predicts it."""
    from planner import api

    if output:
        check_writable(output)
    cluster = api.load_cluster(cluster_file)
    plan = api.load_plan(plan_file)
    result, new = api.rebalance(cluster, plan, measurements_file, file=plan_file, blocks=blocks)
    if output:
        write_atomic(output, new.dumps())
    summary = {
        "shares": {f"{s}/{r}": v for (s, r), v in sorted(result.shares.items())},
        "old_shares": {f"{s}/{r}": v for (s, r), v in sorted(result.old_shares.items())},
        # share x num_micro_batches sequences a step (ReplicaSpeed.sequences_per_s)
        "sequences_per_s": {f"{s}/{r}": sp.sequences_per_s for (s, r), sp in sorted(result.speeds.items())},
        "fixed_s": {f"{s}/{r}": sp.fixed_s for (s, r), sp in sorted(result.speeds.items())},
        "measured_step_s": result.measured_step_s,
        "predicted_step_s": result.predicted_step_s,
        "predicted_old_step_s": result.predicted_old_step_s,
        "predicted_gain": result.predicted_gain,
    }
    if blocks:
        summary["blocks"] = {
            "old": [list(b) for b in result.old_blocks], "new": [list(b) for b in result.blocks],
            "moved": result.moved,
            "per_block_s": {f"{s}/{r}": ln.per_block_s for (s, r), ln in sorted(result.lines.items())},
            "predicted_shares_only_step_s": result.predicted_shares_step_s,
        }
    if as_json:
        echo_json(summary)
        return
    out = console()
    if blocks:
        per_block = ", ".join(f"{s}/{r} {ln.per_block_s * 1e3:.2f}" for (s, r), ln in sorted(result.lines.items()))
        old = " ".join(f"[{a},{b})" for a, b in result.old_blocks)
        split = " ".join(f"[{a},{b})" for a, b in result.blocks)
        out.print(f"blocks: {old} -> {split}{'' if result.moved else ' (kept: no split is faster)'}  "
                  f"(measured ms per block per micro-batch: {per_block})")
        out.print(f"step time: measured median {result.measured_step_s * 1e3:.1f} ms; predicted "
                  f"{result.predicted_old_step_s * 1e3:.1f} ms as planned, "
                  f"{result.predicted_shares_step_s * 1e3:.1f} ms with new shares only, "
                  f"{result.predicted_step_s * 1e3:.1f} ms with the new split and shares "
                  f"(predicted gain {result.predicted_gain:.2f}x over the measured median)")
    for s in plan.stages:
        if len(s.replicas) < 2:
            continue
        keys = [(s.index, j) for j in range(len(s.replicas))]
        speeds = ", ".join(f"{result.speeds[k].sequences_per_s:.1f}" for k in keys)
        out.print(f"stage {s.index}: shares {'/'.join(str(result.old_shares[k]) for k in keys)} -> "
                  f"{'/'.join(str(result.shares[k]) for k in keys)}  (measured sequences/s: {speeds})")
    if not blocks:
        out.print(f"step time: measured median {result.measured_step_s * 1e3:.1f} ms, predicted "
                  f"{result.predicted_step_s * 1e3:.1f} ms with the new shares "
                  f"({result.predicted_gain:.2f}x)")
    if output:
        out.print(f"wrote {output}")
