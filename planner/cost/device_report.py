"""The cost model's predictions for the measured device checks: ``python -m planner.cost.device_report``.

A device check (scripts/device_check.sh on a lent GPU) leaves its raw results in
``reference/device/<gpu>-<date>/``; this report sets the model's prediction beside each
measured figure.  Nothing here is fitted: the shipped calibration (planner/cost/calibration.yaml,
fitted on vtrain-single and megatron-core-h100 only, issue "Truth") prices every row, so these are
predictions in the same sense as vtrain-multi's and Sailor's.

Three kinds of rows:
- blocks (and heads) of a ``planner profile`` file, priced as the profile measured them: its
  dtype as the precision, flash attention for measure.py's fused SDPA core, the plain loss for
  its head's ``F.cross_entropy(logits.float(), ...)`` (calibrate.Measured);
- single GEMMs of ``planner.profile.gemm_sweep`` (each re-predicted by the model in use, not the
  figure stored at measuring time), by FLOPs decade: median signed error and count;
- a plan trained with the reference runner: ``planner evaluate``'s iteration time against the
  median measured step after the first (the first step pays allocation and cuBLAS warm-up).
  The runner's blocks compute attention unfused (planner/launch/tiny_model.py: scores, mask,
  softmax, context as separate kernels), which is the model's flash_attention=False, and its
  loss is ``F.cross_entropy`` on the fp32 logits, the plain kernel.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# every folder a device check left (scripts/device_check.sh), not a list to keep up by hand
DEVICE_DIRS = tuple(sorted(p for p in (ROOT / "reference" / "device").glob("*") if p.is_dir()))


@dataclass(frozen=True)
class LayerRow:
    model: str
    layer: str
    micro_batch: int
    measured_forward_s: float
    measured_backward_s: float
    predicted_forward_s: float
    predicted_backward_s: float

    @property
    def forward_error(self) -> float:
        return self.predicted_forward_s / self.measured_forward_s - 1

    @property
    def backward_error(self) -> float:
        return self.predicted_backward_s / self.measured_backward_s - 1


@dataclass(frozen=True)
class GemmBucket:
    source: str          # "<model> <dtype>"
    flops_decade: int    # rows with 10^d <= FLOPs < 10^(d+1)
    rows: int
    median_error: float  # (predicted - measured) / measured; negative: predicted too fast
    best_measured_tflops: float
    above_floor: int     # rows measured at >= FLOOR_MULTIPLE x the sweep's fastest GEMM
    above_floor_median_error: float | None


# A GEMM timed alone with one CUDA-event pair includes the host's dispatch and launch of that one
# kernel: the sweep's fastest GEMM (~20 us on the H200 for ~1e8 FLOPs, 2 us of tensor-core work)
# is that floor.  Rows measured at 5x the floor or more show the curve itself.
FLOOR_MULTIPLE = 5.0


@dataclass(frozen=True)
class PlanRow:
    name: str
    predicted_s: float
    measured_s: float    # median step after the first

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def _gpu(name: str):
    from planner import catalog
    return catalog.gpu(name)


def profile_rows(path: Path, calibration=None) -> list[LayerRow]:
    """Block and head entries of one profile beside the roofline's prediction (no profile)."""
    from planner.cost.compute import block_timing, head_timing
    from planner.cost.context import CostContext
    from planner.profile.calibrate import Measured
    from planner.profile.store import parse_profile, profile_gpu_type
    from planner.spec.model import ModelSpec
    from planner.spec.source import load_yaml
    doc = load_yaml(path)
    prof = parse_profile(doc)
    gpu = _gpu(profile_gpu_type(prof, doc))
    model = ModelSpec(**prof.model.model_dump())
    how = Measured.of(prof)
    extra = {"calibration": calibration} if calibration is not None else {}
    ctx = CostContext(model=model, seq_len=prof.seq_len, precision=how.precision,
                      flash_attention=how.flash_attention, cross_entropy=how.cross_entropy, **extra)
    timing = {"block": block_timing, "head": head_timing}
    out = []
    for e in prof.entries:
        if e.layer not in timing or not e.fits:
            continue
        t = timing[e.layer](ctx, gpu, gpu.intra_node_bandwidth_Bps, e.tp, e.micro_batch)
        out.append(LayerRow(model.name, e.layer, e.micro_batch, e.forward_s, e.backward_s,
                            t.forward_s, t.backward_s))
    return out


