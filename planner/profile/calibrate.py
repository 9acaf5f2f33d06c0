"""``planner profile --calibrate``: fit a GPU type's roofline efficiency to its measured profile.

The cost model's roofline (planner/cost/compute.py, gemm.py) prices each GEMM of a block as
    FLOPs / (peak * ceiling * fill(M N; outputs_half) * depth(K; depth_half) / reference)
plus elementwise bytes / (memory bandwidth * mem_eff), at least the layer launch floor.
A profile measures blocks at a few (micro-batch, tp) points; fitting the GPU's own
``matmul_ceiling``, ``gemm_outputs_half``, ``gemm_depth_half`` and ``layer_overhead_s`` to them
lets shapes the profile lacks (other micro-batches, seq_lens, models) be estimated from the
same device's behaviour.

How: a grid over the two half-sizes (log-spaced); for each, the predicted time is nearly
linear in 1/ceiling and in the overhead, so those two come from weighted least squares on the
relative error (clamped to ceiling <= 1, overhead >= 0).  ``mem_eff`` keeps the shipped value:
a block's elementwise share is too small to pin it down.  The roofline itself is evaluated by
calling the cost model (``block_timing``), so the fit always matches the formula in use, in a
context that prices what the profile measured (``Measured``: its dtype as the precision, and
flash attention for the fused SDPA core that measure.py times).

The result is a complete calibration file in the format of planner/cost/calibration.yaml
(the shipped calibration with this GPU type's entry replaced).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, replace
from pathlib import Path

from planner import catalog
from planner.errors import InputError
from planner.profile.store import parse_profile, profile_gpu_type
from planner.spec.gpu import GpuType
from planner.spec.model import ModelSpec
from planner.spec.source import load_yaml

# A fit that misses its own measurements by more than this, on average, does not describe the
# GPU's blocks (the shipped curves miss H200's by 17%, vtrain's A100 rows by 7%): the file is
# still written, with a warning
POOR_FIT_ERROR = 0.25
_OUTPUTS_GRID = [10 ** (3 + k / 4) for k in range(21)]  # 1e3 .. 1e8 output elements, 4 per decade
_DEPTH_GRID = [2.0 ** k for k in range(13)]              # 1 .. 4096 steps of K


@dataclass(frozen=True)
class FitRow:
    micro_batch: int
    tp: int
    measured_s: float      # forward + backward of one block
    before_s: float        # shipped calibration's prediction
    after_s: float         # fitted calibration's prediction


@dataclass(frozen=True)
class CalibrationResult:
    gpu_type: str
    fitted: object          # planner.cost.calibration.GpuCalibration
    calibration: object     # planner.cost.calibration.Calibration (shipped + this entry)
    rows: tuple[FitRow, ...]
    profile_path: str

    @property
    def error_before(self) -> float:
        return _mean_rel_error([(r.before_s, r.measured_s) for r in self.rows])

    @property
    def error_after(self) -> float:
        return _mean_rel_error([(r.after_s, r.measured_s) for r in self.rows])

    @property
    def poor_fit(self) -> bool:
        return self.error_after > POOR_FIT_ERROR

    def to_yaml_data(self) -> dict:
        return self.calibration.to_mapping()

    def summary(self) -> str:
        f = self.fitted
        return (f"{self.gpu_type}: matmul ceiling {f.matmul_ceiling:.3f}, GEMM fill half "
                f"{f.gemm_outputs_half:.3g} outputs, depth half {f.gemm_depth_half:.3g}, "
                f"layer_overhead {f.layer_overhead_s * 1e6:.1f} us; "
                f"mean |error| on {len(self.rows)} block entries {self.error_before:.1%} -> "
                f"{self.error_after:.1%}")


def _own_terms(fitted, gpu: GpuType):
    """The fit in this GPU's own terms: it was fitted through the base entry's half-sizes, kept
    in the terms of the GPU that entry names (``fitted_on``); the same curve with the fill size
    carried here (gemm.carried_outputs_half) says, rightly, that it was fitted on this GPU."""
    from planner.cost.gemm import carried_outputs_half
    return replace(fitted, gemm_outputs_half=carried_outputs_half(gpu, fitted), fitted_on=gpu.name)


def _mean_rel_error(pairs) -> float:
    return sum(abs(p - m) / m for p, m in pairs) / len(pairs)


def _gpu(gpu_type: str, cluster) -> GpuType:
    if cluster is not None:
        for node in cluster.node_list:
            if node.gpu.name.lower() == gpu_type.lower():
                return node.gpu
    found = catalog.find_gpu(gpu_type)
    if found is None:
        raise InputError(f"GPU type {gpu_type!r} is not in the catalog; pass --cluster with a spec "
                         "whose nodes use an inline GPU of that name (the fit needs its "
                         "peak_tflops and memory_bandwidth), or --gpu-type with a catalog id")
    return found


@dataclass(frozen=True)
class Measured:
    """How the profile's blocks ran, so the cost model prices the same work: its dtype (the
    element size and the peak in that precision) and its attention (measure.py's SDPA is fused:
    pricing s x s softmax traffic the measurement never had would blame the GEMM curve)."""

    precision: str
    flash_attention: bool
    # measure.py's Head computes F.cross_entropy(logits.float(), targets): the plain loss
    cross_entropy: str = "plain"

    @classmethod
    def of(cls, prof) -> Measured:
        return cls(precision=prof.dtype, flash_attention=prof.attention == "fused")


def _total_s(model: ModelSpec, seq_len: int, gpu: GpuType, gc, mb: int, tp: int, how: Measured) -> float:
    from planner.cost.calibration import Calibration
    from planner.cost.compute import block_timing
    from planner.cost.context import CostContext
    ctx = CostContext(model=model, seq_len=seq_len, precision=how.precision,
                      flash_attention=how.flash_attention,
                      calibration=Calibration(gpus={gpu.name: gc}))
    t = block_timing(ctx, gpu, gpu.intra_node_bandwidth_Bps, tp, mb)
    return t.forward_s + t.backward_s


def fit_gpu(model: ModelSpec, seq_len: int, gpu: GpuType, points: list[tuple[int, int, float]],
            base, how: Measured):
    """Fitted ``GpuCalibration`` for block totals ``points`` = [(micro_batch, tp, measured_s)]."""
    best = None
    for th in _OUTPUTS_GRID:
        for wh in _DEPTH_GRID:
            unit = replace(base, matmul_ceiling=1.0, gemm_outputs_half=th, gemm_depth_half=wh,
                           layer_overhead_s=0.0)
            rows = []
            for mb, tp, meas in points:
                full = _total_s(model, seq_len, gpu, unit, mb, tp, how)
                mem_free = _total_s(model, seq_len, gpu, replace(unit, mem_eff=1e30), mb, tp, how)
                ovh = _total_s(model, seq_len, gpu, replace(unit, layer_overhead_s=1e-3), mb, tp, how)
                # prediction = a*u + b + c*o with u = 1/eff_max, o = overhead
                rows.append((mem_free, full - mem_free, (ovh - full) / 1e-3, meas))
            u, o = _solve(rows)
            err = sum(((a * u + b + c * o) - m) ** 2 / m ** 2 for a, b, c, m in rows)
            if best is None or err < best[0] - 1e-12:
                best = (err, th, wh, u, o)
    _, th, wh, u, o = best
    return replace(base, matmul_ceiling=1.0 / u, gemm_outputs_half=th, gemm_depth_half=wh,
                   layer_overhead_s=o)


def _solve(rows) -> tuple[float, float]:
    """Weighted least squares for (u, o) with u >= 1 and o >= 0 (see the module docstring)."""
    def fit_both():
        saa = sum(a * a / m**2 for a, b, c, m in rows)
        scc = sum(c * c / m**2 for a, b, c, m in rows)
        sac = sum(a * c / m**2 for a, b, c, m in rows)
        sar = sum(a * (m - b) / m**2 for a, b, c, m in rows)
        scr = sum(c * (m - b) / m**2 for a, b, c, m in rows)
        det = saa * scc - sac * sac
        if abs(det) < 1e-30:
            return None
        return (sar * scc - scr * sac) / det, (saa * scr - sac * sar) / det

    def fit_u(o):
        num = sum(a * (m - b - c * o) / m**2 for a, b, c, m in rows)
        return max(1.0, num / sum(a * a / m**2 for a, b, c, m in rows))

    def fit_o(u):
        num = sum(c * (m - b - a * u) / m**2 for a, b, c, m in rows)
        den = sum(c * c / m**2 for a, b, c, m in rows)
        return max(0.0, num / den) if den > 0 else 0.0

    both = fit_both()
    if both is not None and both[0] >= 1.0 and both[1] >= 0.0:
        return both
    candidates = [(fit_u(0.0), 0.0), (1.0, fit_o(1.0))]
    return min(candidates, key=lambda uo: sum(((a * uo[0] + b + c * uo[1]) - m) ** 2 / m**2
                                              for a, b, c, m in rows))


def calibrate_file(path: str | Path, gpu_type: str | None = None, cluster=None) -> CalibrationResult:
    try:
        from planner.cost.calibration import default_calibration
    except ImportError:  # pragma: no cover - the cost package ships with planner
        raise InputError("the cost model (planner.cost) is not available to calibrate") from None
    doc = load_yaml(path)
    prof = parse_profile(doc)
    gpu_name = gpu_type or profile_gpu_type(prof, doc)
    gpu = _gpu(gpu_name, cluster)
    model = ModelSpec(**prof.model.model_dump())
    points = [(e.micro_batch, e.tp, e.forward_s + e.backward_s)
              for e in prof.entries if e.layer == "block" and e.fits]
    if len(points) < 2:
        raise InputError("calibration needs at least two measured block entries (fits) in the "
                         "profile; re-run 'planner profile' with several --micro-batch values",
                         doc.locate(("entries",)))
    shipped = default_calibration()
    base = shipped.for_gpu(gpu)
    how = Measured.of(prof)
    fitted = replace(fit_gpu(model, prof.seq_len, gpu, points, base, how),
                     source=f"fitted to profile {Path(path).name} ({prof.device.name}, {prof.dtype}, "
                            f"{prof.attention} attention, "
                            f"seq_len {prof.seq_len}, {len(points)} block entries) by planner profile "
                            "--calibrate")
    fitted = _own_terms(fitted, gpu)
    rows = tuple(FitRow(mb, tp, meas, _total_s(model, prof.seq_len, gpu, base, mb, tp, how),
                        _total_s(model, prof.seq_len, gpu, fitted, mb, tp, how))
                 for mb, tp, meas in points)
    provenance = dict(shipped.provenance)
    provenance[f"profile-fit:{gpu.name}"] = {
        "profile": str(path), "device": prof.device.name, "created": prof.created,
        "fitted_on": dt.date.today().isoformat(),
        "mean_abs_rel_error_before": round(_mean_rel_error([(r.before_s, r.measured_s) for r in rows]), 4),
        "mean_abs_rel_error_after": round(_mean_rel_error([(r.after_s, r.measured_s) for r in rows]), 4),
    }
    calibration = replace(shipped, gpus={**shipped.gpus, gpu.name: fitted}, provenance=provenance)
    assert math.isfinite(fitted.matmul_ceiling)
    return CalibrationResult(gpu.name, fitted, calibration, rows, str(path))
