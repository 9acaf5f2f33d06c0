"""The device graph (DESIGN §1: topology): devices, nodes, zones, links; bandwidth and
latency between device sets; identical nodes grouped into node classes.  No times here."""

from planner.topology.graph import Topology
from planner.topology.paths import (
    INTRA_NODE_LATENCY_S,
    KINDS,
    NETWORK_LATENCY_S,
    SAME_DEVICE,
    Hierarchy,
    NodeClass,
    Path,
    Ring,
)

__all__ = [
    "INTRA_NODE_LATENCY_S", "KINDS", "NETWORK_LATENCY_S", "SAME_DEVICE", "Hierarchy", "NodeClass",
    "Path", "Ring", "Topology",
]
