"""The GEMM sweep of the device check: the cost model's own shapes, timed, beside its prediction."""

from __future__ import annotations

import json

import pytest

from planner import catalog
from planner.cost.roofline import block_gemms
from planner.spec import load_model

torch = pytest.importorskip("torch")


def test_sweep_shapes_are_the_priced_gemms_and_their_backward_once_each():
    from planner.profile.gemm_sweep import sweep_shapes
    m = load_model("opt-350m")
    shapes = sweep_shapes(m, [1, 2], [1, 2], 512)
    keys = [(g.m, g.n, g.k, g.batch) for g in shapes]
    assert len(keys) == len(set(keys))
    fwd = block_gemms(m, 2, 512, 2)[0]       # qkv at mb 2, tp 2, and its two backward GEMMs
    for g in (fwd, fwd.dgrad(), fwd.wgrad()):
        assert (round(g.m), round(g.n), round(g.k), round(g.batch)) in keys


def test_sweep_runs_on_cpu_and_writes_predictions(tmp_path):
    from planner.profile.gemm_sweep import main
    out = tmp_path / "g.json"
    assert main(["--model", "opt-350m", "--gpu-type", "A100-SXM4-80GB", "--device", "cpu", "--dtype", "fp32",
                 "--micro-batch", "1", "--tp", "8", "--seq-len", "64", "--repeats", "1", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["rows"] and all(r["measured_s"] > 0 and r["predicted_s"] > 0 for r in data["rows"])
    assert catalog.gpu(data["gpu_type"]).name == "A100-SXM4-80GB"
