"""``planner profile``: measure per-layer costs on this machine, or calibrate the roofline.

torch is imported only when a measurement runs (planner.profile.measure), so ``planner --help``
and the other commands stay light.
"""

from __future__ import annotations

import shlex
import sys

import click
import yaml

from planner.cli.common import check_writable, console, echo_json, write_atomic
from planner.errors import InputError


def _int_list(flag: str, text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise InputError(f"{flag} {text!r}: give positive integers separated by commas, e.g. 1,2,4")
    return sorted(set(values))


def dump_yaml(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=100)


@click.command("profile")
@click.option("--model", "model_name", help="catalog model name or a model YAML file")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="where to measure [default: cuda when torch sees one, else cpu]")
@click.option("--micro-batch", "micro_batch", default="1,2,4,8", show_default=True,
              help="micro-batch sizes (sequences), comma-separated")
@click.option("--tp", default="1", show_default=True, help="tensor-parallel degrees, comma-separated")
@click.option("--seq-len", type=click.IntRange(min=1), default=None,
              help="tokens per sequence [default: the model's max_seq_len, else 2048]")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32", "tf32"]), default=None,
              help="tf32: fp32 tensors, matmuls on TF32 tensor cores  [default: bf16 on cuda, fp32 on cpu]")
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True,
              help="timed runs per entry (the median is kept)")
@click.option("--warmup", type=click.IntRange(min=0), default=None,
              help="untimed runs before timing  [default: 3; with --from-run: steps left out, 1]")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="torch threads on cpu (the reference runner uses 1 per process)")
@click.option("--concurrent", type=click.IntRange(min=1), default=1, show_default=True,
              help="cpu: measure as one of N processes running the same layers at once (the "
                   "ranks of a CPU job share the machine); wall-clock times")
@click.option("--gpu-type", default=None,
              help="GPU type the profile counts for (catalog id or an inline GPU's name); "
                   "default: the device name looked up in the catalog, 'cpu' on cpu")
@click.option("--calibrate", "calibrate_path", default=None, metavar="PROFILE.yaml",
              help="instead of measuring: fit the roofline efficiency of the profile's GPU type")
@click.option("--cluster", "cluster_path", default=None, metavar="CLUSTER.yaml",
              help="with --calibrate: a cluster spec holding the inline GPU type (e.g. cpu); "
                   "with --from-run: the cluster the plan ran on (required)")
@click.option("--from-run", "from_run", default=None, metavar="MEASUREMENTS.json",
              help="instead of measuring layers: derive profiles from the file `planner run PLAN "
                   "--measurements FILE` wrote (needs --plan, --cluster; -o is a folder)")
@click.option("--plan", "plan_path", default=None, metavar="PLAN.json",
              help="with --from-run: the plan the measurements are of")
@click.option("-o", "--output", default=None, help="file to write (profile or calibration YAML); "
              "with --from-run a folder, one <gpu-type>.yaml per GPU type")
@click.option("--note", default=None, help="free text kept in the file's provenance (conditions, "
              "e.g. 'run under chrt -r 1')")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON on stdout")
