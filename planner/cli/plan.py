"""``planner plan CLUSTER --model M ...``: search the plan space, print the best plan and how
it was proved, write the plan JSON.  Progress goes to stderr; ``--json`` / ``--quiet`` keep
stdout machine-readable."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import click

from planner.api import SEARCH_SCHEDULES, Training, trust_line
from planner.cli.common import (
    blocks_cell,
    check_writable,
    console,
    echo_json,
    format_seconds,
    job_options,
    warn_skipped_profiles,
    warn_wall_clock,
    write_atomic,
)
from planner.cli.freedoms import with_freedoms
from planner.cli.prices import default_price_notes
from planner.cli.progress import SearchStatus
from planner.cli.tables import Table
from planner.errors import INTERRUPTED_EXIT, InputError


def _training(training_path, global_batch_size, seq_len, precision, attention=None, cross_entropy=None,
              elementwise=None):
    from planner.api import load_training, training_from_mapping
    if training_path and (global_batch_size is not None or seq_len is not None):
        raise InputError("give either --training T.yaml or --global-batch-size/--seq-len, not both")
    kernels = {"precision": precision, "attention": attention, "cross_entropy": cross_entropy,
               "elementwise": elementwise}
    if training_path:
        training = load_training(training_path)
        for field, flag in kernels.items():
            if flag is not None and flag != getattr(training, field):
                option = "--" + field.replace("_", "-")
                raise InputError(f"{option} {flag} contradicts {field}: {getattr(training, field)} in "
                                 f"{training_path}; set it in the file (or drop {option})")
        return training
    if global_batch_size is None or seq_len is None:
        raise InputError("give --training T.yaml, or both --global-batch-size and --seq-len")
    if global_batch_size <= 0 or seq_len <= 0:
        raise InputError(f"--global-batch-size and --seq-len must be positive, got {global_batch_size} "
                         f"and {seq_len}")
    # Training's own limits (the batch's cap, ...) become input errors, as they do for a file
    flags = {"global_batch_size": global_batch_size, "seq_len": seq_len, "precision": precision or "bf16",
             **{k: v for k, v in kernels.items() if k != "precision" and v is not None}}
    return training_from_mapping(flags, file="--global-batch-size/--seq-len")


def _uneven(stage) -> bool:
    """A stage whose shares are not the even split: of two kinds, or differing by more than one."""
    shares = [r.micro_batch_share for r in stage.replicas]
    return len({(r.gpu_type, r.tp) for r in stage.replicas}) > 1 or max(shares) - min(shares) > 1


def node_order(name: str) -> tuple:
    """Sort key of a node name with its digit runs read as numbers: a group's nodes are
    ``name-0 … name-{count-1}``, and as strings h-100 would sort before h-99.  The name itself
    breaks ties (h-01 and h-1), so the order never rests on a set's."""
    parts = re.split(r"([0-9]+)", name)
    # split on a captured group: the digit runs are the odd parts, so keys compare int with int
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name


def _stage_rows(plan) -> Table:
    t = Table(title="Stages", title_justify="left")
    for col in ("stage", "blocks", "GPUs", "replicas", "tp", "shares", "devices"):
        t.add_column(col, justify="right" if col not in ("GPUs", "devices") else "left")
    for st in plan.stages:
        kinds: dict[tuple, list[int]] = {}        # per (GPU, tp), its replicas' shares
        for r in st.replicas:
            kinds.setdefault((r.gpu_type, r.tp), []).append(r.micro_batch_share)
        # a replica is tp x cp GPUs: "1x2x2" is one replica of tp 2 over 2 context-parallel ranks
        cp = f"x{plan.context_parallel}" if plan.context_parallel > 1 else ""
        gpus = ", ".join(f"{len(q)}x{tp}{cp} {g}" for (g, tp), q in kinds.items())
        # shares in the order of the kinds (GPUs, tp), a kind's distinct ones largest first
        shares = "/".join(",".join(map(str, sorted(set(q), reverse=True))) for q in kinds.values())
        nodes = sorted({r.node for r in st.replicas}, key=node_order)
        where = nodes[0] if len(nodes) == 1 else f"{nodes[0]} … {nodes[-1]} ({len(nodes)} nodes)"
        t.add_row(str(st.index), blocks_cell(plan, st), gpus, str(len(st.replicas)),
                  "/".join(str(tp) for _, tp in kinds), shares, where)
    return t


