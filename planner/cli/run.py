"""``planner run PLAN``: train the plan's layout on this machine with the reference runner and
print each step's loss and time."""

from __future__ import annotations

import click

from planner import api
from planner.cli.common import console, echo_json


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
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def run(plan_file: str, steps: int, backend: str, seed: int, tiny: bool, seq_len: int | None,
        dtype: str, optimizer: str, lr: float, timeout_s: float, as_json: bool) -> None:
    """Train PLAN's stages, replicas, tp shards and schedule on local processes (reference runner)."""
    from planner.api import TINY_MODEL, TINY_SEQ_LEN

    plan = api.load_plan(plan_file)
    override = dict(TINY_MODEL) if tiny else None
    if tiny and seq_len is None:
        seq_len = TINY_SEQ_LEN
    out = console(quiet=as_json)

    def on_step(step: int, loss: float, step_time_s: float) -> None:
        out.print(f"step {step}: loss {loss:.6f}  time {step_time_s * 1e3:.1f} ms")

    with out.status(f"starting {len(plan.devices())} processes ({backend}) for {steps} step(s)…"):
        result = api.run(plan, steps=steps, backend=backend, seed=seed, model_override=override,
                          seq_len=seq_len, dtype=dtype, optimizer=optimizer, lr=lr,
                          timeout_s=timeout_s, on_step=on_step)
    if as_json:
        echo_json(result.to_json())
        return
    out.print(f"parameters sha256 {result.param_digest[:16]}…, replicas agree to "
              f"{result.replica_max_abs_diff:.1e}; wall {result.wall_s:.1f} s")
