"""Loading ``benchmarks.yaml``: published micro-benchmark figures (matmul ceilings, NCCL bus
bandwidths) that anchor the cost model.  Data and look-ups only."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

_FILE = Path(__file__).with_name("benchmarks.yaml")
TYPICAL_SHAPE_PRECISIONS = ("bf16", "fp16")


@dataclass(frozen=True)
class MatmulCeiling:
    """The best measured GEMM of a GPU type: ``fraction`` of its dense tensor peak at ``shape``,
    and what a training GEMM as large reaches of it (``typical``, benchmarks.yaml)."""

    fraction: float
    shape: tuple[int, int, int]     # M, N, K of the best measured GEMM
    source: str
    measured: bool                  # False: the default for GPU types nobody published
    typical: float = 1.0            # median training shape at saturation / the best shape
    typical_source: str = ""

    def training_fraction(self, precision: str) -> float:
        """The ceiling a large training GEMM is priced at: the best shape's, times ``typical`` in
        the 2-byte tensor-core precisions it was measured in (benchmarks.yaml)."""
        return self.fraction * (self.typical if precision in TYPICAL_SHAPE_PRECISIONS else 1.0)


@dataclass(frozen=True)
class CollectiveFigures:
    busbw_fraction: float           # NCCL bus bandwidth / per-direction line rate, inside a node
    source: str
    intra_step_latency_s: float     # one ring step inside a node
    inter_step_latency_s: float     # one ring step (or send) between nodes
    network_busbw_fraction: float   # the same fraction on NIC and zone links
    network_source: str


@lru_cache(maxsize=1)
def _data() -> dict:
    return yaml.safe_load(_FILE.read_text())


@lru_cache(maxsize=256)
def matmul_ceiling(gpu_name: str) -> MatmulCeiling:
    entry = _data()["matmul_ceilings"].get(gpu_name)
    measured = entry is not None
    entry = entry or _data()["matmul_ceiling_default"]
    typical = _data()["matmul_typical_shape"]
    return MatmulCeiling(float(entry["fraction"]), tuple(int(x) for x in entry["shape"]),
                         str(entry["source"]), measured, float(typical["fraction"]), str(typical["source"]))


@lru_cache(maxsize=64)
def collective_figures(architecture: str | None) -> CollectiveFigures:
    c = _data()["collectives"]
    entry = c.get((architecture or "").lower()) or c["default"]
    return CollectiveFigures(float(entry["busbw_fraction"]), str(entry["source"]),
                             float(c["intra_node_step_latency_s"]), float(c["inter_node_step_latency_s"]),
                             float(c["network_busbw_fraction"]), str(c["network_source"]))
