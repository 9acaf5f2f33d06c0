"""A GPU type's own figures, from the catalog or written inline in a cluster spec."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from planner.spec.quantities import (
    MAX_PRICE_USD,
    BandwidthBps,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    SizeBytes,
)

# A GPU that gives only its FP16/BF16 tensor peak: its fp32 matmul rate is taken as that peak
# over 16, the ratio of the A100 (312 dense FP16 tensor / 19.5 FP32 = 16; H100 SXM5 989.4 / 67
# = 14.8; L40S 362 / 91.6 = 4.0, GeForce cards less): a guess, said in a warning.
FP32_FALLBACK_DIVISOR = 16.0


class GpuType(BaseModel):
    """One GPU type.  ``peak_tflops`` is the dense FP16/BF16 tensor peak; ``fp32_tflops`` and
    ``tf32_tflops`` the peaks fp32 and tf32 training compute their matmuls at
    (``peak_flops_for``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, description="catalog id or the user's own name")
    memory_bytes: SizeBytes = Field(alias="memory", description="device memory, e.g. '80 GB'")
    peak_tflops: PositiveFloat = Field(description="dense FP16/BF16 peak in TFLOP/s")
    memory_bandwidth_Bps: BandwidthBps = Field(alias="memory_bandwidth")
    intra_node_bandwidth_Bps: BandwidthBps = Field(
        alias="intra_node_bandwidth", description="per GPU, per direction, inside a node")
    price_per_hour_usd: NonNegativeFloat | None = Field(
        default=None, alias="price_per_hour", le=MAX_PRICE_USD, description="USD per GPU-hour")
    fp32_tflops: PositiveFloat | None = Field(
        default=None, description="dense FP32 peak without tensor cores in TFLOP/s (CUDA cores / "
        "vector units; AMD CDNA: the FP32 matrix peak, which rocBLAS uses for fp32 GEMMs)")
    tf32_tflops: PositiveFloat | None = Field(
        default=None, description="dense TF32 tensor peak in TFLOP/s; absent where the GPU has no "
        "TF32 tensor cores (Volta, Turing, MI250X): tf32 then runs at fp32_tflops")
    # Catalog-only figures (optional inline).
    nic_bandwidth_per_gpu_Bps: BandwidthBps | None = Field(default=None, alias="nic_bandwidth_per_gpu")
    typical_gpus_per_node: PositiveInt | None = None
    supports_bf16: bool = Field(default=True, alias="bf16", description="false for Volta and Turing")
    vendor: str | None = None
    architecture: str | None = None
    aliases: tuple[str, ...] = ()
    sources: dict[str, str] = Field(default_factory=dict)

    @property
    def peak_flops(self) -> float:
        """The dense FP16/BF16 tensor peak in FLOP/s (mixed-precision matmuls)."""
        return self.peak_tflops * 1e12

    def _matmul_peak_tflops(self, precision: str) -> tuple[float, str | None]:
        """(TFLOP/s, the warning when a figure was stood in for) for ``precision``."""
        if precision in ("bf16", "fp16"):
            return self.peak_tflops, None
        if precision not in ("fp32", "tf32"):
            raise ValueError(f"unknown precision {precision!r}; valid: bf16, fp16, fp32, tf32")
        if precision == "tf32" and self.tf32_tflops is not None:
            return self.tf32_tflops, None
        guess = self.peak_tflops / FP32_FALLBACK_DIVISOR
        if precision == "fp32":
            if self.fp32_tflops is not None:
                return self.fp32_tflops, None
            return guess, (f"{self.name} gives no fp32_tflops: its fp32 matmuls are priced at "
                           f"peak_tflops / {FP32_FALLBACK_DIVISOR:g} = {guess:.3g} TFLOP/s (an assumption, "
                           "the A100's FP16-tensor to FP32 ratio); add fp32_tflops to its GPU mapping")
        if self.fp32_tflops is not None:
            return self.fp32_tflops, (f"{self.name} has no TF32 tensor cores (no tf32_tflops): tf32 "
                                      "matmuls run as fp32 on its CUDA cores and are priced at its FP32 "
                                      f"peak, {self.fp32_tflops:g} TFLOP/s")
        return guess, (f"{self.name} gives neither tf32_tflops nor fp32_tflops: its tf32 matmuls are "
                       f"priced at peak_tflops / {FP32_FALLBACK_DIVISOR:g} = {guess:.3g} TFLOP/s (an "
                       "assumption, the A100's FP16-tensor to FP32 ratio, as if it had no TF32 tensor "
                       "cores); add fp32_tflops and tf32_tflops to its GPU mapping")

    def peak_tflops_for(self, precision: str) -> float:
        """Dense matmul peak in TFLOP/s for training in ``precision`` (see ``peak_flops_for``)."""
        return self._matmul_peak_tflops(precision)[0]

    def peak_flops_for(self, precision: str) -> float:
        """Dense matmul peak in FLOP/s for training in ``precision``: bf16/fp16 ``peak_tflops``;
        fp32 ``fp32_tflops``; tf32 ``tf32_tflops``, else (no TF32 tensor cores) ``fp32_tflops``;
        a missing figure ``peak_tflops / 16`` (``precision_note`` then says so)."""
        return self._matmul_peak_tflops(precision)[0] * 1e12

    def precision_note(self, precision: str) -> str | None:
        """The warning to show when ``peak_flops_for(precision)`` stood in one figure for
        another (tf32 without TF32 tensor cores, a GPU without fp32 figures); None otherwise."""
        return self._matmul_peak_tflops(precision)[1]
