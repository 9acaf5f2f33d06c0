"""``planner pareto CLUSTER --model M ...``: the plans on the front of USD/hour against
tokens/s, as a table, JSON (``--json``) and a matplotlib picture (``--plot FILE``)."""

from __future__ import annotations

import click

from planner.cli.common import check_writable, console, echo_json, job_options
from planner.cli.tables import Table


@click.command()
@click.argument("cluster", type=click.Path(dir_okay=False))
@job_options
@click.option("--floors", type=int, default=4, show_default=True,
              help="tokens/s floors searched between the cheapest plan per token and the fastest")
@click.option("--time-limit", "time_limit_s", type=float, default=60.0, show_default=True,
              help="seconds for all the searches together (floors + 2 of them, shared evenly)")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="draw the front here (.png or .svg; needs matplotlib)")
@click.option("--json", "as_json", is_flag=True, help="print the front (with each plan) as JSON")
def pareto(cluster, model_name, training_path, global_batch_size, seq_len, precision, attention, cross_entropy,
           elementwise, floors, time_limit_s, plot_path, as_json):
    """The plans no other beats on both USD/hour and tokens/s, by tokens/s: the slowest (on a
    front also the cheapest per hour) first, the fastest last."""
    from planner import api
    from planner.api import check_plot_path, check_time_limit, plot_front
    from planner.api import pareto as sweep
    from planner.cli.plan import _training

    check_time_limit(time_limit_s)
    if plot_path:
        check_plot_path(plot_path)
        check_writable(plot_path)
    spec = api.load_cluster(cluster)
    model = api.load_model(model_name)
    training = _training(training_path, global_batch_size, seq_len, precision, attention, cross_entropy,
                         elementwise)
    points = sweep(spec, model, training, floors=floors, time_limit_s=time_limit_s)
    if plot_path:
        plot_front(points, plot_path, f"{model.name} on {spec.name}: USD/hour against tokens/s")
    if as_json:
        echo_json([p.to_json() for p in points])
        return
    t = Table(title="Plans on the front (USD/hour against tokens/s)", title_justify="left")
    for col in ("tokens/s", "USD/h", "USD/M tokens", "p", "schedule", "found by", "status"):
        t.add_column(col, justify="right" if col in ("tokens/s", "USD/h", "USD/M tokens", "p") else "left")
    for p in points:
        gap = "" if p.gap is None or p.gap <= 1e-9 else f" (gap {100 * p.gap:.2g}%)"
        t.add_row(f"{p.tokens_per_s:,.0f}", f"{p.usd_per_hour:,.2f}",
                  f"{p.usd_per_hour / 3600 / p.tokens_per_s * 1e6:,.4f}", str(p.plan.num_stages),
                  p.plan.schedule, p.objective, p.status + gap)
    out = console()
    out.print(t)
    if plot_path:
        out.print(f"wrote {plot_path}")
