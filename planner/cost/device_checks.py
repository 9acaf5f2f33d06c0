"""What the lent GPU machines measured, condensed for the trust statement (trust.py).

``device_checks.yaml`` beside this file is written by ``python -m planner.cost.device_checks``
from the results kept under ``reference/device/<gpu>-<date>/`` (scripts/device_check.sh): per
GPU type and precision, the cost model's mean error on the GEMMs that were timed (those of at
least ``MIN_GEMM_S``: shorter ones are mostly launch latency when timed alone) and on the one
plan the reference runner trained there.  A test keeps the file equal to a fresh run, so a
change of the model that moves these figures shows.  They are single-GPU checks: a GPU type
with nothing better than this is "micro-benchmarked", not "validated".
"""

from __future__ import annotations

import json
import statistics
import sys
from functools import lru_cache
from pathlib import Path

import yaml

CHECKS_FILE = Path(__file__).with_name("device_checks.yaml")
REFERENCE = Path(__file__).resolve().parents[2] / "reference" / "device"
MIN_GEMM_S = 50e-6


def _gemm_error(path: Path) -> tuple[str, str, int, float]:
    from planner import catalog
    from planner.cost.calibration import default_calibration
    from planner.cost.context import element_bytes
    from planner.cost.gemm import Gemm, gemm_curve
    data = json.loads(path.read_text())
    gpu = catalog.gpu(data["gpu_type"])
    curve = gemm_curve(gpu, data["dtype"], default_calibration().for_gpu(gpu), element_bytes(data["dtype"]))
    rows = [r for r in data["rows"] if r["measured_s"] >= MIN_GEMM_S]
    errs = [abs(curve.time_s(Gemm("g", r["m"], r["n"], r["k"], r["batch"])) - r["measured_s"]) / r["measured_s"]
            for r in rows]
    return gpu.name, data["dtype"], len(rows), statistics.fmean(errs) if errs else float("nan")


def _run_error(folder: Path) -> tuple[str, str, float] | None:
    """The trained plan's prediction against its median step (the first step left out)."""
    from planner.cost.evaluate import evaluate
    from planner.plan.check import load_plan
    from planner.spec import load_cluster
    plan_path, run_path = folder / "plan.json", folder / "run.json"
    if not (plan_path.exists() and run_path.exists()):
        return None
    plan = json.loads(plan_path.read_text())
    steps = json.loads(run_path.read_text())["step_time_s"][1:]
    cluster = Path(__file__).resolve().parents[2] / "scripts" / f"{plan['inputs']['cluster']}.yaml"
    predicted = evaluate(load_cluster(cluster), load_plan(plan_path)).iteration_time_s
    gpu = next(iter(t["gpu_type"] for t in plan["predicted"]["trust"]))
    return gpu, plan["inputs"]["training"]["precision"], (predicted - statistics.median(steps)) / statistics.median(steps)


def collect(reference: Path = REFERENCE) -> dict:
    out: dict = {}
    for folder in sorted(p for p in reference.iterdir() if p.is_dir()):
        for path in sorted(folder.glob("gemms-*.json")):
            gpu, dtype, n, err = _gemm_error(path)
            entry = out.setdefault(gpu, {}).setdefault(dtype, {"folder": f"reference/device/{folder.name}",
                                                               "gemms": 0, "gemm_errors": []})
            entry["gemms"] += n
            entry["gemm_errors"].append(err * n)
        run = _run_error(folder)
        if run is not None:
            gpu, precision, err = run
            out.setdefault(gpu, {}).setdefault(precision, {"folder": f"reference/device/{folder.name}",
                                                           "gemms": 0, "gemm_errors": []})
            out[gpu][precision]["run_error_percent"] = round(100 * err, 1)
    for per_dtype in out.values():
        for entry in per_dtype.values():
            errors = entry.pop("gemm_errors")
            entry["gemm_mape_percent"] = round(100 * sum(errors) / entry["gemms"], 1) if entry["gemms"] else None
    return {"gpu_types": out}


@lru_cache(maxsize=1)
def checks_table() -> dict:
    if not CHECKS_FILE.exists():
        return {}
    return yaml.safe_load(CHECKS_FILE.read_text()) or {}


def main(argv: list[str] | None = None) -> int:
    data = collect()
    CHECKS_FILE.write_text("# written by `python -m planner.cost.device_checks` from reference/device/; do not edit\n"
                           + yaml.safe_dump(data, sort_keys=True))
    print(f"wrote {CHECKS_FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
