"""Values the topology hands out: a path between devices, a ring, a two-level hierarchy,
and a class of identical nodes.  Plain frozen dataclasses: internal values, not inputs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.spec.gpu import GpuType

# Latencies of one small message, end to end, as NCCL sees them.  They are not in the spec:
# users rarely know them, and at the message sizes of training (MBs) they matter little
# except across zones, where the spec's link latency dominates.
#  - NVLink / PCIe peer-to-peer inside a node: the wire is ~100s of ns, but a send costs a
#    kernel launch and a flag handshake, which nccl-tests put at ~1-2 us for tiny messages.
INTRA_NODE_LATENCY_S = 2e-6
#  - InfiniBand / RoCE between nodes of one zone: ~1 us on the wire plus switch hops and the
#    proxy thread; nccl-tests small-message latencies across nodes are ~5-10 us.
NETWORK_LATENCY_S = 8e-6

KINDS = ("same-device", "nvlink", "network", "zone-link")


@dataclass(frozen=True)
class Path:
    """The bandwidth (bytes/s, one direction) and latency of moving data between two places.

    ``kind``: ``same-device`` (no transfer), ``nvlink`` (inside one node, NVLink or PCIe),
    ``network`` (between nodes of one zone), ``zone-link`` (crossing a zone link).
    """

    bandwidth_Bps: float
    latency_s: float
    kind: str

    def time_s(self, num_bytes: float) -> float:
        """Time to move ``num_bytes`` as one message (latency + size / bandwidth)."""
        if num_bytes <= 0 or self.kind == "same-device":
            return 0.0
        return self.latency_s + num_bytes / self.bandwidth_Bps


SAME_DEVICE = Path(bandwidth_Bps=math.inf, latency_s=0.0, kind="same-device")


@dataclass(frozen=True)
class Ring:
    """A ring collective over a set of devices.

    ``bandwidth_Bps`` is the bus bandwidth of one ring step (what every hop sustains at once),
    ``latency_s`` the largest hop latency; a ring all-reduce of ``S`` bytes over ``n`` devices
    then takes ``2 (n-1)/n * S / bandwidth_Bps + 2 (n-1) * latency_s``.  ``kind`` is the
    slowest hop's kind; ``bottleneck`` says in words which hop binds.
    """

    bandwidth_Bps: float
    latency_s: float
    kind: str
    size: int
    bottleneck: str

    @property
    def path(self) -> Path:
        return Path(self.bandwidth_Bps, self.latency_s, self.kind)

    def allreduce_s(self, num_bytes: float) -> float:
        n = self.size
        if n <= 1 or num_bytes <= 0:
            return 0.0
        return 2 * (n - 1) / n * num_bytes / self.bandwidth_Bps + 2 * (n - 1) * self.latency_s

    def reduce_scatter_s(self, num_bytes: float) -> float:
        """Reduce-scatter (or all-gather) of a ``num_bytes`` buffer: half an all-reduce."""
        return self.allreduce_s(num_bytes) / 2


@dataclass(frozen=True)
class Hierarchy:
    """Two-level collective: a ring inside each node, then a ring between node leaders.

    ``intra`` is the slowest node's inner ring (``size`` = most devices on one node),
    ``inter`` the ring between nodes, each hop a node-to-node flow that may use all the
    node's NICs (``size`` = number of nodes).  Either level may have size 1 (nothing to do).
    """

    intra: Ring
    inter: Ring
    num_nodes: int
    max_devices_per_node: int


@dataclass(frozen=True)
class NodeClass:
    """Identical nodes: same GPU type, zone, GPUs per node, links and price."""

    gpu: GpuType
    zone: str
    gpus_per_node: int
    intra_Bps: float
    network_Bps: float
    price_usd_per_hour: float | None  # per node-hour
    node_names: tuple[str, ...]

    @property
    def count(self) -> int:
        return len(self.node_names)

    @property
    def num_gpus(self) -> int:
        return self.count * self.gpus_per_node

    @property
    def gpu_name(self) -> str:
        return self.gpu.name

    @property
    def name(self) -> str:
        """A short readable id such as ``A100-SXM4-80GB@us-central1-a/8``."""
        return f"{self.gpu.name}@{self.zone}/{self.gpus_per_node}"