def gemm_buckets(path: Path, calibration=None) -> list[GemmBucket]:
    from planner.cost.calibration import default_calibration
    from planner.cost.context import element_bytes
    from planner.cost.gemm import Gemm, gemm_curve
    data = json.loads(path.read_text())
    gpu = _gpu(data["gpu_type"])
    dtype = data["dtype"]
    cal = (calibration or default_calibration()).for_gpu(gpu)
    curve = gemm_curve(gpu, dtype, cal, element_bytes(dtype))
    floor = min(r["measured_s"] for r in data["rows"])
    by_decade: dict[int, list[tuple[float, float, bool]]] = {}
    for r in data["rows"]:
        g = Gemm(r["name"], r["m"], r["n"], r["k"], r["batch"])
        decade = math.floor(math.log10(g.flops))
        by_decade.setdefault(decade, []).append((curve.time_s(g) / r["measured_s"] - 1, r["measured_tflops"],
                                                 r["measured_s"] >= FLOOR_MULTIPLE * floor))
    source = f"{data['model']} {dtype}"
    out = []
    for d, v in sorted(by_decade.items()):
        above = [e for e, _, big in v if big]
        out.append(GemmBucket(source, d, len(v), statistics.median(e for e, _, _ in v), max(t for _, t, _ in v),
                              len(above), statistics.median(above) if above else None))
    return out


def plan_row(folder: Path, calibration=None) -> PlanRow | None:
    """The runner's plan re-evaluated by the model in use, beside its measured steady step."""
    plan_file, run_file = folder / "plan.json", folder / "run.json"
    if not (plan_file.exists() and run_file.exists()):
        return None
    from planner.cost.evaluate import context_for_plan, evaluate
    from planner.plan.check import load_plan
    from planner.spec import load_cluster, load_model
    plan = load_plan(plan_file)
    cluster = load_cluster(ROOT / "scripts" / f"{plan.inputs.cluster}.yaml")
    model = load_model(plan.inputs.model)
    # as the runner runs it whatever the plan says: unfused attention (its plan.json, written
    # before flash became the default, has no attention key, which reads unfused too), and
    # F.cross_entropy on its fp32 logits (tiny_model.head_loss_sum), the plain loss
    ctx = context_for_plan(plan, calibration, model=model, cross_entropy="plain", flash_attention=False)
    ev = evaluate(cluster, plan, model=model, check=False, ctx=ctx)
    steps = json.loads(run_file.read_text())["step_time_s"]
    training = plan.inputs.training
    name = (f"{model.name} {training['precision']} gbs {training['global_batch_size']} "
            f"mb {plan.micro_batch_size} x {plan.num_micro_batches}, 1 GPU")
    return PlanRow(name, ev.iteration_time_s, statistics.median(steps[1:]))


@dataclass(frozen=True)
class Report:
    folder: Path
    layers: list[LayerRow]
    gemms: list[GemmBucket]
    plan: PlanRow | None


def build(folder: Path, calibration=None) -> Report:
    layers = [r for p in sorted(folder.glob("profile-*.yaml")) for r in profile_rows(p, calibration)]
    gemms = [b for p in sorted(folder.glob("gemms-*.json")) for b in gemm_buckets(p, calibration)]
    return Report(folder, layers, gemms, plan_row(folder, calibration))