def _bound_text(plan, bound: float | None) -> str:
    """The proved bound in the objective's unit: seconds per iteration for the throughput
    objectives, USD per million tokens for ``cost`` (the solver's value is USD/hour x s per
    iteration), USD/hour for ``cost-above-floor``."""
    if bound is None:
        return "none"
    kind = plan.objective.kind
    if kind == "cost":
        tokens = plan.inputs.training["global_batch_size"] * plan.inputs.training["seq_len"]
        return f"{bound / 3600 / tokens * 1e6:,.4f} USD per million tokens"
    if kind == "cost-above-floor":
        return f"{bound:,.2f} USD/hour"
    return format_seconds(bound)


def _pruned_text(rep) -> str:
    """Tuples pruned by their bounds, apart from the GPipe tuples left out for their 1F1B
    twins before any bound (they were counted as pruned by bound)."""
    twins = getattr(rep, "knob_tuples_gpipe_twins", 0) or 0
    text = f"{rep.knob_tuples_pruned - twins} pruned by bound"
    return text + (f", {twins} GPipe tuples left out for their 1F1B twins" if twins else "")


# Egress above this share of the plan's USD/hour gets a warning: the plan is then paying the
# cloud mostly for moving activations and gradients between zones, not for GPUs.
EGRESS_WARN_SHARE = 0.2


def cost_text(ev) -> str:
    """``, X USD/hour (E of it egress, S%), Y USD per million tokens`` for the summary line."""
    if ev.usd_per_hour is None:
        return ", cost unknown (a used node has no price)"
    text = f", {ev.usd_per_hour:,.2f} USD/hour"
    if ev.egress_usd_per_hour > 0:
        text += f" ({ev.egress_usd_per_hour:,.2f} of it egress, {100 * _egress_share(ev):.0f}%)"
    return text + f", {ev.usd_per_million_tokens:,.4f} USD per million tokens"


def _egress_share(ev) -> float:
    return ev.egress_usd_per_hour / ev.usd_per_hour if ev.usd_per_hour else 0.0


def egress_warning(ev) -> str | None:
    """A warning when egress is over ``EGRESS_WARN_SHARE`` of the plan's USD/hour."""
    if ev.usd_per_hour is None or _egress_share(ev) <= EGRESS_WARN_SHARE:
        return None
    return (f"warning: egress is {100 * _egress_share(ev):.0f}% of this plan's cost "
            f"({ev.egress_usd_per_hour:,.2f} of {ev.usd_per_hour:,.2f} USD/hour), over "
            f"{EGRESS_WARN_SHARE:.0%}: its stages talk across priced zone links, and the search "
            "does not optimise egress (docs/search-space.md); a plan within one zone has none")


def budget_warning(ev, spec) -> str | None:
    """A warning when egress takes a budget plan over the budget: the budget bounds node rent
    in the search (docs/search-space.md, "Objectives"), the plan's USD/hour counts egress too
    (a metamorphic sweep: 86.39 USD/hour under a budget of 40, 47.39 of it egress)."""
    budget = spec.budget_usd_per_hour
    if budget is None or ev.usd_per_hour is None or ev.usd_per_hour <= budget * (1 + 1e-9):
        return None
    rent = ev.usd_per_hour - ev.egress_usd_per_hour
    return (f"warning: this plan costs {ev.usd_per_hour:,.2f} USD/hour, over the budget of {budget:,.2f}: the "
            f"search holds node rent to the budget ({rent:,.2f} here) and does not price egress "
            f"({ev.egress_usd_per_hour:,.2f}; docs/search-space.md, Objectives); a plan within one zone has "
            "none")


def _run_line(rep) -> str:
    """How long the search ran and how far it got: stderr only, never the plan file."""
    found = getattr(rep, "answer_found_s", None)
    return (f"search: {rep.wall_s:.2f} s, " + (f"answer found at {found:.2f} s, " if found is not None else "")
            + f"{rep.candidates} knob tuples examined of {rep.knob_tuples} "
            f"({rep.knob_tuples_solved} solved exactly, {_pruned_text(rep)})")


