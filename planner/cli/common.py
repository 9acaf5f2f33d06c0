"""Shared CLI pieces: consoles, JSON output, atomic file writes, the job options."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console

# Output that goes to a pipe or a file (CI logs, `| less`) has no terminal width: rich took 80
# columns and cut GPU and zone names short to fit its tables ("A100-S…", "us-ce…").  Piped,
# a table gets this many columns, enough for every table here at its natural width; a terminal
# keeps its own width, and COLUMNS, when set, is obeyed.
PIPED_WIDTH = 200


def console(quiet: bool = False) -> Console:
    """Human output goes to stderr when stdout must stay machine-readable."""
    stream = sys.stderr if quiet else sys.stdout
    piped = not (hasattr(stream, "isatty") and stream.isatty()) and not os.environ.get("COLUMNS")
    return Console(stderr=quiet, highlight=False, soft_wrap=False, width=PIPED_WIDTH if piped else None)


def warn_skipped_profiles(files: list[dict] | None) -> None:
    """One stderr line per profile file the plan could not use (e.g. another dtype), so a
    prediction resting on the roofline is never mistaken for a measured one."""
    for row in files or ():
        if row.get("skipped"):
            # click.echo, not rich: a warning stays one line whatever the terminal width.
            click.echo(f"warning: profile {row['path']} skipped ({row['skipped']}); "
                       "its layers are estimated by the roofline", err=True)


def warn_wall_clock(report, time_limit_s: float) -> None:
    """One stderr line when the time limit, not the work budget, stopped a deterministic
    search: the one case where its plan may differ between runs (the report's
    ``wall_clock_bound`` said so, and nothing else did)."""
    extra = report.model_extra or {}
    if not (extra.get("deterministic") and extra.get("wall_clock_bound")):
        return
    click.echo(f"warning: the time limit ({time_limit_s:g} s) stopped this deterministic search after "
               f"{extra.get('work_units', 0):,.0f} of its {extra.get('work_budget', 0):,} work units: the plan "
               "may differ between runs; give it a longer --time-limit or a smaller --work-budget", err=True)


def warn_precision(cluster, precision: str, plan=None) -> None:
    """One stderr line per GPU type priced at a stand-in matmul peak in ``precision`` (tf32 on
    a GPU without TF32 tensor cores, a GPU without fp32 figures: ``GpuType.precision_note``);
    with ``plan``, only the types its devices are on."""
    types = None
    if plan is not None:
        nodes = cluster.node_by_name
        types = {nodes[d.rpartition(":")[0]].gpu.name for d in plan.devices()
                 if d.rpartition(":")[0] in nodes}
    for note in cluster.precision_notes(precision, types):
        click.echo(f"warning: {note}", err=True)


def format_seconds(x: float) -> str:
    return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.3f} s"


def echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


def _target(path: str | Path) -> Path:
    """The file a write to ``path`` lands in: a symlink is written through (the rename must
    replace its target, not the link); anything there that is not a regular file (a folder,
    a device such as /dev/null) is refused, since the rename would replace it."""
    from planner.errors import InputError

    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    if path.exists() and not path.is_file():
        raise InputError(f"cannot write {path}: it exists and is not a regular file")
    return path


def write_atomic(path: str | Path, text: str, siblings: dict[str, str] | None = None) -> list[Path]:
    """Write one file via a temp file in the same folder and a rename: never half-written.
    ``siblings`` (name -> text) go into the same folder with it, all or none."""
    from planner.api import write_files as write

    path = _target(path)
    return write({**(siblings or {}), path.name: text}, path.parent)


def check_writable(path: str | Path) -> None:
    """Fail before long work, not after it, when ``path`` cannot be written."""
    from planner.errors import InputError

    folder = _target(path).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise InputError(f"cannot write {path}: {folder} is not a writable folder")


PRECISION_HELP = ("training precision: bf16 | fp16 (mixed), fp32 (matmuls at the FP32 CUDA-core peak), tf32 "
                  "(fp32 storage, TF32 tensor-core matmuls)  [default: bf16; with --training, the file's]")


def job_options(command):
    """The options that name the job (model, training file, batch, sequence, precision), one
    definition for every command that plans (plan, pareto)."""
    from planner.api import PRECISIONS  # the CLI reaches planner only through planner.api
    options = [
        click.option("--model", "model_name", required=True, help="catalog model name or a model YAML file"),
        click.option("--training", "training_path", type=click.Path(dir_okay=False), default=None,
                     help="training YAML (global batch, sequence length, the search's freedoms)"),
        click.option("--global-batch-size", type=int, default=None, help="sequences per iteration"),
        click.option("--seq-len", type=int, default=None, help="tokens per sequence"),
        click.option("--precision", type=click.Choice(list(PRECISIONS)), default=None, help=PRECISION_HELP),
        click.option("--attention", type=click.Choice(["unfused", "flash"]), default=None,
                     help="the attention core's kernel: flash (fused: Megatron-Core + TE, torchtitan, HF) "
                          "or unfused (keeps the s x s scores: Megatron-LM without flash, planner run)  "
                          "[default: flash; with --training, the file's]"),
        click.option("--cross-entropy", type=click.Choice(["fused", "plain"]), default=None,
                     help="the loss kernel: fused (Megatron's vocab-parallel) or plain (F.cross_entropy on "
                          "an fp32 copy: torchtitan, HF)  [default: fused; with --training, the file's]"),
        click.option("--elementwise", type=click.Choice(["fused", "eager"]), default=None,
                     help="a block's norms, rotary embedding, activation and residual adds: fused kernels "
                          "(Megatron-Core/TE, Apex, torch.compile) or eager PyTorch ops (torchtitan, HF "
                          "without torch.compile)  [default: fused; with --training, the file's]"),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def blocks_cell(plan, stage) -> str:
    """A stage's blocks as run: with virtual stages its chunks' ranges (interleaving's loop,
    zb-v's and dualpipev's V, where rank 0 holds the head), each with what it adds; the
    stage's own range where the chunks cannot be cut (plan.check reports why)."""
    from planner.api import InputError, plan_chunks

    def ends(emb: bool, head: bool) -> str:
        return (" +emb" if emb else "") + (" +head" if head else "")

    if plan.virtual_stages > 1:
        try:
            pieces = [c for c in plan_chunks(plan, "display") if c.stage == stage.index]
        except InputError:
            pieces = []
        if pieces:
            return ", ".join(f"{c.first}-{c.last}{ends(c.embedding, c.head)}" for c in pieces)
    return f"{stage.blocks[0]}-{stage.blocks[1]}{ends(stage.embedding, stage.head)}"
