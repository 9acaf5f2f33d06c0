"""``planner schedule CLUSTER PLAN --latency-aware [--exact] -o OUT``: rewrite a plan's
pipeline schedule as per-rank action lists that hide slow-link sends (CrossPipe, issue 17),
and print the predicted time before and after and the greedy / exact gap."""

from __future__ import annotations

import click

from planner.cli.common import check_writable, console, echo_json, warn_precision, write_atomic


@click.command()
@click.argument("cluster_file", metavar="CLUSTER", type=click.Path(dir_okay=False))
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--latency-aware", "latency_aware", is_flag=True,
              help="Order each rank's F / I / W so sends over slow links are hidden (the one rewrite "
                   "there is; required so that later ones can be added by name).")
@click.option("--exact", is_flag=True,
              help="Also solve the MILP (pulp + HiGHS; at most 120 actions, 3 x stages x micro-batches) and "
                   "report the greedy's gap to its proved bound; the plan takes the better schedule.")
@click.option("--memory-cap", type=int, default=None,
              help="Micro-batches a rank may hold from F until W (default: per rank the plan's own peak, "
                   "at most min(micro-batches, stages); 1F1B: stages - s on stage s).")
@click.option("--time-limit", "time_limit_s", type=float, default=30.0, show_default=True,
              help="Seconds for --exact.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the new plan here.")
@click.option("--profiles", "profiles_path", type=click.Path(), default=None, help="Measured per-layer costs.")
@click.option("--json", "as_json", is_flag=True, help="Print before / after and the gap as JSON.")
def schedule(cluster_file, plan_file, latency_aware, exact, memory_cap, time_limit_s, output,
             profiles_path, as_json):
    """Rewrite PLAN's pipeline schedule for CLUSTER."""
    from planner import api
    from planner.errors import InfeasibleError, InputError

    if not latency_aware:
        raise InputError("say which schedule to write: --latency-aware (the one this command builds)")
    api.check_time_limit(time_limit_s)     # as `plan` does, before reading or writing anything
    if output:
        check_writable(output)
    cluster = api.load_cluster(cluster_file)
    plan = api.load_plan(plan_file)
    warn_precision(cluster, str(plan.inputs.training.get("precision", "bf16")), plan)
    res = api.latency_schedule(cluster, plan, exact=exact, memory_cap=memory_cap, time_limit_s=time_limit_s,
                               profiles=profiles_path, file=plan_file)
    caps = ",".join(map(str, res.memory_cap)) if len(set(res.memory_cap)) > 1 else str(res.memory_cap[0])
    if not res.after.fits:
        raise InfeasibleError(_does_not_fit(plan_file, res))
    if output:
        write_atomic(output, res.plan.dumps())
    if as_json:
        echo_json(res.to_json())
        return
    out = console()
    b, a = res.before, res.after
    out.print(f"before: {b.schedule}, pipeline {b.pipeline_time_s:.4f} s (cost model), "
              f"{res.before_retimed_s:.4f} s with non-blocking sends; iteration {b.iteration_time_s:.4f} s")
    out.print(f"after:  latency-aware ({res.method}, memory cap {caps} micro-batches a rank), pipeline "
              f"{a.pipeline_time_s:.4f} s; iteration {a.iteration_time_s:.4f} s "
              f"({b.iteration_time_s / a.iteration_time_s:.3f}x)")
    if res.whole_backward_stages:
        out.print(f"stage(s) {_listed(res.whole_backward_stages)} run whole backwards (B, not I then W): "
                  "split, their weight-op gradients held from I until W would not fit memory")
    if res.exact is None:
        out.print(f"greedy ({res.greedy_rule}): {res.greedy_s:.4f} s; --exact for its gap to the optimum")
    else:
        e = res.exact
        exact_s = "none found" if e.makespan_s is None else f"{e.makespan_s:.4f} s"
        out.print(f"greedy ({res.greedy_rule}) {res.greedy_s:.4f} s, exact {exact_s} ({e.status}, bound "
                  f"{e.bound_s:.4f} s, {e.wall_s:.1f} s): gap {100 * res.gap:.2f}%")
    if output:
        out.print(f"wrote {output}")


def _listed(stages) -> str:
    return ", ".join(map(str, stages))


def _does_not_fit(plan_file: str, res) -> str:
    """Why the rewrite does not fit and what could help: a smaller cap only where an
    overflowing rank holds more than one micro-batch (at one, no order holds less)."""
    over = sorted(res.over_memory_stages)
    caps = {s: res.memory_cap[s] for s in over}
    whole = [s for s in over if s in res.whole_backward_stages]
    text = (f"{plan_file}: the latency-aware schedule does not fit in memory; nothing written:\n  "
            + "\n  ".join(res.after.memory_problems))
    if whole:
        text += (f"\nstage(s) {_listed(whole)} already run whole backwards (B), holding no weight-op "
                 "gradients past their backward; what overflows is the activations of the micro-batches "
                 "they hold from F until B")
    if not res.before.fits:
        return text + f"\n{plan_file} itself does not fit ({res.before.schedule}): fix the plan first"
    if any(cap > 1 for cap in caps.values()):
        return text + ("\ntry a smaller --memory-cap (caps on the overflowing stages: "
                       + ", ".join(f"stage {s}: {c}" for s, c in caps.items()) + ")")
    return text + ("\nat one micro-batch a rank no order holds less: keep the plan's own schedule, or plan "
                   "with more stages")