def format_report(rep: Report) -> str:
    rel = rep.folder.relative_to(ROOT) if rep.folder.is_relative_to(ROOT) else rep.folder
    lines = [f"device check {rel}: predictions (shipped calibration, not fitted to these rows)",
             "", (f"{'model':<12}{'layer':<7}{'mb':>3}{'fwd meas':>11}{'pred':>9}{'err':>8}"
             f"{'bwd meas':>11}{'pred':>9}{'err':>8}{'bwd/fwd meas':>14}{'pred':>6}"), "-" * 98]
    for r in rep.layers:
        lines.append(f"{r.model:<12}{r.layer:<7}{r.micro_batch:>3}{1e3 * r.measured_forward_s:>9.3f}ms"
                     f"{1e3 * r.predicted_forward_s:>8.3f}{100 * r.forward_error:>+7.1f}%"
                     f"{1e3 * r.measured_backward_s:>9.3f}ms{1e3 * r.predicted_backward_s:>8.3f}"
                     f"{100 * r.backward_error:>+7.1f}%"
                     f"{r.measured_backward_s / r.measured_forward_s:>13.2f}x"
                     f"{r.predicted_backward_s / r.predicted_forward_s:>5.2f}x")
    blocks = [r for r in rep.layers if r.layer == "block"]
    if blocks:
        lines.append(f"blocks: mean |error| of fwd+bwd {100 * block_error(rep):.1f}% over {len(blocks)} entries")
    lines += ["", ("single GEMMs (one CUDA-event pair each), error by FLOPs decade; 'above floor': rows "
              f"measured at >= {FLOOR_MULTIPLE:g}x the sweep's fastest GEMM (its launch floor)"),
              (f"{'sweep':<22}{'FLOPs':>8}{'rows':>6}{'median err':>12}{'best TFLOP/s':>14}"
              f"{'above floor':>13}{'median err':>12}"), "-" * 87]
    for b in rep.gemms:
        above = "" if b.above_floor_median_error is None else f"{100 * b.above_floor_median_error:>+11.1f}%"
        lines.append(f"{b.source:<22}{'1e' + str(b.flops_decade):>8}{b.rows:>6}{100 * b.median_error:>+11.1f}%"
                     f"{b.best_measured_tflops:>14.0f}{b.above_floor:>13}{above:>12}")
    if rep.plan is not None:
        p = rep.plan
        lines += ["", (f"reference runner: {p.name}: predicted {p.predicted_s:.3f} s/iteration, "
                  f"measured {p.measured_s:.3f} s (median after step 1), error {100 * p.error:+.1f}%")]
    return "\n".join(lines)


def block_error(rep: Report) -> float:
    """Mean |relative error| of block forward + backward over the report's profile entries."""
    rows = [r for r in rep.layers if r.layer == "block"]
    return statistics.fmean(abs((r.predicted_forward_s + r.predicted_backward_s)
                                / (r.measured_forward_s + r.measured_backward_s) - 1) for r in rows)


def device_checks_summary(calibration=None) -> dict:
    """Per GPU type: what each committed device check measured and the model's error on it, by
    precision (what planner.cost.trust reads from validation.yaml, as ``device_checks``).
    Blocks: mean |error| of forward + backward over the profiled block entries; runner: the
    one-GPU plan's iteration time.  All predicted with the shipped calibration, none fitted."""
    from planner.profile.store import parse_profile, profile_gpu_type
    from planner.spec.source import load_yaml
    out: dict[str, list[dict]] = {}
    for folder in DEVICE_DIRS:
        rel = folder.relative_to(ROOT).as_posix()
        rows: dict[tuple[str, str], list[LayerRow]] = {}
        for path in sorted(folder.glob("profile-*.yaml")):
            doc = load_yaml(path)
            prof = parse_profile(doc)
            key = (profile_gpu_type(prof, doc), prof.dtype)
            rows.setdefault(key, []).extend(r for r in profile_rows(path, calibration) if r.layer == "block")
        for (gpu, dtype), blocks in sorted(rows.items()):
            err = block_error(Report(folder, blocks, [], None))
            out.setdefault(gpu, []).append({"folder": rel, "gpus": 1, "precision": dtype, "kind": "blocks",
                                            "rows": len(blocks), "mape_percent": round(100 * err, 1)})
        plan = plan_row(folder, calibration)
        if plan is not None:
            data = json.loads((folder / "plan.json").read_text())
            gpus = sorted({r["gpu_type"] for st in data["stages"] for r in st["replicas"]})
            devices = {d for st in data["stages"] for r in st["replicas"] for d in r["devices"]}
            for gpu in gpus:
                out.setdefault(gpu, []).append({
                    "folder": rel, "gpus": len(devices), "precision": data["inputs"]["training"]["precision"],
                    "kind": "runner", "rows": 1, "mape_percent": round(100 * abs(plan.error), 1)})
    return dict(sorted(out.items()))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folders = [Path(a).resolve() for a in args] or list(DEVICE_DIRS)
    print("\n\n".join(format_report(build(f)) for f in folders))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
