"""Calibration: shipped values carry provenance; unfitted GPU types get derived defaults."""

from __future__ import annotations

import pytest

from planner import catalog
from planner.cost.calibration import (
    Calibration,
    GpuCalibration,
    default_calibration,
    load_calibration,
    save_calibration,
)


def test_shipped_calibration_has_fitted_entries_with_provenance():
    cal = default_calibration()
    for arch, set_name in (("ampere", "vtrain-single"), ("hopper", "megatron-core-h100")):
        entry = cal.architectures[arch]
        assert 0 < entry.eff_max <= 0.95 and 0 < entry.mem_eff <= 1 and 0 < entry.intra_eff <= 1
        assert set_name in entry.source
        prov = cal.provenance[arch]
        assert prov["set"] == set_name and prov["rows"] > 0 and prov["mape_percent"] > 0 and prov["date"]


def test_lookup_order_name_then_architecture_then_derived():
    cal = Calibration(gpus={"H100-SXM5-80GB": GpuCalibration(eff_max=0.5)},
                      architectures={"ampere": GpuCalibration(eff_max=0.7, tokens_half=100.0),
                                     "hopper": GpuCalibration(eff_max=0.8)})
    assert cal.for_gpu(catalog.gpu("H100-SXM5-80GB")).eff_max == 0.5
    assert cal.for_gpu(catalog.gpu("H200-SXM-141GB")).eff_max == 0.8
    assert cal.for_gpu(catalog.gpu("A100-SXM4-40GB")).eff_max == 0.7
    v100 = cal.for_gpu(catalog.gpu("V100-SXM2-32GB"))  # volta: derived from ampere
    assert v100.eff_max == 0.7 and v100.tokens_half == pytest.approx(100.0 * 125 / 312)
    assert "derived" in v100.source


def test_yaml_round_trip(tmp_path):
    cal = default_calibration()
    path = tmp_path / "cal.yaml"
    save_calibration(cal, path)
    again = load_calibration(path)
    assert again.architectures == cal.architectures and again.comm == cal.comm
