"""The GEMM curve's two half-sizes from a GEMM micro-benchmark, not from training runs.

``python -m planner.profile.gemm_sweep`` times every forward, dgrad and wgrad GEMM the cost
model prices for a block, alone.  Where a GPU of an architecture has such a sweep (Hopper: the
H200 of ``reference/device/h200-2026-12-04``), its fill size ``x_half`` and depth ``k_half``
(gemm.py) are fitted to it: the shape of the curve is then a measured property of the GPU's
GEMM library, and the training rows fit only the software stack's launch costs.  Nine Megatron-
Core rows had driven Hopper's fill size to 2,840 output elements, next to its lower bound, to
make up for other terms; the sweep says 7.45e5.

Only GEMMs that take at least ``device_report.FLOOR_MULTIPLE`` times the sweep's fastest are
used (the device report's "above floor" rows): below that they time the launch, which the
curve does not model.  The fit is a grid in log space
minimising the mean |log(predicted / measured)| at the curve's ceiling for that precision
(``MatmulCeiling.training_fraction``).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from planner import catalog
from planner.cost.calibration import GpuCalibration
from planner.cost.device_report import FLOOR_MULTIPLE
from planner.cost.gemm import Gemm, gemm_curve

REPO = Path(__file__).resolve().parents[2]
# architecture -> the sweep files its half-sizes are fitted on (bf16: the precision the
# ceiling's training-shape factor and the fitted entries are in)
SWEEPS = {"hopper": ("reference/device/h200-2026-12-04/gemms-llama3-8b-bf16.json",
                     "reference/device/h200-2026-12-04/gemms-opt-350m-bf16.json")}


def sweep_rows(paths) -> tuple[str, list[dict]]:
    """(GPU type, rows above each file's launch floor) of sweep files of one GPU and dtype."""
    gpu, rows = None, []
    for path in paths:
        doc = json.loads((REPO / path).read_text())
        gpu = gpu or doc["gpu_type"]
        floor = min(r["measured_s"] for r in doc["rows"])
        rows += [r for r in doc["rows"] if r["measured_s"] >= FLOOR_MULTIPLE * floor]
    return gpu, rows


def sweep_error(gpu_name: str, rows: list[dict], x_half: float, k_half: float, mem_eff: float = 0.95) -> float:
    """Mean |log(predicted / measured)| of ``rows`` on the bf16 curve with these half-sizes
    (``gemm_curve`` of an entry fitted on the swept GPU itself: nothing carried over)."""
    cal = GpuCalibration(gemm_outputs_half=x_half, gemm_depth_half=k_half, mem_eff=mem_eff, fitted_on=gpu_name)
    curve = gemm_curve(catalog.gpu(gpu_name), "bf16", cal, 2)
    return statistics.fmean(abs(math.log(curve.time_s(Gemm("g", r["m"], r["n"], r["k"], r["batch"])) / r["measured_s"]))
                            for r in rows)


def fit_halves(arch: str) -> tuple[str, float, float, float]:
    """(GPU the sweep ran on, x_half, k_half, the fit's mean |log error|) for ``arch``."""
    gpu, rows = sweep_rows(SWEEPS[arch])
    grid = [(1e5 * 1.25 ** i, 8.0 * 1.25 ** j) for i in range(30) for j in range(30)]
    err, x_half, k_half = min((sweep_error(gpu, rows, x, k), x, k) for x, k in grid)
    return gpu, x_half, k_half, err
