"""Fitting the calibration: ``python -m planner.cost.fit`` rewrites ``calibration.yaml``.

Only the calibration sets are used (fidelity.CALIBRATION_SETS): ``vtrain-single`` fits the
``ampere`` entry (A100), ``megatron-core-h100`` the ``hopper`` entry (H100).  The validation
sets (``vtrain-multi``, ``sailor``) are never looked at here.

Method: coordinate search in log space minimising the mean absolute percentage error of the
iteration time over the set (no scipy): each parameter in turn is multiplied by a step and
its inverse, a move is kept when it lowers the error, and the step shrinks (square root) after
every round.  Bounds keep every parameter physical (efficiencies in (0, 1]).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from dataclasses import replace

from planner.cost.calibration import (
    A100_NAME,
    CALIBRATION_FILE,
    Calibration,
    GpuCalibration,
    default_calibration,
    save_calibration,
)
from planner.cost.fidelity import CALIBRATION_SETS, predict_set
from planner.cost.gemm_sweep_fit import fit_halves

# (parameter, lower bound, upper bound).  The matmul ceiling and the NCCL bus bandwidths are
# not here: they come from published micro-benchmarks (catalog benchmarks.yaml).
AMPERE_PARAMS = [("gemm_outputs_half", 1e3, 1e8), ("gemm_depth_half", 1.0, 4096.0),
                 ("mem_eff", 0.5, 0.95), ("layer_overhead_s", 1e-6, 5e-2),
                 ("microbatch_overhead_s", 1e-5, 0.1), ("collective_overhead_s", 1e-6, 1e-2)]
# Nine rows: the per-block launch floor of Megatron-Core with Transformer Engine (a different
# software stack).  The GEMM curve's half-sizes come from the H200's GEMM sweep (gemm_sweep_fit:
# fitted on these rows the fill size went to 2,840 outputs, next to its bound); the memory
# efficiency and the other launch costs are ampere's.
HOPPER_PARAMS = [("layer_overhead_s", 1e-6, 5e-2)]
# (collective_overhead_s is ampere's: with --tp-comm-overlap Megatron-Core hides TP collectives,
# so nine H100 rows cannot pin it.)
# (architecture, set, parameters, rounds): nine rows are cheap, so hopper gets more rounds
FITS = [("ampere", "vtrain-single", AMPERE_PARAMS, 5), ("hopper", "megatron-core-h100", HOPPER_PARAMS, 9)]


def set_error(name: str, cal: Calibration) -> float:
    return statistics.fmean(r.ape for r in predict_set(name, cal))


def fit_entry(cal: Calibration, arch: str, set_name: str, params, rounds: int = 5,
              log=print) -> tuple[Calibration, float]:
    entry = cal.architectures.get(arch) or GpuCalibration()
    best = set_error(set_name, cal.with_entry(arch, entry))
    step = 2.0
    for rnd in range(rounds):
        for name, lo, hi in params:
            for factor in (step, 1 / step):
                value = min(hi, max(lo, getattr(entry, name) * factor))
                trial = replace(entry, **{name: value})
                err = set_error(set_name, cal.with_entry(arch, trial))
                if err < best - 1e-6:
                    best, entry = err, trial
                    # keep going in the same direction while it helps
                    while True:
                        value = min(hi, max(lo, getattr(entry, name) * factor))
                        trial = replace(entry, **{name: value})
                        err = set_error(set_name, cal.with_entry(arch, trial))
                        if err < best - 1e-6:
                            best, entry = err, trial
                        else:
                            break
                    break
        log(f"  {arch} round {rnd}: MAPE {100 * best:.2f}%  " +
            ", ".join(f"{n}={getattr(entry, n):.4g}" for n, _, _ in params))
        step = math.sqrt(step)
    return cal.with_entry(arch, entry), best


def fit_calibration(base: Calibration | None = None, log=print, only: str | None = None) -> Calibration:
    cal = base or default_calibration()
    today = _dt.date.today().isoformat()
    provenance = dict(cal.provenance)
    for arch, set_name, params, rounds in FITS:
        assert set_name in CALIBRATION_SETS
        if only is not None and arch != only:
            continue
        if arch == "ampere":
            cal = cal.with_entry(arch, replace(cal.architectures.get(arch) or GpuCalibration(), fitted_on=A100_NAME))
        if arch == "hopper" and "ampere" in cal.architectures:
            # ampere's launch costs and memory efficiency to start from; the GEMM curve's
            # half-sizes from the GEMM sweep of a Hopper GPU, which they are a property of
            swept_on, x_half, k_half, sweep_err = fit_halves("hopper")
            log(f"hopper GEMM half-sizes from the {swept_on} sweep: x_half {x_half:.4g}, k_half "
                f"{k_half:.4g} (mean |log error| {sweep_err:.3f})")
            cal = cal.with_entry("hopper", replace(cal.architectures["ampere"], gemm_outputs_half=x_half,
                                                   gemm_depth_half=k_half, fitted_on=swept_on))
        log(f"fitting {arch} on {set_name}")
        cal, err = fit_entry(cal, arch, set_name, params, rounds=rounds, log=log)
        n = len(predict_set(set_name, cal))
        source = f"fitted on {set_name} ({n} rows), MAPE {100 * err:.1f}%, {today}"
        if arch == "hopper":
            source += f"; GEMM half-sizes from the {cal.architectures[arch].fitted_on} GEMM sweep (gemm_sweep_fit)"
        entry = replace(cal.architectures[arch], source=source)
        cal = cal.with_entry(arch, entry)
        provenance[arch] = {"set": set_name, "rows": n, "mape_percent": round(100 * err, 2),
                            "date": today, "parameters": [p for p, _, _ in params],
                            "method": "coordinate search on log scale, minimising MAPE"}
    return replace(cal, provenance=provenance)


HEADER = """\
# Calibration of planner's cost model (planner/cost/calibration.py explains every field).
# Written by `python -m planner.cost.fit` from the calibration sets ONLY (vtrain-single for
# ampere, megatron-core-h100 for hopper); do not edit the fitted values by hand.
# Architectures without an entry are derived from ampere (Calibration.for_gpu).
"""


def main(argv: list[str] | None = None) -> int:
    import sys
    args = sys.argv[1:] if argv is None else argv
    only = args[args.index("--only") + 1] if "--only" in args else None
    cal = fit_calibration(only=only)
    save_calibration(cal, CALIBRATION_FILE, HEADER)
    print(f"wrote {CALIBRATION_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
