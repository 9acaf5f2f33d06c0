"""The device graph of a cluster and the bandwidth / latency between device sets.

Graph nodes are zones, nodes and devices; edges are device-node (the GPU's intra-node
link), node-zone (the node's NICs) and zone-zone (the spec's links).  Bandwidth between two
devices is derived from their node and zone membership rather than stored per pair: a
16,384-GPU cluster would otherwise need ~10^8 edges.

Choices:
- ``network_bandwidth`` in the spec is a node's NICs together.  A point-to-point send from
  one GPU (a pipeline send) goes through the NIC nearest that GPU, so it gets the per-GPU
  share ``network_Bps / gpus_per_node``; on DGX-style nodes (one NIC per GPU) that is exactly
  one NIC, and when a whole TP group sends its slices at once every GPU gets its own share.
  A node-level collective (the inter-node level of a hierarchical all-reduce) can use all
  the NICs.
- A ring's inter-node hop gets ``k`` NIC shares when the ring holds ``k`` GPUs on the node:
  NCCL runs one channel per GPU and spreads channels over the NICs.
- A zone link's ``bandwidth`` is one node-to-node flow; ``aggregate_bandwidth`` caps all flows
  across it together, so ``k`` rings crossing it at once get ``aggregate / k`` each.  Links
  are full duplex: the two directions do not share capacity.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache
from itertools import pairwise

import networkx as nx

from planner.errors import InputError
from planner.plan.model import parse_device
from planner.spec.cluster import Cluster, Node
from planner.topology.paths import (
    INTRA_NODE_LATENCY_S,
    NETWORK_LATENCY_S,
    SAME_DEVICE,
    Hierarchy,
    NodeClass,
    Path,
    Ring,
)


class Topology:
    """Read-only view of a cluster as a graph; every answer is deterministic and cached."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.nodes: list[Node] = list(cluster.node_list)
        self._node_by_name: dict[str, Node] = {n.name: n for n in self.nodes}
        self._node_order: dict[str, int] = {n.name: i for i, n in enumerate(self.nodes)}
        self._zone_order: dict[str, int] = {z: i for i, z in enumerate(cluster.zone_names)}
        self.graph = self._build_graph()
        # Bound per instance so the caches die with the topology.
        self.zone_path = lru_cache(maxsize=None)(self._zone_path)
        self._p2p_cached = lru_cache(maxsize=1 << 16)(self._p2p)
        self._rings: dict[tuple[frozenset, int], Ring] = {}

    # -- construction ------------------------------------------------------------------
    def _build_graph(self) -> nx.Graph:
        g = nx.Graph()
        for zone in self.cluster.zone_names:
            g.add_node(("zone", zone), kind="zone")
        for node in self.nodes:
            g.add_node(("node", node.name), kind="node", zone=node.zone)
            g.add_edge(("node", node.name), ("zone", node.zone), bandwidth_Bps=node.group.network_Bps,
                       latency_s=NETWORK_LATENCY_S)
            devs = [("device", d) for d in node.device_ids()]
            g.add_nodes_from(devs, kind="device", node=node.name)
            g.add_edges_from(((d, ("node", node.name)) for d in devs),
                             bandwidth_Bps=node.group.intra_Bps, latency_s=INTRA_NODE_LATENCY_S)
        zones = self.cluster.zone_names
        for a, b in itertools.combinations(zones, 2):  # zone links, or their regions' link
            link = self.cluster.link(a, b)
            if link is not None:
                g.add_edge(("zone", a), ("zone", b), bandwidth_Bps=link.bandwidth_Bps,
                           aggregate_Bps=link.aggregate_bandwidth_Bps or math.inf,
                           latency_s=link.latency_s)
        return g

    # -- look-ups ----------------------------------------------------------------------
    def device_ids(self) -> list[str]:
        return [d for n in self.nodes for d in n.device_ids()]

    def node(self, name: str) -> Node:
        try:
            return self._node_by_name[name]
        except KeyError:
            raise InputError(f"unknown node {name!r}; nodes: {self._describe_nodes()}") from None

    def node_of(self, device: str) -> Node:
        """The node holding ``device`` (``'<node>:<index>'``); InputError if it does not exist."""
        if not self.has_device(device):
            raise InputError(f"unknown device {device!r}; devices are '<node>:<0..gpus_per_node-1>' "
                             f"with nodes {self._describe_nodes()}")
        return self._node_by_name[device.rpartition(":")[0]]

    def has_device(self, device: str) -> bool:
        try:
            name, idx = parse_device(device)
        except ValueError:
            return False
        node = self._node_by_name.get(name)
        return node is not None and idx < node.gpus_per_node

    def _describe_nodes(self, limit: int = 12) -> str:
        names = [f"{n.name} ({n.gpus_per_node}x {n.gpu.name})" for n in self.nodes[:limit]]
        if len(self.nodes) > limit:
            names.append(f"... {len(self.nodes) - limit} more")
        return ", ".join(names)

    def _keyed(self, devices) -> list[tuple[int, int, int, str, Node]]:
        out = []
        for d in set(devices):
            node = self.node_of(d)
            out.append((self._zone_order.get(node.zone, 0), self._node_order[node.name],
                        int(d.rpartition(":")[2]), d, node))
        out.sort(key=lambda t: t[:3])
        return out

    def sort_devices(self, devices) -> list[str]:
        """Devices in cluster order: zone, node, local index (the order NCCL rings follow)."""
        return [t[3] for t in self._keyed(devices)]

    # -- point to point ----------------------------------------------------------------
    @staticmethod
    def nic_share_Bps(node: Node) -> float:
        """What one GPU's flow gets from the node's NICs (see the module docstring)."""
        return node.group.network_Bps / node.gpus_per_node

    def _zone_path(self, zone_a: str, zone_b: str) -> tuple[float, float, float]:
        """(per-flow bandwidth, aggregate bandwidth, latency) between two zones.

        A direct link when the spec has one, else the lowest-latency route over links, with
        its narrowest hop.  The spec requires a link between every pair of zones holding
        nodes, so the route case only serves hand-built clusters.
        """
        if zone_a == zone_b:
            return (math.inf, math.inf, 0.0)
        link = self.cluster.link(zone_a, zone_b)
        if link is not None:
            return (link.bandwidth_Bps, link.aggregate_bandwidth_Bps or math.inf, link.latency_s)
        zones = self.graph.subgraph(("zone", z) for z in self.cluster.zone_names)
        try:
            route = nx.shortest_path(zones, ("zone", zone_a), ("zone", zone_b), weight="latency_s")
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            raise InputError(f"no link joins zones {zone_a!r} and {zone_b!r}; add one under links") from None
        edges = [zones.edges[u, v] for u, v in pairwise(route)]
        return (min(e["bandwidth_Bps"] for e in edges), min(e["aggregate_Bps"] for e in edges),
                sum(e["latency_s"] for e in edges))

    def p2p(self, dev_a: str, dev_b: str) -> Path:
        """The path a point-to-point send from ``dev_a`` to ``dev_b`` takes (cached)."""
        return self._p2p_cached(dev_a, dev_b)

    def _p2p(self, dev_a: str, dev_b: str) -> Path:
        node_a, node_b = self.node_of(dev_a), self.node_of(dev_b)
        if dev_a == dev_b:
            return SAME_DEVICE
        if node_a is node_b:
            return Path(node_a.group.intra_Bps, INTRA_NODE_LATENCY_S, "nvlink")
        nic = min(self.nic_share_Bps(node_a), self.nic_share_Bps(node_b))
        if node_a.zone == node_b.zone:
            return Path(nic, NETWORK_LATENCY_S, "network")
        link_Bps, _, latency = self.zone_path(node_a.zone, node_b.zone)
        return Path(min(nic, link_Bps), max(latency, NETWORK_LATENCY_S), "zone-link")

    def node_p2p(self, node_a: str, node_b: str, concurrent_flows: int = 1) -> Path:
        """A node-to-node flow that may use all NICs of both nodes (node-level collectives)."""
        a, b = self.node(node_a), self.node(node_b)
        if a is b:
            return Path(a.group.intra_Bps * a.gpus_per_node, INTRA_NODE_LATENCY_S, "nvlink")
        nic = min(a.group.network_Bps, b.group.network_Bps)
        if a.zone == b.zone:
            return Path(nic, NETWORK_LATENCY_S, "network")
        link_Bps, agg_Bps, latency = self.zone_path(a.zone, b.zone)
        return Path(min(nic, link_Bps, agg_Bps / max(1, concurrent_flows)),
                    max(latency, NETWORK_LATENCY_S), "zone-link")

    # -- collectives -------------------------------------------------------------------
    def _group_by_node(self, devices) -> list[tuple[Node, int]]:
        """(node, devices of the set on it), in cluster order."""
        out: list[tuple[Node, int]] = []
        for *_, node in self._keyed(devices):
            if out and out[-1][0] is node:
                out[-1] = (node, out[-1][1] + 1)
            else:
                out.append((node, 1))
        return out

    def ring(self, devices, concurrent_rings: int = 1) -> Ring:
        """The bottleneck of a ring over ``devices`` (ordered by zone, node, index).

        ``concurrent_rings``: how many rings (e.g. the data-parallel groups of the TP ranks
        of a stage) cross the same zone links at the same time; they share the links'
        aggregate bandwidth.
        """
        key = (frozenset(devices), concurrent_rings)
        hit = self._rings.get(key)
        if hit is None:
            if len(self._rings) > 4096:
                self._rings.clear()
            hit = self._rings[key] = self._ring(key[0], concurrent_rings)
        return hit

    def _ring(self, devices: frozenset, concurrent_rings: int) -> Ring:
        groups = self._group_by_node(devices)
        size = sum(k for _, k in groups)
        if size <= 1:
            return Ring(math.inf, 0.0, "same-device", size, "one device")
        hops: list[tuple[float, float, str, str]] = []  # (bandwidth, latency, kind, label)
        for node, k in groups:
            if k >= 2:
                hops.append((node.group.intra_Bps, INTRA_NODE_LATENCY_S, "nvlink",
                             f"intra-node link of {node.name}"))
        if len(groups) >= 2:
            for (a, ka), (b, kb) in zip(groups, groups[1:] + groups[:1]):
                nic = min(ka * self.nic_share_Bps(a), kb * self.nic_share_Bps(b))
                if a.zone == b.zone:
                    hops.append((nic, NETWORK_LATENCY_S, "network", f"NICs {a.name}->{b.name}"))
                    continue
                link_Bps, agg_Bps, latency = self.zone_path(a.zone, b.zone)
                bw = min(nic, link_Bps, agg_Bps / max(1, concurrent_rings))
                hops.append((bw, max(latency, NETWORK_LATENCY_S), "zone-link",
                             f"zone link {a.zone}->{b.zone}"))
                if len(groups) == 2:
                    break  # two nodes: the ring goes a->b and b->a, the same hop both ways
        bw, _, kind, label = min(hops, key=lambda h: (h[0], -h[1]))
        return Ring(bw, max(h[1] for h in hops), kind, size, label)

    def hierarchical(self, devices, concurrent_rings: int = 1) -> Hierarchy:
        """Intra-node ring on every node, then a ring between node leaders using all NICs."""
        groups = self._group_by_node(devices)
        inner = [(node, k) for node, k in groups if k >= 2]
        max_k = max((k for _, k in groups), default=0)
        if inner:
            slow = min(inner, key=lambda nk: nk[0].group.intra_Bps)[0]
            intra = Ring(slow.group.intra_Bps, INTRA_NODE_LATENCY_S, "nvlink", max_k,
                         f"intra-node link of {slow.name}")
        else:
            intra = Ring(math.inf, 0.0, "same-device", max(1, max_k), "one device per node")
        if len(groups) <= 1:
            inter = Ring(math.inf, 0.0, "same-device", len(groups), "one node")
        else:
            hops = []
            pairs = list(zip(groups, groups[1:] + groups[:1]))
            for (a, _), (b, _) in pairs[:1] if len(groups) == 2 else pairs:
                path = self.node_p2p(a.name, b.name, concurrent_rings)
                hops.append((path, f"{a.name}->{b.name}"))
            path, label = min(hops, key=lambda h: (h[0].bandwidth_Bps, -h[0].latency_s))
            inter = Ring(path.bandwidth_Bps, max(h[0].latency_s for h in hops), path.kind,
                         len(groups), label)
        return Hierarchy(intra=intra, inter=inter, num_nodes=len(groups), max_devices_per_node=max_k)

    # -- node classes ------------------------------------------------------------------
    def node_classes(self) -> list[NodeClass]:
        """Identical nodes grouped, sorted by GPU name, zone, GPUs per node, then figures."""
        if getattr(self, "_classes", None) is None:
            buckets: dict[tuple, list[Node]] = {}
            gpu_json: dict[int, str] = {}  # one dump per node group, not per node
            for node in self.nodes:
                g = node.group
                if id(g) not in gpu_json:
                    gpu_json[id(g)] = node.gpu.model_dump_json()
                key = (node.gpu.name, node.zone, node.gpus_per_node, g.intra_Bps, g.network_Bps,
                       -1.0 if g.price_usd_per_hour is None else g.price_usd_per_hour,
                       gpu_json[id(g)])
                buckets.setdefault(key, []).append(node)
            classes = []
            for key in sorted(buckets):
                nodes = buckets[key]
                first = nodes[0]
                classes.append(NodeClass(
                    gpu=first.gpu, zone=first.zone, gpus_per_node=first.gpus_per_node,
                    intra_Bps=first.group.intra_Bps, network_Bps=first.group.network_Bps,
                    price_usd_per_hour=first.group.price_usd_per_hour,
                    node_names=tuple(n.name for n in nodes)))
            self._classes = classes
            self._class_of = {name: c for c in classes for name in c.node_names}
        return list(self._classes)

    def node_class_of(self, node_name: str) -> NodeClass:
        self.node_classes()
        return self._class_of[self.node(node_name).name]
