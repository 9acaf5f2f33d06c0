"""``planner replan CLUSTER PLAN``: check an existing plan against a changed cluster and search
again; the old plan (repaired after lost nodes) stays the answer unless the fresh one wins
with its migration counted (docs/replan.md).  A CI gate: exit 0 when the old plan still runs, 4 when it no longer does (a new plan was
found), 1 when no plan fits the new cluster, 2 for bad input."""

from __future__ import annotations

import click

from planner.cli.common import (
    check_writable,
    console,
    echo_json,
    warn_precision,
    warn_wall_clock,
    write_atomic,
)

# Not 1 (no feasible plan) nor 2 (bad input): CI can tell "re-deploy" from "broken".
OLD_PLAN_INVALID_EXIT = 4
NO_PLAN_EXIT = 1    # InfeasibleError's, as the CLI maps it (planner.errors)


def gap_text(gap: float | None) -> str:
    """The search's gap as ``planner plan`` prints it: below the solvers' tolerance (1e-9) it is
    rounding noise and reads 0% (``1.67e-14%`` was printed)."""
    return "n/a" if gap is None else "0%" if gap <= 1e-9 else f"{100 * gap:.3g}%"


@click.command()
@click.argument("cluster_file", metavar="CLUSTER", type=click.Path(dir_okay=False))
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--time-limit", "time_limit_s", type=float, default=60.0, show_default=True,
              help="Seconds for the new search.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the new plan here.")
@click.option("--profiles", "profiles_dir", type=click.Path(), help="Measured per-layer costs.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
@click.option("--calibration", "calibration_path", type=click.Path(dir_okay=False), default=None,
              help="calibration file from `planner profile --calibrate` (default: the shipped fit)")
@click.option("--migration-steps", type=int, default=None,
              help="Add the migration's time to the objective, spread over this many training steps.")
@click.option("--max-moved-fraction", type=float, default=None,
              help="Accept no plan that moves more than this share (0-1) of weights + optimizer state; "
                   "the old plan repaired is the fallback.")
@click.option("--deterministic", is_flag=True,
              help="stop the search on a work budget, not the clock (as planner plan --deterministic)")
@click.option("--work-budget", type=int, default=None, metavar="UNITS",
              help="the deterministic search's work budget (implies --deterministic)")
def replan(cluster_file, plan_file, time_limit_s, output, profiles_dir, as_json, calibration_path,
           migration_steps, max_moved_fraction, deterministic, work_budget):
    """Re-plan for a changed cluster and compare with the old plan.

    Exit 0: the old plan still runs; 4: it no longer does (the new plan is written with -o);
    1: no plan fits the new cluster; 2: bad input, an old plan inconsistent in itself included
    (blocks, shares, batch, its model, a GPU type known nowhere: what no cluster change explains)."""
    from planner import api
    from planner.errors import InfeasibleError

    if output:      # before the search, not after it
        check_writable(output)
    cluster = api.load_cluster(cluster_file)
    old = api.load_plan(plan_file)
    warn_precision(cluster, str(old.inputs.training.get("precision", "bf16")))
    try:
        result = api.replan(cluster, old, time_limit_s=time_limit_s, profiles=profiles_dir, file=plan_file,
                            migration_steps=migration_steps, max_moved_fraction=max_moved_fraction,
                            deterministic=deterministic, work_budget=work_budget,
                            calibration=calibration_path)
    except InfeasibleError as exc:
        if as_json:     # a CI gate reads stdout: it gets the verdict, not an empty page
            echo_json({"status": "no-plan", "exit_code": NO_PLAN_EXIT, "reason": str(exc)})
        raise
    new_ev = result.evaluation
    warn_wall_clock(result.search.report, time_limit_s)
    if output:
        write_atomic(output, result.plan.dumps())
    summary = {
        "old_plan_valid": result.old_valid,
        "old_plan_problems": result.old_problems,
        "old_tokens_per_s": None if result.old_evaluation is None else result.old_evaluation.tokens_per_s,
        "new_tokens_per_s": new_ev.tokens_per_s,
        "speedup": result.speedup,
        "answer": result.chosen.source,
        "fresh_tokens_per_s": result.fresh.evaluation.tokens_per_s,
        "vs_fresh": result.vs_fresh,
        "migration": result.migration.as_dict(),
        "fresh_migration": result.fresh.migration.as_dict(),
        "fresh_as_named_moved_bytes": result.fresh_as_named.moved_bytes,
        "rejected": result.rejected,
        "devices_kept_in_stage": result.kept_devices,
        "devices_moved": result.moved_devices,
        "devices_added": result.added_devices,
        "devices_removed": result.removed_devices,
        "solver_status": result.search.report.status,
        # the old plan was the search's first incumbent: nothing beat it when true
        "search_kept_old_plan": bool((result.search.report.model_extra or {}).get("answer_is_given", False)),
        "gap": result.search.report.gap,
    }
    if as_json:
        echo_json(summary)
    else:
        out = console()
        if result.old_valid:
            out.print(f"old plan: still valid, {summary['old_tokens_per_s']:,.0f} tokens/s on this cluster")
        else:
            out.print("[bold red]old plan no longer runs on this cluster:[/bold red]")
            for line in result.old_problems:
                out.print(f"  {line}")
        fresh = result.fresh.evaluation.tokens_per_s
        out.print(f"fresh search: {fresh:,.0f} tokens/s ({result.search.report.status}, gap "
                  f"{gap_text(result.search.report.gap)})")
        mig = result.migration
        out.print(f"answer: {result.chosen.source}, {new_ev.tokens_per_s:,.0f} tokens/s "
                  f"({result.vs_fresh:.3f}x the fresh plan"
                  + ("" if result.speedup is None else f", {result.speedup:.3f}x the old plan") + ")")
        out.print(f"moves {mig.moved_bytes / 1e9:,.3g} GB of {mig.total_bytes / 1e9:,.3g} GB of weights + optimizer "
                  f"state ({mig.moved_fraction:.1%}), {mig.time_s:.3g} s on the cluster's links"
                  + (f", {mig.from_checkpoint_bytes / 1e9:,.3g} GB from a checkpoint" if mig.from_checkpoint_bytes else "")
                  + f"; the fresh plan would move {result.fresh.migration.moved_bytes / 1e9:,.3g} GB")
        for line in result.rejected:
            out.print(f"  not taken: {line}")
        out.print(f"{result.kept_devices} devices keep their stage, {len(result.moved_devices)} move to another "
                  f"stage, {len(result.added_devices)} added, {len(result.removed_devices)} removed")
        if output:
            out.print(f"wrote {output}")
    click.get_current_context().exit(0 if result.old_valid else OLD_PLAN_INVALID_EXIT)
