"""``planner run PLAN``: train the plan's layout on this machine with the reference runner and
print each step's loss and time."""

from __future__ import annotations

import click

from planner import api
from planner.cli.common import check_writable, console, echo_json, write_atomic


def _slow_ranks(ctx, param, values) -> dict[int, float]:
    out = {}
    for v in values:
        rank, _, factor = v.partition(":")
        try:
            out[int(rank)] = float(factor)
        except ValueError:
            raise click.BadParameter(f"{v!r} is not RANK:FACTOR (e.g. 1:3 makes rank 1 three times slower)") from None
    return out


@click.command()
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--steps", default=3, show_default=True, type=click.IntRange(min=1),
              help="Training steps (one global batch each).")
@click.option("--backend", type=click.Choice(["gloo", "nccl"]), default="gloo", show_default=True,
              help="gloo: CPU processes; nccl: one visible CUDA device per rank.")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Seeds the initial weights and the synthetic token stream.")
@click.option("--tiny", is_flag=True,
              help="Shrink hidden size, heads, FFN and vocabulary (and seq len unless --seq-len), "
                   "keeping the plan's blocks and layout.")
@click.option("--seq-len", type=click.IntRange(min=1), default=None,
              help="Sequence length to train at (default: the plan's).")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True)
@click.option("--optimizer", type=click.Choice(["adam", "sgd"]), default="adam", show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True, help="Learning rate.")
@click.option("--timeout", "timeout_s", type=float, default=600.0, show_default=True,
              help="Seconds before the whole run is stopped.")
@click.option("--measurements", "measurements_file", type=click.Path(dir_okay=False), default=None,
              help="Write per-step, per-replica forward, backward and gradient-sync times here "
                   "(JSON, docs/runner.md); input of `planner rebalance`.")
@click.option("--dynamic-batching", is_flag=True,
              help="Move whole sequences between the replicas of each stage between steps, from "
                   "their measured speed (bounds: the plan's dynamic_shares, or the defaults).")
@click.option("--slow-rank", "slow_ranks", multiple=True, callback=_slow_ranks, metavar="RANK:FACTOR",
              help="Testing aid: make RANK FACTOR times slower (it sleeps after each action).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def run(plan_file: str, steps: int, backend: str, seed: int, tiny: bool, seq_len: int | None,
        dtype: str, optimizer: str, lr: float, timeout_s: float, measurements_file: str | None,
        dynamic_batching: bool, slow_ranks: dict[int, float], as_json: bool) -> None:
    """Train PLAN's stages, replicas, tp shards and schedule on local processes (reference runner)."""
    from planner.api import TINY_MODEL, TINY_SEQ_LEN
    from planner.api import run_settings_for as settings_for

    plan = api.load_plan(plan_file)
    if measurements_file:
        check_writable(measurements_file)
        if plan.training_choice("attention") == "flash":
            # the same maths, another kernel: times measured here are the unfused core's
            click.echo("note: the reference runner computes attention unfused (an explicit softmax); the "
                       "plan priced flash, so the measured times are of the unfused core", err=True)
    dynamic = settings_for(plan) if dynamic_batching else None
    override = dict(TINY_MODEL) if tiny else None
    if tiny and seq_len is None:
        seq_len = TINY_SEQ_LEN
    out = console(quiet=as_json)

    def on_step(step: int, loss: float, step_time_s: float) -> None:
        out.print(f"step {step}: loss {loss:.6f}  time {step_time_s * 1e3:.1f} ms")

    def on_shares(step: int, shares: dict) -> None:
        if dynamic is None:
            return
        by_stage: dict[int, list[int]] = {}
        for (si, _), share in sorted(shares.items()):
            by_stage.setdefault(si, []).append(share)
        out.print("        shares " + "  ".join(f"stage {si}: {'/'.join(map(str, v))}"
                                               for si, v in by_stage.items() if len(v) > 1))

    with out.status(f"starting {len(plan.devices())} processes ({backend}) for {steps} step(s)…"):
        result = api.run(plan, steps=steps, backend=backend, seed=seed, model_override=override,
                          seq_len=seq_len, dtype=dtype, optimizer=optimizer, lr=lr,
                          timeout_s=timeout_s, on_step=on_step, on_shares=on_shares,
                          measure=bool(measurements_file), dynamic=dynamic, slowdown=slow_ranks or None)
    if measurements_file:
        import json

        write_atomic(measurements_file, json.dumps(result.measurements, indent=1) + "\n")
    if as_json:
        echo_json(result.to_json())
        return
    if measurements_file:
        out.print(f"wrote {measurements_file}")
    out.print(f"parameters sha256 {result.param_digest[:16]}…, replicas agree to "
              f"{result.replica_max_abs_diff:.1e}; wall {result.wall_s:.1f} s")
