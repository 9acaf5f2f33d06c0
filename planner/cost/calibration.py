"""Calibrated constants of the cost model, with provenance, and their fitting.

The roofline of ``compute.py`` needs a few numbers per GPU type that no datasheet gives: how
close to peak a matmul of a given size runs, and how close to peak bandwidth the elementwise
kernels run.  They are fitted (``fit_calibration``) on the calibration sets only
(``vtrain-single`` for A100, ``megatron-core`` for H100) and stored in ``calibration.yaml``
beside this file with which set, how many rows, the resulting error and the date.

GPU types without fitted values get defaults by architecture (``Calibration.for_gpu``):
1. an entry for the exact GPU name, else
2. an entry for its architecture (``ampere``: fitted on A100; ``hopper``: fitted on H100, used
   for H100 PCIe / H200 / GH200), else
3. ``fallback``: the ampere entry with the half-saturation sizes scaled by the GPU's peak over
   the A100's (a faster GPU needs bigger matmuls to fill; a slower one saturates earlier).
   Volta, Turing, Ada and AMD parts land here; their predictions are unfitted.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import yaml

from planner.spec.gpu import GpuType

CALIBRATION_FILE = Path(__file__).with_name("calibration.yaml")
A100_PEAK_FLOPS = 312e12  # the GPU the ampere entry was fitted on (A100 datasheet)


@dataclass(frozen=True)
class GpuCalibration:
    """Efficiency curve of one GPU type (compute.py explains the formula)."""

    eff_max: float = 0.6              # fraction of peak reached by large matmuls
    tokens_half: float = 512.0        # b*s (matmul rows) at which the row factor is 1/2
    width_half: float = 256.0         # h/tp (matmul columns per shard) at which the width factor is 1/2
    mem_eff: float = 0.7              # fraction of peak memory bandwidth of elementwise kernels
    layer_overhead_s: float = 0.0     # fixed time per block per forward (kernel launches); backward 2x
    microbatch_overhead_s: float = 0.0  # fixed time per micro-batch per stage (scheduling, launches)
    intra_eff: float = 0.7            # TP ring all-reduce bus bandwidth / intra-node link bandwidth
    intra_latency_s: float = 2e-5     # per TP ring step (NCCL launch + handshake)
    source: str = "default guess (unfitted)"


@dataclass(frozen=True)
class CommCalibration:
    """Between nodes: achieved fraction of the path's bandwidth and the NCCL latency per step
    or send on top of the wire's.  (Inside a node these are per GPU type: GpuCalibration.)"""

    inter_eff: float = 0.8            # network ring / p2p
    inter_latency_s: float = 3e-5     # per ring step or send between nodes (added to the path's)
    source: str = "default guess (unfitted)"


@dataclass(frozen=True)
class Calibration:
    gpus: dict[str, GpuCalibration] = field(default_factory=dict)          # by GPU name
    architectures: dict[str, GpuCalibration] = field(default_factory=dict)  # by architecture
    comm: CommCalibration = field(default_factory=CommCalibration)
    provenance: dict = field(default_factory=dict)
    _memo: dict = field(default_factory=dict, compare=False, repr=False)

    def for_gpu(self, gpu: GpuType) -> GpuCalibration:
        key = (gpu.name, gpu.architecture, gpu.peak_tflops)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._for_gpu(gpu)
        return hit

    def _for_gpu(self, gpu: GpuType) -> GpuCalibration:
        found = self.gpus.get(gpu.name)
        if found is not None:
            return found
        arch = (gpu.architecture or "").lower()
        if arch in self.architectures:
            return self.architectures[arch]
        base = self.architectures.get("ampere", GpuCalibration())
        scale = gpu.peak_flops / A100_PEAK_FLOPS
        return replace(base, tokens_half=base.tokens_half * scale,
                       width_half=base.width_half * math.sqrt(scale),
                       source=f"derived from ampere, half sizes scaled by peak ratio {scale:.2f} (unfitted)")

    # -- yaml ---------------------------------------------------------------------------
    def with_entry(self, key: str, entry: GpuCalibration, by: str = "architectures") -> Calibration:
        """A copy with one GPU-type (``by='gpus'``) or architecture entry replaced."""
        table = dict(getattr(self, by))
        table[key] = entry
        return replace(self, _memo={}, **{by: table})

    def with_comm(self, comm: CommCalibration) -> Calibration:
        return replace(self, _memo={}, comm=comm)

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


def load_calibration(path: str | Path | None = None) -> Calibration:
    if path is None:
        return default_calibration()
    from planner.errors import InputError
    from planner.spec.source import read_text

    try:
        return Calibration.from_mapping(yaml.safe_load(read_text(path, "calibration file")) or {})
    except (yaml.YAMLError, TypeError, AttributeError) as exc:
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