def _baseline_text(rep) -> str | None:
    """The answer against the best layout a person would write (baselines.py), or why there
    is none: the report held it, the summary said nothing (a sweep took the silence on a
    24-GPU cluster, where no uniform layout fits, for a baseline never tried)."""
    extra = rep.model_extra or {}
    name, ratio = extra.get("baseline"), extra.get("baseline_ratio")
    if name is None:
        priced = extra.get("baselines_priced")
        if priced is None:
            return None
        why = (f"none of the {priced} baseline layouts priced fits" if priced
               else "no baseline layout (the Megatron, Sailor and Metis rules) fits this cluster and job")
        return f"baseline: {why}" + ("" if extra.get("baselines_complete", True) else " (its time share ran out)")
    if ratio is None:
        return f"baseline: {name}"
    than = ("as good as" if ratio <= 1 + 1e-9 else f"{100 * (ratio - 1):.2g}% better than" if ratio < 1.01
            else f"{ratio:.3g}x better than")
    return f"baseline: {than} the best baseline layout ({name})"


def _summary(out, result, cluster) -> None:
    plan, ev, rep = result.plan, result.evaluation, result.report
    out.print(f"[bold]{plan.num_stages} stage(s)[/bold], micro-batch {plan.micro_batch_size} x "
              f"{plan.num_micro_batches}, {plan.schedule}"
              + (f" (v={plan.virtual_stages})" if plan.virtual_stages > 1 else "")
              + f", recompute {plan.recompute}, ZeRO-{plan.zero_stage}"
              + (f" (HSDP: shard groups of {plan.zero_shard_degree} replicas)" if plan.zero_shard_degree else "")
              + (f", context parallel {plan.context_parallel}" if plan.context_parallel > 1 else "")
              + (", sequence parallel" if plan.sequence_parallel and any(
                  r.tp > 1 for st in plan.stages for r in st.replicas) else "")
              + (f", expert parallel {plan.expert_parallel}" if plan.expert_parallel > 1 else ""))
    out.print(_stage_rows(plan))
    for line in result.idle:
        out.print(f"idle: {line}")
    line = (f"predicted: {ev.tokens_per_s:,.0f} tokens/s, iteration {format_seconds(ev.iteration_time_s)}, "
            f"MFU {100 * ev.mfu:.1f}%")
    out.print(line + cost_text(ev))
    for note in default_price_notes(cluster, plan):
        out.print(note)
    if ev.trust:
        out.print(trust_line(ev.trust))
    # below the solvers' tolerance a gap is rounding noise (3.58e-14% was printed)
    gap = "n/a" if rep.gap is None else "0%" if rep.gap <= 1e-9 else f"{100 * rep.gap:.3g}%"
    out.print(f"solver: {rep.status} (gap {gap}, bound {_bound_text(plan, rep.bound)})"
              + (", interrupted (Ctrl-C)" if getattr(rep, "interrupted", False) else ""))
    baseline = _baseline_text(rep)
    if baseline:
        out.print(baseline)
    if len(result.plans) > 1:
        t = Table(title=f"Top {len(result.plans)} plans", title_justify="left")
        for col in ("#", "tokens/s", "USD/h", "p", "schedule", "B x m", "recomp.", "ZeRO",
                    "per stage: replicas x tp GPU, blocks"):
            t.add_column(col, justify="right", no_wrap=not col.startswith("per stage"))
        for i, (p, e) in enumerate(zip(result.plans, result.evaluations)):
            # a kind's share only where the shares differ by more than one (mixed stages)
            per_stage = " | ".join(
                "+".join(f"{n}x{tp} {gpu.split('-')[0]}" + ("" if q is None else f" s{q}")
                         for (tp, gpu, q), n in
                         Counter((r.tp, r.gpu_type, r.micro_batch_share if _uneven(st) else None)
                                 for r in st.replicas).items())
                + f" {st.blocks[0]}-{st.blocks[1]}" for st in p.stages)
            t.add_row(str(i + 1), f"{e.tokens_per_s:,.0f}", "-" if e.usd_per_hour is None else f"{e.usd_per_hour:,.2f}",
                      str(p.num_stages), p.schedule, f"{p.micro_batch_size}x{p.num_micro_batches}",
                      p.recompute, str(p.zero_stage), per_stage)
        out.print(t)


