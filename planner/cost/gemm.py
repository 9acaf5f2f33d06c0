"""Time of one matrix multiplication on one GPU, from its own M, N, K.

A GEMM ``C[M, N] = A[M, K] @ B[K, N]`` (``batch`` of them for the attention core) does
``2 M N K`` FLOPs.  Its time is the larger of

    compute: 2 M N K / (peak(precision) * efficiency(M N, K))
    memory:  element bytes * (M K + K N + M N) / memory bandwidth

The efficiency has two factors, each from how a GEMM library runs on the GPU:

- wave fill, ``x / (x + x_half)`` with ``x = M N batch`` output elements: the output is cut into
  tiles, one per SM at a time; while there are too few tiles to keep every SM busy (and hide
  each SM's memory latency), the GPU idles.  ``x_half`` counts output elements, so it grows
  with the number of SMs to fill (across GPU types it scales with the peak, calibration.py)
  but not with the precision: the tiles per SM are the same whether the tensor cores run
  bf16 or tf32.  Measured: on the H200 (reference/device/h200-2026-12-04, Llama-3-8B's 129
  shapes timed in both) tf32 reaches a median 0.95 of the fraction of its own peak that bf16
  reaches on the same shape, where a fill size scaled by the precision's peak would have had
  tf32 ahead at every shape short of saturation (tf32 GEMMs were predicted 24% fast with it,
  19% without).  On the 65 shapes of 1e11 FLOPs and more, where the ceiling binds, the median
  is 0.88 (0.67-1.02): TF32's ceiling sits below bf16's.  Applied to Hopper's TF32 (tried
  2026-12-05) it moved Sailor's GH200 set by 0.2 points (its OPT-350M blocks are not
  ceiling-bound), and one GPU's sweep is all that measures it, so it is not applied.
- K-loop amortisation, ``K / (K + k_half)``: every output tile pays a fixed prologue and
  epilogue (loading the pipeline, writing C) worth ``k_half`` steps of its K loop.

Both half-sizes are fitted on one GPU in a 2-byte precision (the calibration entry's
``fitted_on``: the A100 for ampere, on training runs; the H200 for hopper, on its GEMM sweep,
gemm_sweep_fit.py) and carried to the GPU and precision
priced by what sets them (``transferred_halves``), not copied:

- ``x_half`` by the dense FP16/BF16 peak over the fitted GPU's (Little's law: the work in
  flight that keeps a GPU busy is its throughput times the latency to hide; libraries pick
  larger tiles on faster SMs), the same in every precision (the H200 measurement above).  An
  RTX 3090 (71 TFLOP/s) under the ampere entry fills at a quarter of the A100's size.
- ``k_half`` by the precision's matmul peak times its operand bytes over the 2-byte peak's:
  the per-tile fixed work is moving operand tiles and C through memory (bytes), one K step is
  compute (1 / peak).  TF32 on tensor cores has half the BF16 peak and twice the bytes, so
  the same ``k_half`` (as measured on the H200); FP32 on CUDA cores (V100, Turing, any GPU in
  ``fp32``) has an eighth to a sixteenth of the peak, so a K loop amortised 4-8x sooner.
  Across GPUs ``k_half`` is kept: what changes it there (memory latency and bandwidth per SM
  against the tensor rate) is not measured on more than the two fitted GPUs.
  Check (not fitted): Sailor's per-layer profiles of OPT-350M and GPT-Neo-2.7B on seven GPU
  types (``python -m planner.cost.layer_check``).

The product is normalised to equal the GPU's published *maximum achievable matmul* fraction
(catalog ``benchmarks.yaml``) at the shape where that was measured, and never exceeds it:
``eff = ceiling * min(1, f(M N, K) / f(M* N*, K*))``.  A MAMF is the best shape of a sweep,
which a training GEMM of the same size is not: in bf16 and fp16 the ceiling is 0.90 of it, the
median a large training GEMM reached on the H200 (``MatmulCeiling.training_fraction``).  So
the ceiling comes from micro-benchmarks, and only the two half-sizes from fitting training runs.

Backward: each GEMM of the forward becomes two, with their own shapes (and efficiencies):
``dgrad`` (``dA = dC B^T``: M x K output, reduction over N) and ``wgrad`` (``dB = A^T dC``:
K x N output, reduction over M).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.catalog.benchmarks import matmul_ceiling
from planner.spec.gpu import GpuType


@dataclass(frozen=True)
class Gemm:
    """``batch`` independent ``[m, k] @ [k, n]`` products, named for explanations."""

    name: str
    m: float
    n: float
    k: float
    batch: float = 1.0

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def outputs(self) -> float:
        return self.m * self.n * self.batch

    def operand_elements(self) -> float:
        return (self.m * self.k + self.k * self.n + self.m * self.n) * self.batch

    def dgrad(self) -> Gemm:
        return Gemm(f"{self.name}.dgrad", self.m, self.k, self.n, self.batch)

    def wgrad(self) -> Gemm:
        return Gemm(f"{self.name}.wgrad", self.k, self.n, self.m, self.batch)


def _shape_factor(outputs: float, depth: float, outputs_half: float, depth_half: float) -> float:
    return outputs / (outputs + outputs_half) * depth / (depth + depth_half)


@dataclass(frozen=True)
class GemmCurve:
    """The efficiency curve of one GPU type in one precision (see the module docstring)."""

    ceiling: float          # fraction of peak at the reference shape
    outputs_half: float     # x_half in output elements (precision-independent)
    depth_half: float       # k_half
    reference: float        # the shape factor at the benchmark's shape
    peak_flops: float
    memory_Bps: float       # achieved memory bandwidth (peak x mem_eff)
    element_bytes: int

    def efficiency(self, g: Gemm) -> float:
        f = _shape_factor(g.outputs, g.k, self.outputs_half, self.depth_half)
        return self.ceiling * min(1.0, f / self.reference)

    def time_s(self, g: Gemm) -> float:
        if g.flops <= 0:
            return 0.0
        compute = g.flops / (self.peak_flops * self.efficiency(g))
        memory = self.element_bytes * g.operand_elements() / self.memory_Bps
        return max(compute, memory)


# the precision the calibration sets ran in (vtrain-single fp16, megatron-core bf16)
FITTED_ELEMENT_BYTES = 2


def carried_outputs_half(gpu: GpuType, cal) -> float:
    """The entry's fill size ``x_half``, fitted on ``cal.fitted_on``, carried to ``gpu`` by
    peak (module docstring); unchanged where that GPU is not named (a calibration file that
    does not say, or a GPU the catalog does not hold)."""
    from planner.catalog import find_gpu
    ref = find_gpu(cal.fitted_on) if cal.fitted_on else None
    return cal.gemm_outputs_half * (gpu.peak_flops / ref.peak_flops if ref is not None else 1.0)


def transferred_halves(gpu: GpuType, precision: str, cal, element_bytes: int) -> tuple[float, float]:
    """(``x_half``, ``k_half``) of ``gpu`` in ``precision`` from the entry's values, fitted in a
    2-byte precision on ``cal.fitted_on`` (module docstring)."""
    outputs_half = carried_outputs_half(gpu, cal)
    operand_rate = gpu.peak_flops_for(precision) * element_bytes / (gpu.peak_flops * FITTED_ELEMENT_BYTES)
    return outputs_half, cal.gemm_depth_half * operand_rate


def gemm_curve(gpu: GpuType, precision: str, cal, element_bytes: int) -> GemmCurve:
    """``cal``: the GPU's ``GpuCalibration`` (half-sizes fitted on ``cal.fitted_on``)."""
    bench = matmul_ceiling(gpu.name)
    ceiling = cal.matmul_ceiling if cal.matmul_ceiling is not None else bench.training_fraction(precision)
    peak = gpu.peak_flops_for(precision)  # tensor cores, or the CUDA cores for fp32
    outputs_half, depth_half = transferred_halves(gpu, precision, cal, element_bytes)
    m, n, k = bench.shape
    reference = _shape_factor(m * n, k, outputs_half, depth_half)
    return GemmCurve(ceiling, outputs_half, depth_half, reference, peak,
                     gpu.memory_bandwidth_Bps * cal.mem_eff, element_bytes)
