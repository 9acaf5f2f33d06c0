"""``planner validate CLUSTER``: check a cluster spec and summarise it."""

from __future__ import annotations

import click

from planner import api
from planner.api import format_bandwidth, format_bytes
from planner.cli.common import console, echo_json
from planner.cli.tables import Table


def _not_a_plan(path: str) -> None:
    """A plan file given for the cluster: one clear error, not a list of its keys unknown to
    a cluster spec (a sweep got 16 of them)."""
    import json
    from pathlib import Path

    from planner.errors import InputError, Location
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return          # not a JSON file: the cluster loader reports what it is
    if isinstance(data, dict) and str(data.get("schema", "")).startswith("planner.plan/"):
        raise InputError(f"this is a plan ({data['schema']}), not a cluster spec: validate takes the cluster; "
                         "check a plan against its cluster with `planner evaluate CLUSTER PLAN`", Location(path, 1, 1))


@click.command()
@click.argument("cluster_file", metavar="CLUSTER", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def validate(cluster_file: str, as_json: bool) -> None:
    """Check a cluster spec and the profile files its ``profiles:`` names; print GPUs per type
    and zone, peak PFLOP/s, memory, links and profiles."""
    _not_a_plan(cluster_file)
    cluster = api.load_cluster(cluster_file)
    summary = api.summarize_cluster(cluster)
    # a bad profile file fails here, not at the first `plan` that reads it
    loaded = api.resolve_profiles(cluster, None)
    summary["profiles"] = [{"gpu_type": p.gpu_type, "path": p.path, "dtype": p.profile.dtype,
                            "entries": len(p.profile.entries)} for p in (loaded.profiles if loaded else [])]
    if as_json:
        echo_json(summary)
        return
    out = console()
    out.print(f"[bold]{cluster.name}[/bold]: {summary['num_gpus']} GPUs in {summary['num_nodes']} nodes, "
              f"{len(summary['zones'])} zone(s) — valid")
    table = Table(title="GPUs by type and zone")
    for col in ("zone", "GPU type", "nodes", "GPUs", "GPUs/node", "peak PFLOP/s", "memory", "NIC/node",
                "USD/h"):
        table.add_column(col, justify="right" if col not in ("zone", "GPU type") else "left")
    for row in summary["groups"]:
        table.add_row(row["zone"], row["gpu_type"], str(row["nodes"]), str(row["gpus"]),
                      str(row["gpus_per_node"]), f"{row['peak_pflops']:.2f}",
                      format_bytes(row["memory_bytes"]), format_bandwidth(row["network_Bps"]),
                      "-" if row["usd_per_hour"] is None else f"{row['usd_per_hour']:.2f}")
    out.print(table)
    out.print(f"total peak {summary['peak_pflops']:.2f} PFLOP/s (dense bf16, or fp16 where a GPU has no bf16), "
              f"GPU memory {format_bytes(summary['memory_bytes'])}")
    if summary["links"]:
        links = Table(title="Links between zones")
        for col in ("between", "bandwidth", "aggregate", "latency", "egress USD/GB"):
            links.add_column(col)
        for link in summary["links"]:
            links.add_row(" <-> ".join(link["between"]), format_bandwidth(link["bandwidth_Bps"]),
                          "-" if link["aggregate_bandwidth_Bps"] is None
                          else format_bandwidth(link["aggregate_bandwidth_Bps"]),
                          f"{link['latency_s'] * 1e3:.3g} ms", f"{link['egress_price_per_gb_usd']:.3g}")
        out.print(links)
    for row in summary["profiles"]:
        out.print(f"profile for {row['gpu_type']}: {row['path']} ({row['dtype']}, {row['entries']} entries)")
