"""``planner launch PLAN --format ...``: the files that start a plan with a launcher."""

from __future__ import annotations

import click

from planner import api
from planner.cli.common import console, echo_json


@click.command()
@click.argument("plan_file", metavar="PLAN", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", required=True,
              type=click.Choice(["torchrun", "megatron", "deepspeed", "pipelining", "torchtitan"]),
              help="Which launcher's inputs to write.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False),
              help="Folder to write the files to (all or none); an earlier launch's files there "
                   "that this one does not overwrite are removed with it, unless changed since the "
                   "planner wrote them (an older rank map, without checksums: its node scripts are "
                   "all kept, with a warning). Without -o the files are printed.")
@click.option("--master-addr", help="Host name or IP of node rank 0, reachable from every node (default on a single node: localhost).")
@click.option("--master-port", type=click.IntRange(1, 65535), default=29500, show_default=True)
@click.option("--script", help="Training script the launcher runs "
              "(default: pretrain_gpt.py for megatron, train.py otherwise).")
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False),
              help="Cluster spec: GPUs per node, so CUDA_VISIBLE_DEVICES is set exactly when a "
                   "node is used in part; the plan is checked against it as `evaluate` checks it "
                   "(devices, GPU types).")
@click.option("--schedule-csv", is_flag=True,
              help="pipelining / torchtitan: run the schedule from its per-rank action CSV "
                   "(torch's _PipelineScheduleRuntime) even where torch has a schedule class.")
@click.option("--json", "as_json", is_flag=True, help="Print {file name: content} as JSON.")
def launch(plan_file: str, fmt: str, out_dir: str | None, master_addr: str | None,
           master_port: int, script: str | None, cluster_file: str | None, schedule_csv: bool,
           as_json: bool) -> None:
    """Write torchrun / Megatron-LM / DeepSpeed / torch.distributed.pipelining / torchtitan
    inputs for PLAN."""
    plan = api.load_plan(plan_file)
    cluster = api.load_cluster(cluster_file) if cluster_file else None
    files = api.launch(plan, fmt, master_addr=master_addr, master_port=master_port,
                       script=script, cluster=cluster, schedule_csv=schedule_csv, file=plan_file)
    if out_dir:
        # node scripts of an earlier launch left beside these would start with `node*.sh`
        written = api.write_files(files, out_dir, replace_launch=True)
        _report_written(written, out_dir, as_json)
        return
    if as_json:
        echo_json(files)
        return
    for name in sorted(files):
        click.echo(f"==> {name} <==")
        click.echo(files[name], nl=False)


def _report_written(written, out_dir: str, as_json: bool) -> None:
    if written.kept:
        n = len(written.kept)
        # click.echo, not rich: a warning stays one line whatever the terminal width.
        click.echo(f"warning: kept {_count(n, 'file')} of an earlier launch in {out_dir} that "
                   f"{_was(n)} changed since the planner wrote {_them(n)}: {_names(written.kept)}; "
                   f"delete {_them(n)} if stale (a node script among them would still start with "
                   "node*.sh)", err=True)
    if written.unchecked:
        n = len(written.unchecked)
        click.echo(f"warning: kept {_count(n, 'node script')} of an earlier launch in {out_dir} "
                   f"(an older rank map records no checksums; delete {_them(n)} yourself if stale): "
                   f"{_names(written.unchecked)}", err=True)
    if as_json:
        echo_json({"written": [str(p) for p in written], "removed": [str(p) for p in written.removed],
                   "kept": [str(p) for p in [*written.kept, *written.unchecked]]})
        return
    out = console(quiet=True)
    out.print(f"wrote {_count(len(written), 'file')} to {out_dir}: {_names(written)}")
    if written.removed:
        out.print(f"removed {_count(len(written.removed), 'file')} of an earlier launch: {_names(written.removed)}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _was(n: int) -> str:
    return "was" if n == 1 else "were"


def _them(n: int) -> str:
    return "it" if n == 1 else "them"


def _names(paths) -> str:
    return ", ".join(p.name for p in paths)
