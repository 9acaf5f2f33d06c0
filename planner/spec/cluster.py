"""The cluster a user owns or rents (DESIGN §2: Cluster)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

from planner.errors import InputError, Location
from planner.spec.gpu import GpuType
from planner.spec.quantities import MAX_PRICE_USD, BandwidthBps, NonNegativeFloat, PositiveInt, TimeS

DEFAULT_ZONE = "default"


class ZoneSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    region: str | None = None


class NodeGroupSpec(BaseModel):
    """``count`` identical nodes: ``name-0 … name-{count-1}`` (or ``name`` when count is absent)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    count: PositiveInt | None = None
    zone: str | None = None
    gpu: GpuType = Field(description="catalog id, or a mapping of the GPU's own figures")
    gpus_per_node: PositiveInt
    intra_node_bandwidth_Bps: BandwidthBps | None = Field(default=None, alias="intra_node_bandwidth")
    network_bandwidth_Bps: BandwidthBps | None = Field(
        default=None, alias="network_bandwidth", description="the node's NICs together")
    price_per_hour_usd: NonNegativeFloat | None = Field(
        default=None, alias="price_per_hour", le=MAX_PRICE_USD, description="USD per node-hour")
    cores: PositiveInt | None = Field(
        default=None, description="the node's devices share this many compute cores (CPU "
        "processes on a smaller machine): more devices computing at once than cores run at "
        "cores/devices speed; absent: each device computes on its own")

    @property
    def gpu_type(self) -> GpuType:
        return self.gpu

    @property
    def intra_Bps(self) -> float:
        """Per-GPU, per-direction bandwidth inside the node (spec, else the GPU's default)."""
        return self.intra_node_bandwidth_Bps or self.gpu.intra_node_bandwidth_Bps

    @property
    def network_Bps(self) -> float:
        """The node's NICs together (filled from the catalog at load when absent)."""
        assert self.network_bandwidth_Bps is not None, "load the cluster through planner.spec"
        return self.network_bandwidth_Bps

    @property
    def price_usd_per_hour(self) -> float | None:
        """USD per node-hour: the spec's, else the catalog's per-GPU price times GPUs."""
        if self.price_per_hour_usd is not None:
            return self.price_per_hour_usd
        if self.gpu.price_per_hour_usd is not None:
            return self.gpu.price_per_hour_usd * self.gpus_per_node
        return None

    @property
    def node_names(self) -> list[str]:
        if self.count is None:
            return [self.name]
        return [f"{self.name}-{i}" for i in range(self.count)]


