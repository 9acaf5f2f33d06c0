"""A GPU type's own figures, from the catalog or written inline in a cluster spec."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from planner.spec.quantities import BandwidthBps, NonNegativeFloat, PositiveFloat, PositiveInt, SizeBytes


class GpuType(BaseModel):
    """One GPU type.  ``peak_tflops`` is the dense FP16/BF16 tensor peak."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, description="catalog id or the user's own name")
    memory_bytes: SizeBytes = Field(alias="memory", description="device memory, e.g. '80 GB'")
    peak_tflops: PositiveFloat = Field(description="dense FP16/BF16 peak in TFLOP/s")
    memory_bandwidth_Bps: BandwidthBps = Field(alias="memory_bandwidth")
    intra_node_bandwidth_Bps: BandwidthBps = Field(
        alias="intra_node_bandwidth", description="per GPU, per direction, inside a node")
    price_per_hour_usd: NonNegativeFloat | None = Field(
        default=None, alias="price_per_hour", description="USD per GPU-hour")
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
        return self.peak_tflops * 1e12
