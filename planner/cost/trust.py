"""How far to trust a prediction, per GPU type: validated on measured runs, or datasheet-only.

``validation.yaml`` beside this file is written by ``python -m planner.cost.fidelity --write``
from the fidelity sets (tests/fidelity): for every GPU type that ran in a measured set, the
set, its rows, whether the set was used for fitting, and the model's mean absolute error on
it.  A test keeps the file equal to a fresh run.  A GPU type with no row is "datasheet-only":
its curve is its architecture's (or ampere's, scaled) and its ceiling the published matmul
benchmark where one exists; nobody has checked the prediction against a run.  A GPU type
whose layer costs came from a measured profile says so first.

Between the two: "micro-benchmarked", a GPU type with no run in a fidelity set but a device
check (``device_checks`` in validation.yaml, from planner.cost.device_report): its blocks were
profiled, or one plan trained, on one GPU of that type (reference/device/<folder>), or timed
by Sailor's profiler (planner.cost.layer_check), and the model predicted them (not fitted)
with the error given.  It says nothing about collectives or
multi-GPU schedules, which no such check measures.
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
    level: str  # "profiled" | "validated" | "calibrated" | "micro-benchmarked" | "datasheet-only"
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


_CHECK_KINDS = {"blocks": "profiled block entries (forward + backward)",
                "published blocks": "published per-layer block timings (forward + backward, Sailor's profiler)",
                "runner": "training iteration of a plan run by the reference runner"}


def _describe_checks(checks: list[dict]) -> str:
    parts = [f"{c['rows']} {_CHECK_KINDS.get(c['kind'], c['kind'])} in {c['precision']} on {c['gpus']} GPU, "
             f"predicted without fitting, mean error {c['mape_percent']:.1f}% ({c['folder']})" for c in checks]
    return ("micro-benchmarked on one GPU: " + "; ".join(parts)
            + "; no multi-GPU run of this type measured (collectives unchecked)")


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
    checks = [c for c in validation_table().get("device_checks", {}).get(gpu_type, [])
              if precision_class(c["precision"]) == precision_class(precision)]
    if checks:
        worst = max(c["mape_percent"] for c in checks)
        return Trust(gpu_type, "micro-benchmarked", worst / 100, _describe_checks(checks))
    ceiling = ("published max-achievable-matmul benchmark" if ceiling_measured
               else "assumed matmul ceiling (no published benchmark)")
    return Trust(gpu_type, "datasheet-only", None,
                 f"no measured run of this GPU type in {precision}: datasheet peaks, {ceiling}, "
                 "architecture curve; expect errors well beyond the validated types'")


def plan_trust(gpu_types: list[str], precision: str, profiled_types: set[str] = frozenset()) -> list[Trust]:
    from planner.catalog.benchmarks import matmul_ceiling
    return [trust_for(g, precision, g in profiled_types, matmul_ceiling(g).measured)
            for g in sorted(set(gpu_types))]


def trust_line(trusts: list[Trust]) -> str:
    """One line for a summary: each GPU type's level (and held-out error)."""
    parts = []
    for t in trusts:
        on = "one-GPU micro-benchmarks" if t.level == "micro-benchmarked" else "measured runs"
        err = f", {100 * t.mape:.0f}% mean error on {on}" if t.mape is not None else ""
        parts.append(f"{t.gpu_type} {t.level}{err}")
    return "trust: " + "; ".join(parts)
