"""How far to trust a prediction, per GPU type: validated on measured runs, or datasheet-only.

``validation.yaml`` beside this file is written by ``python -m planner.cost.fidelity --write``
from the fidelity sets (tests/fidelity): for every GPU type that ran in a measured set, the
set, its rows, whether the set was used for fitting, and the model's mean absolute error on
it.  A test keeps the file equal to a fresh run.  A GPU type with no row is "datasheet-only":
its curve is its architecture's (or ampere's, scaled) and its ceiling the published matmul
benchmark where one exists; nobody has checked the prediction against a run.  A GPU type
whose layer costs came from a measured profile says so first.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

VALIDATION_FILE = Path(__file__).with_name("validation.yaml")


@dataclass(frozen=True)
class Trust:
    gpu_type: str
    level: str              # "profiled" | "validated" | "calibrated" | "micro-benchmarked" | "datasheet-only"
    mape: float | None      # mean absolute error on measured runs not used for fitting
    note: str

    def to_json(self) -> dict:
        return {"gpu_type": self.gpu_type, "level": self.level, "mape": self.mape, "note": self.note}


@lru_cache(maxsize=1)
def validation_table() -> dict:
    if not VALIDATION_FILE.exists():
        return {}
    return yaml.safe_load(VALIDATION_FILE.read_text()) or {}


def precision_class(precision: str) -> str:
    """bf16 and fp16 run the same tensor-core GEMMs: a run in one validates the other."""
    return "half" if precision in ("bf16", "fp16") else precision


def _describe(entries: list[dict]) -> str:
    parts = []
    for e in entries:
        how = "fitted on it" if e["fitted"] else "predicted without fitting"
        parts.append(f"{e['set']}: {e['rows']} measured runs, {how}, mean error {e['mape_percent']:.1f}%")
    return "; ".join(parts)


def trust_for(gpu_type: str, precision: str, profiled: bool = False, ceiling_measured: bool = True) -> Trust:
    entries = [e for e in validation_table().get("gpu_types", {}).get(gpu_type, [])
               if precision_class(e["precision"]) == precision_class(precision)]
    if profiled:
        return Trust(gpu_type, "profiled", None,
                     "layer costs from a measured profile of this GPU type (planner profile)")
    held_out = [e for e in entries if not e["fitted"]]
    if held_out:
        worst = max(e["mape_percent"] for e in held_out)
        return Trust(gpu_type, "validated", worst / 100, _describe(entries))
    if entries:
        worst = max(e["mape_percent"] for e in entries)
        return Trust(gpu_type, "calibrated", worst / 100,
                     _describe(entries) + " (no held-out runs for this GPU type)")
    checked = _device_check(gpu_type, precision)
    if checked is not None:
        return checked
    ceiling = ("published max-achievable-matmul benchmark" if ceiling_measured
               else "assumed matmul ceiling (no published benchmark)")
    return Trust(gpu_type, "datasheet-only", None,
                 f"no measured run of this GPU type in {precision}: datasheet peaks, {ceiling}, "
                 "architecture curve; expect errors well beyond the validated types'")


def _device_check(gpu_type: str, precision: str) -> Trust | None:
    """Single-GPU checks on a lent machine (device_checks.py): the GEMMs, and one trained plan
    where there was one.  ``mape``: that plan's error, else the GEMMs'."""
    from planner.cost.device_checks import checks_table
    per_dtype = checks_table().get("gpu_types", {}).get(gpu_type, {})
    entry = next((e for d, e in sorted(per_dtype.items()) if precision_class(d) == precision_class(precision)), None)
    if entry is None:
        return None
    parts = [f"{entry['gemms']} GEMMs timed on one GPU, mean error {entry['gemm_mape_percent']:.1f}%"]
    run = entry.get("run_error_percent")
    if run is not None:
        parts.append(f"one single-GPU training run predicted {run:+.0f}%")
    mape = abs(run) / 100 if run is not None else entry["gemm_mape_percent"] / 100
    return Trust(gpu_type, "micro-benchmarked", mape,
                 "; ".join(parts) + f" ({entry['folder']}); no multi-GPU measured run")


def plan_trust(gpu_types: list[str], precision: str, profiled_types: set[str] = frozenset()) -> list[Trust]:
    from planner.catalog.benchmarks import matmul_ceiling
    return [trust_for(g, precision, g in profiled_types, matmul_ceiling(g).measured)
            for g in sorted(set(gpu_types))]


def trust_line(trusts: list[Trust]) -> str:
    """One line for a summary: each GPU type's level (and held-out error)."""
    parts = []
    for t in trusts:
        err = f", {100 * t.mape:.0f}% mean error on measured runs" if t.mape is not None else ""
        parts.append(f"{t.gpu_type} {t.level}{err}")
    return "trust: " + "; ".join(parts)