@click.command("plan")
@click.argument("cluster", type=click.Path(dir_okay=False))
@job_options
@click.option("--objective", default=None,
              help="throughput | cost | throughput-under-budget | cost-above-floor  [default: throughput; "
                   "with --min-tokens-per-s alone cost-above-floor, as --budget-usd-per-hour alone is "
                   "throughput-under-budget]")
@click.option("--budget-usd-per-hour", type=float, default=None, help="maximise throughput within this USD/hour")
@click.option("--min-tokens-per-s", type=float, default=None, help="minimise USD/hour above this throughput")
@click.option("--time-limit", "time_limit_s", type=float, default=60.0, show_default=True, help="seconds")
@click.option("--top", "top_k", type=int, default=1, show_default=True, help="the K best distinct plans")
@click.option("--deterministic", is_flag=True,
              help="stop on a work budget, not the clock: identical inputs give byte-identical plans on any "
                   "machine (the time limit still guards; off by default, for CI)")
@click.option("--work-budget", type=int, default=None, metavar="UNITS",
              help="the deterministic search's work budget (implies --deterministic) [default: 20,000 per "
                   "second of --time-limit]")
@click.option("--schedule", "schedules", default=None, metavar="S[,S...]",
              help=f"pipeline schedules to search: {', '.join(SEARCH_SCHEDULES)} (default: "
                   f"{', '.join(Training.model_fields['schedules'].default)}; training: schedules)")
@click.option("--recompute", "recompute_modes", default=None, metavar="M[,M...]",
              help="activation recompute modes to search: none, selective, full, op (training: recompute_modes)")
@click.option("--zero-stage", "zero_stages", default=None, metavar="Z[,Z...]",
              help="ZeRO stages to search: 0, 1, 2, 3 (training: zero_stages)")
@click.option("--zero-shard-degree", "zero_shard_degrees", default=None, metavar="D[,D...]",
              help="HSDP: ZeRO shard-group sizes to search, in replicas of a stage, e.g. all,node,4 (all: "
                   "shard over every replica; node: the replicas one node holds; training: zero_shard_degrees)")
@click.option("--context-parallel", "context_parallel_degrees", default=None, metavar="C[,C...]",
              help="context-parallel degrees to search, e.g. 1,2,4: each sequence split over C x tp GPUs "
                   "of a replica (ring attention; training: context_parallel_degrees)")
@click.option("--expert-parallel", "expert_parallel_degrees", default=None, metavar="E[,E...]",
              help="MoE models: expert-parallel degrees to search, e.g. 1,2,4 (training: expert_parallel_degrees)")
@click.option("--launcher", type=click.Choice(["megatron", "deepspeed"]), default=None,
              help="restrict the search to layouts that launcher runs")
@click.option("--mixed-stages", is_flag=True,
              help="also search stages that mix two node classes of one zone (GPU type, TP, uneven shares)")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="write the plan JSON here (with --top K, plans 2..K beside it as NAME-2.json ...)")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="write how the search ran (seconds, knob tuples solved, pruned, unexplored) as JSON "
                   "here; the plan file holds none of it, so the same inputs give the same plan bytes")
@click.option("--json", "as_json", is_flag=True, help="print the plan JSON on stdout")
@click.option("--quiet", is_flag=True, help="no summary; only errors")
@click.option("--profiles", "profiles_path", type=click.Path(), default=None,
              help="folder or file of measured per-layer profiles (default: the cluster spec's profiles:)")
@click.option("--calibration", "calibration_path", type=click.Path(dir_okay=False), default=None,
              help="calibration file from `planner profile --calibrate` (default: the shipped fit)")