class LinkSpec(BaseModel):
    """A symmetric link between two zones (or regions)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    between: tuple[str, str]
    bandwidth_Bps: BandwidthBps = Field(alias="bandwidth", description="one node-to-node flow")
    aggregate_bandwidth_Bps: BandwidthBps | None = Field(
        default=None, alias="aggregate_bandwidth", description="cap on all flows together")
    latency_s: TimeS = Field(default=0.0, alias="latency")
    egress_price_per_gb_usd: NonNegativeFloat = Field(default=0.0, alias="egress_price_per_gb", le=MAX_PRICE_USD)


class Cluster(BaseModel):
    """A validated cluster: GPU types resolved, zones and links checked (see ``spec.load``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    zones: tuple[ZoneSpec, ...] = ()
    nodes: tuple[NodeGroupSpec, ...] = Field(min_length=1)
    links: tuple[LinkSpec, ...] = ()
    profiles: dict[str, str] = Field(
        default_factory=dict, description="GPU type -> profile file (measured per-layer costs)")
    source_sha256: str | None = Field(default=None, exclude=True)
    source_file: str | None = Field(
        default=None, exclude=True, description="the spec file, so relative profile paths resolve")

    @property
    def zone_names(self) -> list[str]:
        return [z.name for z in self.zones] if self.zones else [DEFAULT_ZONE]

    def zone_of(self, group: NodeGroupSpec) -> str:
        return group.zone or (self.zones[0].name if self.zones else DEFAULT_ZONE)

    @cached_property
    def node_list(self) -> list[Node]:
        out = []
        for group in self.nodes:
            for name in group.node_names:
                out.append(Node(name=name, group=group, zone=self.zone_of(group)))
        return out

    @cached_property
    def node_by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.node_list}

    @property
    def num_gpus(self) -> int:
        return sum(n.group.gpus_per_node for n in self.node_list)

    def region_of(self, zone: str) -> str | None:
        return next((z.region for z in self.zones if z.name == zone), None)

    def link(self, zone_a: str, zone_b: str) -> LinkSpec | None:
        """The link between two zones: one named for the zones themselves, else one between
        their regions (DESIGN §2: links join zones or regions)."""
        for pair in ((zone_a, zone_b), (self.region_of(zone_a), self.region_of(zone_b))):
            if None in pair:
                continue
            for link in self.links:
                if set(link.between) == set(pair) and (pair[0] != pair[1] or link.between[0] == link.between[1]):
                    return link
        return None

    def precision_notes(self, precision: str, gpu_types=None) -> list[str]:
        """One warning per GPU type whose matmul peak in ``precision`` stands in one figure for
        another (``GpuType.precision_note``), types in spec order; empty for bf16/fp16.
        ``gpu_types``: only these GPU names (e.g. the ones a plan uses)."""
        notes: list[str] = []
        seen: set[str] = set()
        for group in self.nodes:
            if group.gpu.name in seen or (gpu_types is not None and group.gpu.name not in gpu_types):
                continue
            seen.add(group.gpu.name)
            note = group.gpu.precision_note(precision)
            if note:
                notes.append(note)
        return notes

    def missing_prices(self, what: str, gpu_names) -> InputError:
        """The error for ``what`` (an objective, a front) needing prices that the node groups of
        ``gpu_names`` lack: it names the file and each group by its index and name (it named
        GPU types only, leaving the user to find the groups in a spec of several)."""
        bare = [(i, g) for i, g in enumerate(self.nodes) if g.price_usd_per_hour is None and g.gpu.name in gpu_names]
        groups = ", ".join(f"nodes[{i}] ({g.name}, {g.gpu.name})" for i, g in bare)
        first = bare[0][0] if bare else None
        return InputError(f"{what} needs prices, but {groups or ', '.join(sorted(gpu_names))} "
                          f"{'have' if len(bare) > 1 else 'has'} none and the catalog lists no price for "
                          "its GPU; add price_per_hour "
                          "(USD per node-hour) to each such group",
                          self.locate(("nodes", first, "price_per_hour")) if first is not None
                          else Location(self.source_file or f"cluster {self.name!r}"))

    def locate(self, path: tuple) -> Location:
        """``path`` in the file this spec was read from, at its line (or its nearest spelled-out
        ancestor's: a missing field sits at its group's line) while that file still reads as
        it did; else by field path alone."""
        from pathlib import Path

        from planner.spec.source import format_field_path, load_yaml
        src = self.source_file
        if src and Path(src).is_file():
            text = Path(src).read_text(encoding="utf-8", errors="replace")
            if not self.source_sha256 or hashlib.sha256(text.encode()).hexdigest() == self.source_sha256:
                try:
                    return load_yaml(src, text).locate(path)
                except InputError:
                    pass
        return Location(src or f"cluster {self.name!r}", field=format_field_path(path))

    def sha256(self) -> str:
        if self.source_sha256:
            return self.source_sha256
        return hashlib.sha256(self.model_dump_json(by_alias=True).encode()).hexdigest()


@dataclass(frozen=True)
class Node:
    """One physical node of a group."""

    name: str
    group: NodeGroupSpec
    zone: str

    @property
    def gpu(self) -> GpuType:
        return self.group.gpu_type

    @property
    def gpus_per_node(self) -> int:
        return self.group.gpus_per_node

    def device_ids(self) -> list[str]:
        return [f"{self.name}:{i}" for i in range(self.gpus_per_node)]
