"""Hopper's GEMM curve comes from a GEMM micro-benchmark (planner.cost.gemm_sweep_fit), and the
shipped calibration is current with it."""

from __future__ import annotations

import pytest

from planner.cost.calibration import default_calibration
from planner.cost.device_report import FLOOR_MULTIPLE
from planner.cost.gemm_sweep_fit import SWEEPS, fit_halves, sweep_error, sweep_rows


def test_the_shipped_hopper_entry_is_the_sweeps_fit():
    gpu, x_half, k_half, err = fit_halves("hopper")
    entry = default_calibration().architectures["hopper"]
    assert entry.fitted_on == gpu == "H200-SXM-141GB"
    assert (entry.gemm_outputs_half, entry.gemm_depth_half) == pytest.approx((x_half, k_half))
    assert "GEMM sweep" in entry.source
    # what nine training rows chose (a fill size at its bound) prices the sweep worse
    _, rows = sweep_rows(SWEEPS["hopper"])
    assert err < 0.09 and sweep_error(gpu, rows, 2840.0, k_half) > err + 0.005


def test_only_gemms_above_the_launch_floor_are_fitted():
    import json

    from planner.cost.gemm_sweep_fit import REPO
    _, rows = sweep_rows(SWEEPS["hopper"][:1])
    doc = json.loads((REPO / SWEEPS["hopper"][0]).read_text())
    floor = min(r["measured_s"] for r in doc["rows"])
    assert rows and all(r["measured_s"] >= FLOOR_MULTIPLE * floor for r in rows)
    assert len(rows) < len(doc["rows"])
