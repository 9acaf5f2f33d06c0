"""``planner simulate CLUSTER PLAN``: run a plan's pipeline schedule event by event and set
the simulated iteration time beside the cost model's closed form."""

from __future__ import annotations

import os
from pathlib import Path

import click
from rich.text import Text

from planner.cli.common import console, echo_json, warn_precision
from planner.cli.tables import Table

_STYLE = {"fwd": "cyan", "bwd": "magenta", "wgt": "green", "send": "yellow", "sync": "red", "idle": "dim"}


def _suffix(*allowed: str, what: str = ""):
    """A click callback refusing a path that does not end in one of ``allowed``."""
    def check(ctx, param, value):
        if value is not None and not value.lower().endswith(allowed):
            raise click.BadParameter(f"{value}: the file must end in {' or '.join(allowed)}{what}")
        return value
    return check


def _draw(sim, timeline_path: str | None, trace_path: str | None, quiet: bool) -> None:
    """The plan's schedule as generated action lists on the simulated stage times, drawn and/or
    traced (planner.simulate.plan.plan_execution, planner.simulate.render)."""
    from planner.api import (
        InputError,
        missing_folders,
        plan_execution,
        remove_empty,
        write_timeline,
        write_trace,
    )

    run = plan_execution(sim)
    out = console(quiet=True)
    if abs(run.makespan_s - sim.simulated_pipeline_s) > 1e-9 * max(1.0, sim.simulated_pipeline_s):
        out.print(f"note: the drawing does not model shared CPU cores: {run.makespan_s:.4f} s there, "
                  f"{sim.simulated_pipeline_s:.4f} s simulated")
    # both or neither: the timeline waits beside its target until the trace is written; on a
    # failure the folders made for either go too
    made = sorted((f for path in (timeline_path, trace_path) if path is not None for f in missing_folders(path)),
                  key=lambda f: len(f.parts), reverse=True)      # deepest first
    staged = None
    if timeline_path is not None:
        staged = write_timeline(run, timeline_path, keep_staged=True)
    try:
        if trace_path is not None:
            write_trace(run, trace_path)
    except BaseException:
        if staged is not None:
            staged.unlink(missing_ok=True)
        remove_empty(made)
        raise
    if staged is not None:
        try:
            os.replace(staged, timeline_path)
        except OSError as e:       # the trace, written, goes too: both or neither
            staged.unlink(missing_ok=True)
            if trace_path is not None:
                Path(trace_path).unlink(missing_ok=True)
            remove_empty(made)
            raise InputError(f"cannot write {timeline_path}: {e.strerror or e}") from None
        out.print(f"timeline written to {timeline_path}")
    if trace_path is not None:
        out.print(f"trace written to {trace_path} (open it in https://ui.perfetto.dev)")


@click.command()
@click.argument("cluster_file", metavar="CLUSTER", type=click.Path(dir_okay=False))
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print times, stages and the full timeline as JSON.")
@click.option("--width", default=64, show_default=True, type=click.IntRange(10, 400),
              help="Characters of the text timeline.")
@click.option("--profiles", "profiles_path", type=click.Path(), default=None,
              help="Folder or file of measured per-layer profiles (default: the cluster spec's profiles:).")
@click.option("--calibration", "calibration_path", type=click.Path(dir_okay=False), default=None,
              help="calibration file from `planner profile --calibrate` (default: the shipped fit)")
@click.option("--timeline", "timeline_path", type=click.Path(dir_okay=False), default=None,
              callback=_suffix(".png", ".svg"),
              help="Draw the schedule to FILE.png or FILE.svg: one row per rank, F / B / I / W and send "
                   "blocks numbered by micro-batch (needs matplotlib).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              callback=_suffix(".json", what=" (Chrome trace events)"),
              help="Write the schedule as Chrome trace events to FILE.json (opens in Perfetto).")
def simulate(cluster_file: str, plan_file: str, as_json: bool, width: int, profiles_path: str | None,
             calibration_path: str | None, timeline_path: str | None, trace_path: str | None) -> None:
    """Simulate PLAN's schedule on CLUSTER; compare with the closed-form iteration time."""
    from planner.cli.common import check_writable

    for path in (timeline_path, trace_path):
        if path is not None:
            check_writable(path)
    from planner import api

    cluster = api.load_cluster(cluster_file)
    plan = api.load_plan(plan_file)
    sim = api.simulate(cluster, plan, profiles=profiles_path, calibration=calibration_path, file=plan_file)
    warn_precision(cluster, str(plan.inputs.training.get("precision", "bf16")), plan)
    if timeline_path is not None or trace_path is not None:
        _draw(sim, timeline_path, trace_path, quiet=as_json)
    if as_json:
        echo_json(sim.to_json())
        return
    out = console()
    r = sim.result
    out.print(f"[bold]{plan_file}[/bold] on {cluster.name}: {r.schedule}, {r.num_stages} stage(s), "
              f"{r.num_micro_batches} micro-batches"
              + (f", {r.virtual_stages} virtual stages" if r.virtual_stages > 1 else ""))
    times = Table(title="Iteration time")
    for col in ("", "closed form", "simulated"):
        times.add_column(col, justify="right" if col else "left")
    times.add_row("pipeline", f"{sim.closed_form_pipeline_s:.4f} s", f"{sim.simulated_pipeline_s:.4f} s")
    times.add_row("+ DP sync exposed, optimizer", f"{sim.after_pipeline_s:.4f} s", f"{sim.after_pipeline_s:.4f} s")
    times.add_row("iteration", f"{sim.closed_form_iteration_s:.4f} s", f"{sim.simulated_iteration_s:.4f} s")
    out.print(times)
    out.print(f"simulated - closed form: {sim.relative_difference:+.2%} of the pipeline time; "
              f"bubble {r.bubble_fraction:.1%} of stage time")
    for note in sim.notes:
        out.print(f"note: {note}")
    stages = Table(title="Stages (one micro-batch)")
    for col in ("stage", "fwd ms", "bwd ms", "send>ms", "<send ms", "busy s", "idle s", "in flight"):
        stages.add_column(col, justify="right", no_wrap=True)
    for i, s in enumerate(sim.evaluation.stages):
        stages.add_row(str(i), f"{s.forward_s * 1e3:.2f}", f"{s.backward_s * 1e3:.2f}",
                       f"{s.send_forward_s * 1e3:.2f}", f"{s.send_backward_s * 1e3:.2f}",
                       f"{r.busy_s[i]:.3f}", f"{r.bubble_s[i]:.3f}", str(r.max_in_flight[i]))
    out.print(stages)
    out.print(f"timeline, 0 .. {r.makespan_s:.3f} s ([cyan]forward[/cyan] / [magenta]backward[/magenta]: "
              "micro-batch digit"
              + (", [green]weight gradient[/green]" if r.schedule in ("zb-h1", "zb-v", "dualpipev", "latency-aware") else "")
              + ", [yellow]>[/yellow] send"
              + (", [red]=[/red] pair gradient all-reduce beside compute" if r.pair_syncs else "")
              + ", . idle)")
    for i, row in enumerate(api.timeline_rows(r, width)):
        line = Text(f"stage {i:>2} |")
        for char, kind in row:
            line.append(char, style=_STYLE.get(kind, ""))
        line.append("|")
        out.print(line, no_wrap=True, crop=False, overflow="ignore")
