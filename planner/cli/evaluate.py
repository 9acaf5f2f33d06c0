"""``planner evaluate CLUSTER PLAN``: a plan's predicted time, throughput, cost and memory,
term by term.  Exit 0 when it fits, 1 (with the memory problems) when it does not."""

from __future__ import annotations

import click

from planner import api
from planner.api import trust_line
from planner.cli.common import (
    blocks_cell,
    console,
    echo_json,
    format_seconds,
    warn_precision,
    warn_skipped_profiles,
)
from planner.cli.tables import Table
from planner.errors import InfeasibleError

_GiB = 2**30


def _load_plan(path: str):
    return api.load_plan(path)


def _terms_table(ev) -> Table:
    t = Table(title="Iteration time, term by term", title_justify="left")
    t.add_column("term")
    t.add_column("value", justify="right")
    t.add_column("share", justify="right")
    t.add_column("formula / source", overflow="fold", max_width=80)
    total = ev.iteration_time_s
    for term, value, formula in ev.explain()[:len(ev.breakdown_s)]:   # the terms, then totals
        t.add_row(term, format_seconds(value), f"{100 * value / total:.1f}%", formula)
    t.add_row("[bold]iteration[/bold]", f"[bold]{format_seconds(total)}[/bold]", "100%", "")
    return t


def _stages_table(ev, plan) -> Table:
    t = Table(title="Stages (one micro-batch, slowest replica)", title_justify="left")
    for col in ("stage", "blocks", "replicas", "forward", "backward", "send fwd", "send bwd",
                "dp sync", "exposed", "optimizer"):
        t.add_column(col, justify="right")
    for st, timing in zip(plan.stages, ev.stages):
        t.add_row(str(st.index), blocks_cell(plan, st), str(len(st.replicas)), format_seconds(timing.forward_s),
                  format_seconds(timing.backward_s), format_seconds(timing.send_forward_s), format_seconds(timing.send_backward_s),
                  format_seconds(timing.dp_sync_s), format_seconds(timing.dp_sync_exposed_s), format_seconds(timing.optimizer_s))
    return t


def _memory_table(ev, plan) -> Table:
    """Peak memory per replica (all its GPUs hold the same), grouped by stage."""
    t = Table(title="Peak memory per GPU vs capacity", title_justify="left")
    for col in ("stage", "replica", "devices", "weights+grads+opt", "activations", "peak", "capacity", ""):
        t.add_column(col, justify="right" if col not in ("devices", "") else "left")
    for st, mems in zip(plan.stages, ev.memory_by_replica):
        # identical consecutive replicas (same GPU type, tp, share) share one row
        groups: list[list[int]] = []
        for k, r in enumerate(st.replicas):
            prev = st.replicas[groups[-1][0]] if groups else None
            if prev is not None and (prev.gpu_type, prev.tp, prev.micro_batch_share) == \
                    (r.gpu_type, r.tp, r.micro_batch_share) and mems[k] == mems[groups[-1][0]]:
                groups[-1].append(k)
            else:
                groups.append([k])
        for g in groups:
            r, mem = st.replicas[g[0]], mems[g[0]]
            cap = ev.memory_capacity_bytes[r.devices[0]]
            label = str(g[0]) if len(g) == 1 else f"{g[0]}-{g[-1]}"
            devs = r.devices[0] if len(r.devices) == 1 else f"{r.devices[0]} … ({len(r.devices)} GPUs)"
            if len(g) > 1:
                devs += f" and {len(g) - 1} more"
            ok = "[green]ok[/green]" if mem.total_bytes <= cap else "[red]OVER[/red]"
            static = mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes + mem.gathered_bytes
            t.add_row(str(st.index), label, devs, f"{static / _GiB:.2f} GiB",
                      f"{mem.activations_bytes / _GiB:.2f} GiB", f"{mem.total_bytes / _GiB:.2f} GiB",
                      f"{cap / _GiB:.2f} GiB", ok)
    return t


@click.command("evaluate")
@click.argument("cluster", type=click.Path(dir_okay=False))
@click.argument("plan", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="print the Evaluation as JSON (predicted form)")
@click.option("--profiles", type=click.Path(), default=None,
              help="folder or file of measured per-layer profiles (used before the roofline)")
@click.option("--calibration", "calibration_path", type=click.Path(dir_okay=False), default=None,
              help="calibration file from `planner profile --calibrate` (default: the shipped fit)")
def evaluate(cluster, plan, as_json, profiles, calibration_path):
    """Predict a plan's iteration time, throughput, MFU, cost and per-device memory."""
    spec = api.load_cluster(cluster)
    the_plan = _load_plan(plan)
    profile_set = api.resolve_profiles(spec, profiles)
    api.check_plan(spec, the_plan, file=plan)  # here, so errors name the plan file
    made_on = the_plan.inputs.cluster_sha256
    if made_on and made_on != spec.sha256():
        # the devices still exist, but links, prices or counts may differ from what the plan
        # was searched on: its prediction here is for this file, and it may no longer be the best
        click.echo(f"warning: {cluster} is not the cluster file {plan} was planned on (its sha256 "
                   f"differs); the prediction below is for {cluster}", err=True)
    warn_precision(spec, str(the_plan.inputs.training.get("precision", "bf16")), the_plan)
    ev = api.evaluate(spec, the_plan, profiles=profile_set, calibration=calibration_path, check=False)
    if profile_set is not None and hasattr(profile_set, "usage"):
        warn_skipped_profiles(profile_set.usage().get("files"))
    if as_json:
        echo_json(ev.to_json())
    else:
        out = console()
        out.print(_terms_table(ev))
        out.print(_stages_table(ev, the_plan))
        summary = (f"throughput {ev.tokens_per_s:,.0f} tokens/s, {ev.samples_per_s:.2f} samples/s; "
                   f"MFU {100 * ev.mfu:.1f}%")
        if ev.usd_per_hour is not None:
            summary += (f"; {ev.usd_per_hour:,.2f} USD/h (egress {ev.egress_usd_per_hour:,.2f}), "
                        f"{ev.usd_per_million_tokens:,.4f} USD per million tokens")
        else:
            summary += "; cost unknown (a used node has no price)"
        out.print(summary)
        if ev.trust:
            out.print(trust_line(ev.trust))
        for term, value, formula in ev.details:
            out.print(f"{term} = {value:.4g}: {formula}")
        count = {k: sum(1 for v in ev.sources.values() if v == k) for k in ("measured", "interpolated", "estimated")}
        out.print(f"layer costs: {count['measured']} measured, {count['interpolated']} interpolated between "
                  f"measured micro-batches, {count['estimated']} estimated (roofline)")
        out.print(_memory_table(ev, the_plan))
    if not ev.fits:
        raise InfeasibleError("the plan does not fit in memory:\n  " + "\n  ".join(ev.memory_problems))