@click.option("--quiet", is_flag=True, help="no progress output")
def profile(model_name, device, micro_batch, tp, seq_len, dtype, repeats, warmup, threads, concurrent,
            gpu_type, calibrate_path, cluster_path, from_run, plan_path, output, note, as_json, quiet):
    """Measure forward/backward time and memory of the embedding, one block and the head (or,
    with --from-run, derive them from a training run's measured step times)."""
    out = console(quiet=as_json)
    if from_run:
        _from_run(from_run, plan_path, cluster_path, output, 1 if warmup is None else warmup, note,
                  as_json, quiet)
        return
    warmup = 3 if warmup is None else warmup
    if output:      # before minutes of measuring, not after
        check_writable(output)
    if calibrate_path:
        from planner.api import calibrate_file, load_cluster
        cluster = load_cluster(cluster_path) if cluster_path else None
        result = calibrate_file(calibrate_path, gpu_type=gpu_type, cluster=cluster)
        text = dump_yaml(result.to_yaml_data())
        if output:
            write_atomic(output, text)
            if not quiet:
                out.print(f"wrote {output}")
        if as_json:
            echo_json(result.to_yaml_data())
        elif not output:
            click.echo(text, nl=False)
        if not quiet:
            out.print(result.summary())
        if result.poor_fit:
            click.echo(f"warning: the fit still misses the profile's block times by {result.error_after:.0%} on "
                       "average: the roofline's shape does not describe them (timing noise, another "
                       "kernel choice per size?); check the profile before using this calibration", err=True)
        return
    if not model_name:
        raise InputError("--model is required (a catalog model name or a model YAML file), "
                         "unless --calibrate is given")
    if not output:
        raise InputError("-o/--output is required: the profile file to write, e.g. profiles/NAME.yaml")
    from planner.api import load_model
    model = load_model(model_name)
    mbs = _int_list("--micro-batch", micro_batch)
    tps = _int_list("--tp", tp)
    from planner.api import profiling as measure  # imports torch
    for degree in tps:
        why = measure.check_tp(model, degree)
        if why:
            raise InputError(f"--tp: {why}; valid degrees divide the model's heads and FFN size")
    if device is None:
        device = "cuda" if measure.torch.cuda.is_available() else "cpu"
    dtype = dtype or ("bf16" if device == "cuda" else "fp32")
    seq_len = seq_len or model.max_seq_len or 2048

    def progress(entry):
        if quiet or as_json:
            return
        if entry.fits:
            out.print(f"  {entry.layer:9} tp={entry.tp} mb={entry.micro_batch:<3} "
                      f"fwd {entry.forward_s * 1e3:9.3f} ms  bwd {entry.backward_s * 1e3:9.3f} ms  "
                      f"peak {entry.peak_memory_bytes / 2**20:9.1f} MiB"
                      + (f"  I {entry.backward_input_s * 1e3:.3f} / W {entry.backward_weight_s * 1e3:.3f} ms"
                         if entry.weight_fraction is not None else ""))
        else:
            out.print(f"  {entry.layer:9} tp={entry.tp} mb={entry.micro_batch:<3} out of memory")

    if not quiet and not as_json:
        out.print(f"profiling {model.name} on {device} ({dtype}, seq_len {seq_len}, "
                  f"{warmup} warm-up + {repeats} timed runs each)")
    command = "planner profile " + " ".join(shlex.quote(a) for a in sys.argv[2:]) \
        if len(sys.argv) > 1 and sys.argv[1] == "profile" else None
    if note and not command:  # the command line, when known, already carries the note
        command = note
    result = measure.measure_profile(
        model, device, mbs, tps, seq_len, dtype, warmup=warmup, repeats=repeats, gpu_type=gpu_type,
        threads=threads if device == "cpu" else None, provenance=command, progress=progress,
        concurrent=concurrent)
    write_atomic(output, dump_yaml(result.to_yaml_data()))
    if as_json:
        echo_json(result.to_yaml_data())
    elif not quiet:
        out.print(f"wrote {output} ({len(result.entries)} entries, device {result.device.name}, "
                  f"GPU type {result.device.gpu_type})")


def _from_run(measurements, plan_path, cluster_path, output, warmup, note, as_json, quiet):
    """``planner profile --from-run``: profiles from a run's measurements (planner.profile.from_run)."""
    from pathlib import Path

    from planner import api

    for flag, value in (("--plan", plan_path), ("--cluster", cluster_path)):
        if not value:
            raise InputError(f"--from-run needs {flag}: the measurements name their plan only by "
                             "its sha256, and the cost model's layer ratio needs the plan's devices")
    if not output:
        raise InputError("-o/--output is required: the folder to write one profile per GPU type into")
    folder = Path(output)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"-o {output}: with --from-run this is a folder (one <gpu-type>.yaml per "
                         "GPU type), and a file of that name exists")
    check_writable(folder / "x.yaml")
    cluster = api.load_cluster(cluster_path)
    plan = api.load_plan(plan_path)
    result = api.profile_from_run(cluster, plan, measurements, file=plan_path, warmup=warmup, note=note)
    texts = {api.profile_file_name(g): dump_yaml(p.to_yaml_data()) for g, p in result.profiles.items()}
    first, *rest = sorted(texts)
    written = write_atomic(folder / first, texts[first], {name: texts[name] for name in rest})
    summary = {"files": sorted(str(p) for p in written), "steps_used": list(result.steps_used),
               "measured_over_predicted": result.scale,
               "entries": {g: len(p.entries) for g, p in result.profiles.items()}}
    if as_json:
        echo_json(summary)
    elif not quiet:
        out = console()
        for g, p in sorted(result.profiles.items()):
            out.print(f"{g}: {len(p.entries)} entries from steps {result.steps_used[0]}..{result.steps_used[1]}, "
                      f"measured / cost model {result.scale[g]:.2f}x  -> {folder / api.profile_file_name(g)}")