def plan(cluster, model_name, training_path, global_batch_size, seq_len, precision, attention, cross_entropy,
         elementwise, objective,
         budget_usd_per_hour, min_tokens_per_s, time_limit_s, top_k, deterministic, work_budget, schedules, recompute_modes, zero_stages,
         zero_shard_degrees, context_parallel_degrees, expert_parallel_degrees, launcher, mixed_stages, output, report_path, as_json, quiet, profiles_path, calibration_path):
    """Find the fastest (or cheapest) layout of MODEL on CLUSTER, with a proof of how close it is.

    Ctrl-C stops the search and keeps the best plan found so far: it is written (-o) with
    status feasible and its gap, and the exit code is 130."""
    from planner import api

    api.check_time_limit(time_limit_s)
    if top_k < 1:
        raise InputError(f"--top must be at least 1, got {top_k}")
    if objective is None:       # a floor alone says what to optimise, as a budget alone does
        objective = "cost-above-floor" if min_tokens_per_s is not None else "throughput"
    spec_obj = api.parse_objective(objective, budget_usd_per_hour, min_tokens_per_s)
    for path in (output, report_path):
        if path:
            check_writable(path)
    spec = api.load_cluster(cluster)
    model = api.load_model(model_name)
    training = _training(training_path, global_batch_size, seq_len, precision, attention, cross_entropy,
                         elementwise)
    training = with_freedoms(training, {"--schedule": schedules, "--recompute": recompute_modes,
                                        "--zero-stage": zero_stages, "--zero-shard-degree": zero_shard_degrees,
                                        "--context-parallel": context_parallel_degrees,
                                        "--expert-parallel": expert_parallel_degrees}, training_path)
    if mixed_stages:
        training = training.model_copy(update={"mixed_stages": True})
    for line in api.input_warnings(spec, model, training):
        click.echo(f"warning: {line}", err=True)
    err = console(quiet=True)       # progress always on stderr
    with SearchStatus(err, time_limit_s, quiet) as status:
        result = api.plan(spec, model, training, objective=spec_obj, time_limit_s=time_limit_s, top_k=top_k,
                          launcher=launcher, profiles=profiles_path, progress=status.message,
                          deterministic=deterministic, work_budget=work_budget,
                          watch=status.watch, calibration=calibration_path)
    best = result.plan               # predicted, solver and launch filled by the search
    warn_skipped_profiles((best.inputs.profiles or {}).get("files"))
    # The plan is not checked against planner/plan/schema.json here: the tests hold the plans
    # the search writes to it (test_search_cli, test_precision, test_time_limit), and on the
    # largest bench scenario (16,384 GPUs) the check took 3-6 s, past --time-limit.
    text = best.dumps()
    if output:
        stem, suffix = Path(output).stem, Path(output).suffix or ".json"
        others = {f"{stem}-{i}{suffix}": p.dumps() for i, p in enumerate(result.plans[1:], start=2)}
        write_atomic(output, text, others)
    rep = result.report              # the run's timing and counters too (the plans' solver has none)
    if report_path:
        write_atomic(report_path, json.dumps(_report_json(rep), indent=2, sort_keys=True) + "\n")
    if not quiet:
        click.echo(_run_line(rep), err=True)
    warn_wall_clock(rep, time_limit_s)
    for warning in (egress_warning(result.evaluation), budget_warning(result.evaluation, spec_obj)):
        if warning:
            click.echo(warning, err=True)
    if as_json:
        echo_json(best.to_json())
    elif not quiet:
        out = console()
        _summary(out, result, spec)
        if output:
            out.print(f"wrote {output}" + (f" and {', '.join(sorted(others))} beside it" if others else ""))
    if getattr(rep, "interrupted", False):
        gap = "unknown" if rep.gap is None else f"{100 * rep.gap:.3g}%"
        click.echo(f"interrupted: the best plan found so far ({rep.status}, gap {gap})"
                   + (f" is in {output}" if output else " is above; give -o to keep it"), err=True)
        click.get_current_context().exit(INTERRUPTED_EXIT)


def _report_json(rep) -> dict:
    """The search report for ``--report``: status, objective, bound and gap with the run's
    timing and counters (``SolverReport.run_stats``)."""
    return {**rep.for_plan().model_dump(exclude_none=True), **rep.run_stats()}
