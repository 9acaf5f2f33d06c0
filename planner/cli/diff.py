"""``planner diff A.json B.json``: what changed between two plans, as a table or ``--json``.
Exit 0 whether or not they differ (the JSON's ``same`` says which); 2 for bad input.  Plans for
different jobs get a warning on stderr (the JSON's ``comparable`` and ``warnings``)."""

from __future__ import annotations

import json

import click

from planner.cli.common import console, echo_json

SHA_SHOWN = 12  # hex digits of a cluster fingerprint in the table, as git abbreviates a commit


def _show(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.6g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


@click.command()
@click.argument("a_file", metavar="A", type=click.Path(dir_okay=False))
@click.argument("b_file", metavar="B", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON on stdout.")
def diff(a_file, b_file, as_json):
    """Show what changed from plan A to plan B: the inputs (model, training settings, cluster),
    degrees, stages, blocks, devices per stage, schedule, micro-batches and the predicted time,
    throughput and cost."""
    from rich.table import Table

    from planner import api
    result = api.diff(api.load_plan(a_file), api.load_plan(b_file))
    for line in result.warnings():
        # click.echo, not rich: a warning stays one line whatever the terminal width.
        click.echo(f"warning: {line}", err=True)
    if as_json:
        echo_json(result.as_dict())
        return
    out = console()
    if result.same:
        out.print("the plans are the same")
        return
    table = Table("what", "A", "B", title=f"{a_file} -> {b_file}")
    for row in result.inputs:
        a, b = row["a"], row["b"]
        if row["field"] == "cluster_sha256":
            a, b = a[:SHA_SHOWN], b[:SHA_SHOWN]
        table.add_row(f"input {row['field']}", _show(a), _show(b))
    for row in result.settings:
        table.add_row(row["field"], _show(row["a"]), _show(row["b"]))
    for row in result.stages:
        table.add_row(f"stage {row['stage']} {row['field']}", _show(row["a"]), _show(row["b"]))
    for row in result.predicted:
        ratio = "" if row["ratio"] is None else f" ({row['ratio']:.4g}x)"
        table.add_row(f"predicted {row['field']}", _show(row["a"]), _show(row["b"]) + ratio)
    out.print(table)
    if result.devices_added or result.devices_removed or result.devices_moved:
        out.print(f"devices: {len(result.devices_added)} added, {len(result.devices_removed)} removed, "
                  f"{len(result.devices_moved)} in another stage")
