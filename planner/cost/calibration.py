"""Calibrated constants of the cost model, with provenance, and their fitting.

The cost model needs a few numbers per GPU type that no datasheet or published
micro-benchmark gives: at which GEMM sizes a GPU fills (gemm.py; the ceiling itself is the
catalog's published maximum achievable matmul), how close to peak bandwidth the elementwise
kernels run, and the software stack's fixed launch costs.  They are fitted (``fit_calibration``) on the calibration sets only
(``vtrain-single`` for A100, ``megatron-core`` for H100) and stored in ``calibration.yaml``
beside this file with which set, how many rows, the resulting error and the date.

GPU types without fitted values get defaults by architecture (``Calibration.for_gpu``):
1. an entry for the exact GPU name, else
2. an entry for its architecture (``ampere``: fitted on A100; ``hopper``: its launch floor
   fitted on H100 runs, its GEMM half-sizes on the H200's GEMM sweep (gemm_sweep_fit.py), used
   for H100 / H200 / GH200), else
3. ``fallback``: the ampere entry.  Volta, Turing, Ada and AMD parts land here; their
   predictions are unfitted.
In every case the GEMM half-sizes are those of the GPU the entry was fitted on
(``fitted_on``), carried to the GPU and precision priced by its peak and its ridge
(gemm.py ``transferred_halves``): an RTX 3090 under ``ampere`` or an H200 under ``hopper`` is
not priced with the A100's or H200's fill and depth.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import yaml

from planner.spec.gpu import GpuType

CALIBRATION_FILE = Path(__file__).with_name("calibration.yaml")
A100_NAME = "A100-SXM4-80GB"  # the GPU the ampere entry was fitted on (vtrain-single's)


@dataclass(frozen=True)
class GpuCalibration:
    """The few numbers per GPU type that no datasheet or micro-benchmark gives (gemm.py and
    compute.py explain the formulas).  The matmul ceiling comes from the catalog's published
    benchmark (``matmul_ceiling`` None) unless a profile fit sets it."""

    gemm_outputs_half: float = 1.0e6  # M*N output elements at which a GEMM's wave fill is 1/2 (any precision)
    gemm_depth_half: float = 128.0    # K at which a GEMM's K-loop amortisation is 1/2
    mem_eff: float = 0.8              # fraction of peak memory bandwidth reached by elementwise kernels
    layer_overhead_s: float = 0.0     # host launch floor per block per forward pass (backward 2x)
    microbatch_overhead_s: float = 0.0  # fixed time per micro-batch per stage (scheduling, launches)
    collective_overhead_s: float = 0.0  # fixed time per TP collective: its launch and the ranks' skew
    matmul_ceiling: float | None = None  # None: the catalog's published MAMF fraction
    # the catalog GPU the half-sizes were fitted on; other GPUs and precisions get them
    # transferred (gemm.transferred_halves); None: used as they are
    fitted_on: str | None = None
    source: str = "default guess (unfitted)"


@dataclass(frozen=True)
class CommCalibration:
    """Between nodes: achieved fraction of the path's bandwidth and the NCCL latency per step
    or send on top of the wire's.  Defaults come from published nccl-tests figures; a
    calibration file may override them (a measured cluster)."""

    inter_eff: float | None = None        # None: the catalog's NCCL figure (benchmarks.yaml)
    inter_latency_s: float | None = None  # per ring step or send between nodes (added to the path's)
    source: str = "catalog: planner/catalog/benchmarks.yaml collectives"


@dataclass(frozen=True)
class Calibration:
    gpus: dict[str, GpuCalibration] = field(default_factory=dict)          # by GPU name
    architectures: dict[str, GpuCalibration] = field(default_factory=dict)  # by architecture
    comm: CommCalibration = field(default_factory=CommCalibration)
    provenance: dict = field(default_factory=dict)
    # per GPU, filled by for_gpu; not an init field, so every dataclasses.replace copy starts
    # empty (a shared memo answered the copy's GPUs with the original's entries)
    _memo: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def for_gpu(self, gpu: GpuType) -> GpuCalibration:
        key = (gpu.name, gpu.architecture, gpu.peak_tflops)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._for_gpu(gpu)
        return hit

    def _for_gpu(self, gpu: GpuType) -> GpuCalibration:
        found = self.gpus.get(gpu.name)
        if found is not None:   # fitted on this GPU (planner profile --calibrate)
            return found if found.fitted_on else replace(found, fitted_on=gpu.name)
        arch = (gpu.architecture or "").lower()
        if arch in self.architectures:
            return self.architectures[arch]
        base = self.architectures.get("ampere", GpuCalibration())
        # the GEMM half-sizes are carried over from the A100 (gemm.transferred_halves)
        return replace(base, fitted_on=base.fitted_on or A100_NAME,
                       source=f"derived from ampere ({base.source}), GEMM half-sizes transferred "
                              "by peak and ridge (unfitted)")

    # -- yaml ---------------------------------------------------------------------------
    def with_entry(self, key: str, entry: GpuCalibration, by: str = "architectures") -> Calibration:
        """A copy with one GPU-type (``by='gpus'``) or architecture entry replaced."""
        table = dict(getattr(self, by))
        table[key] = entry
        return replace(self, **{by: table})

    def with_comm(self, comm: CommCalibration) -> Calibration:
        return replace(self, comm=comm)

    def to_mapping(self) -> dict:
        def entry(c: GpuCalibration) -> dict:
            return {k: getattr(c, k) for k in GpuCalibration.__dataclass_fields__}
        return {
            "gpus": {k: entry(v) for k, v in sorted(self.gpus.items())},
            "architectures": {k: entry(v) for k, v in sorted(self.architectures.items())},
            "comm": {k: getattr(self.comm, k) for k in CommCalibration.__dataclass_fields__},
            "provenance": self.provenance,
        }

    @classmethod
    def from_mapping(cls, data: dict) -> Calibration:
        return cls(
            gpus={k: GpuCalibration(**v) for k, v in (data.get("gpus") or {}).items()},
            architectures={k: GpuCalibration(**v) for k, v in (data.get("architectures") or {}).items()},
            comm=CommCalibration(**(data.get("comm") or {})),
            provenance=dict(data.get("provenance") or {}),
        )


CALIBRATION_KEYS = ("gpus", "architectures", "comm", "provenance")     # Calibration.from_mapping's


def load_calibration(path: str | Path | None = None) -> Calibration:
    if path is None:
        return default_calibration()
    from planner.errors import InputError, InputErrors
    from planner.spec.source import load_yaml, read_text

    # load_yaml: bounded (planner.spec.limits) and located errors; an empty file is an error,
    # not the shipped fit's defaults under another name
    doc = load_yaml(path, read_text(path, "calibration file"))
    if not isinstance(doc.data, dict):
        raise doc.error((), "a calibration file is a mapping (compute, comm, provenance); write one with "
                        "`planner profile --calibrate PROFILE -o FILE`")
    # from_mapping reads the keys it knows and ignores the rest: a cluster spec (or `{}`) given
    # as --calibration priced with the built-in guesses, silently (found by scripts/fuzz_plans.py)
    unknown = [k for k in doc.data if k not in CALIBRATION_KEYS]
    if unknown or not doc.data:
        raise InputErrors([doc.error((k,) if k else (), f"{f'unknown key {k!r}' if k else 'no calibration in it'}; "
                                     f"a calibration file holds {', '.join(CALIBRATION_KEYS)}: write one with "
                                     "`planner profile --calibrate PROFILE -o FILE`") for k in unknown or [None]])
    try:
        return Calibration.from_mapping(doc.data)
    except (TypeError, AttributeError) as exc:
        raise InputError(f"{path}: not a calibration file ({exc}); write one with "
                         "`planner profile --calibrate PROFILE -o FILE`") from None


# A calibration chosen by the user (`--calibration FILE`, `PLANNER_CALIBRATION`, or
# `use_calibration`) replaces the shipped one everywhere, the search included.
_chosen: Path | None = None


def use_calibration(path: str | Path | None) -> None:
    """Price everything in this process with the calibration file at ``path`` (None: shipped)."""
    global _chosen
    if path is not None:
        load_calibration(path)  # fail now, with the file named, not mid-search
    _chosen = None if path is None else Path(path)
    default_calibration.cache_clear()


@contextmanager
def calibrated(path: str | Path | None):
    """Price with the calibration file at ``path`` inside the block only (None: what is in
    force already), then restore what was chosen before: how ``planner.api`` takes
    calibration as a parameter of each call.  The choice is still module state while the
    block runs, so two threads pricing with different calibrations must not overlap."""
    if path is None:
        yield
        return
    before = _chosen
    use_calibration(path)
    try:
        yield
    finally:
        use_calibration(before)


@lru_cache(maxsize=1)
def default_calibration() -> Calibration:
    """The calibration in force: the user's (see ``use_calibration``), else the shipped
    ``calibration.yaml``; built-in guesses if that is missing."""
    chosen = _chosen or (Path(os.environ["PLANNER_CALIBRATION"]) if os.environ.get("PLANNER_CALIBRATION")
                         else None)
    if chosen is not None:
        return load_calibration(chosen)
    if CALIBRATION_FILE.exists():
        return Calibration.from_mapping(yaml.safe_load(CALIBRATION_FILE.read_text()) or {})
    return Calibration(architectures={"ampere": GpuCalibration(), "hopper": GpuCalibration()})


def save_calibration(cal: Calibration, path: str | Path = CALIBRATION_FILE, header: str = "") -> None:
    text = yaml.safe_dump(cal.to_mapping(), sort_keys=False, width=100)
    Path(path).write_text(header + text)
