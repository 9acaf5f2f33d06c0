"""The micro-benchmarks of the memory-bound terms (planner/profile/micro.py) on CPU, tiny sizes."""

import json

import pytest

pytest.importorskip("torch")

from planner.profile import micro


def test_micro_small_run_writes_every_term(tmp_path):
    out = tmp_path / "micro.json"
    assert micro.main(["--device", "cpu", "--small", "--dtype", "fp32", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {"copy", "adam", "attention_core", "launch"} <= data.keys()
    assert all(r["achieved_Bps"] > 0 and r["bytes_moved"] == 2 * 2**20 * mib
               for r, mib in zip(data["copy"], (1, 4), strict=True))
    assert data["adam"][0]["params"] == 10**6 and data["adam"][0]["measured_s"] > 0
    core = data["attention_core"][0]
    assert core["seq_len"] == 64 and core["unfused_s"] > 0 and core["flash_s"] > 0
    assert 0 < data["launch"]["per_kernel_s"] < 1e-2
