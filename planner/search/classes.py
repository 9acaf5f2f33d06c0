"""Node classes as the solver sees them: what a replica kind costs in units of a class.

A class is a set of identical nodes (GPU type, zone, GPUs per node, links, price) from
``Topology.node_classes()``.  The solver only counts units of each class:

- a class of one node is shared GPU by GPU: stages take slices of that node (any sizes,
  contiguous device ranges), the node is rented once if any slice is used;
- a class of several nodes is shared node by node: a stage takes whole nodes (its replicas
  packed ``gpus_per_node // tp`` to a node, the rest of the last node idle) so that no two
  stages share a node and every path between stages is the class's network path.

A small cluster is also searched with every node its own class (``per_node_view``), so that
two stages can share a node of what would be a class of several.

Both rules make every cost the search computes from representative devices (the first
nodes of the class) equal to what ``planner.cost.evaluate`` computes on the devices the plan
finally names (naming.py follows the same packing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

from planner.topology import NodeClass


@dataclass(frozen=True, eq=False)
class ClassInfo:
    index: int
    node_class: NodeClass

    @property
    def name(self) -> str:
        return self.node_class.name

    @property
    def gpu(self):
        return self.node_class.gpu

    @property
    def gpus_per_node(self) -> int:
        return self.node_class.gpus_per_node

    @property
    def zone(self) -> str:
        return self.node_class.zone

    @cached_property
    def shared_node(self) -> bool:
        """One node: stages share it GPU by GPU."""
        return self.node_class.count == 1

    @cached_property
    def capacity_units(self) -> int:
        return self.gpus_per_node if self.shared_node else self.node_class.count

    def units(self, tp: int, replicas: int) -> int:
        """Units (GPUs of the one node, else nodes) a stage of ``replicas`` x ``tp`` holds."""
        if self.shared_node:
            return tp * replicas
        per_node = self.gpus_per_node // tp
        return math.ceil(replicas / per_node)

    def max_replicas(self, tp: int) -> int:
        per_node = self.gpus_per_node // tp
        return per_node if self.shared_node else per_node * self.node_class.count

    @property
    def node_price_usd_per_hour(self) -> float | None:
        return self.node_class.price_usd_per_hour

    def option_price(self, tp: int, replicas: int) -> float:
        """Per-option price; a shared node is priced once per class instead (resource price)."""
        if self.shared_node or self.node_price_usd_per_hour is None:
            return 0.0
        return self.units(tp, replicas) * self.node_price_usd_per_hour

    def rent_share(self, tp: int, replicas: int) -> float:
        """The rent an option accounts for (floors.py): its nodes' price, or on a shared node
        (rented once per class) its GPUs' share of that node's price."""
        if self.shared_node:
            return (self.node_price_usd_per_hour or 0.0) * self.units(tp, replicas) / self.capacity_units
        return self.option_price(tp, replicas)

    def least_rent(self, tp: int, replicas: int) -> float:
        """USD/hour that any plan using this option rents at least: its nodes, or the whole
        node of a one-node class."""
        if self.shared_node:
            return self.node_price_usd_per_hour or 0.0
        return self.option_price(tp, replicas)

    def replica_devices(self, tp: int, replicas: int, first_node: int = 0,
                        first_gpu: int = 0) -> list[tuple[str, ...]]:
        """Devices of ``replicas`` replicas packed from node ``first_node`` (GPU ``first_gpu``)."""
        out = []
        nodes = self.node_class.node_names
        if self.shared_node:
            g = first_gpu
            for _ in range(replicas):
                out.append(tuple(f"{nodes[0]}:{g + i}" for i in range(tp)))
                g += tp
            return out
        per_node = self.gpus_per_node // tp
        for r in range(replicas):
            node = nodes[first_node + r // per_node]
            base = (r % per_node) * tp
            out.append(tuple(f"{node}:{base + i}" for i in range(tp)))
        return out


def class_infos(topology, precision: str | None = None, per_node: bool = False) -> list[ClassInfo]:
    """The node classes a plan may use; with ``precision="bf16"`` only GPU types that have
    bf16 (Volta and Turing do not: a bf16 job would not start on them).  fp16, fp32 and tf32
    run on every GPU type (tf32 without TF32 tensor cores runs, and is priced, as fp32).
    ``per_node``: each node its own class, shared GPU by GPU (the per-node view,
    ``per_node_view``)."""
    usable = [c for c in topology.node_classes() if precision != "bf16" or c.gpu.supports_bf16]
    if per_node:
        usable = [replace(c, node_names=(name,)) for c in usable for name in c.node_names]
    return [ClassInfo(i, c) for i, c in enumerate(usable)]


PER_NODE_MAX_NODES = 4      # nodes up to which a cluster is also searched in the per-node view


def per_node_view(classes: list[ClassInfo], training) -> bool:
    """Whether a search should also take the per-node view of these classes: a class of
    several nodes hands out whole nodes, so two stages never share one of its nodes, and a
    pipeline inside one node (its sends over NVLink) leaves the space once a second identical
    node joins (a sweep: 2 x 4 L4 on 1 Gbit/s, 6.098 s "optimal" where the one node alone
    gave 5.831 s).  In the per-node view every node is a one-node class, shared GPU by GPU,
    and no stage spans two nodes; the union of the two views holds both kinds of plan.  Only
    small clusters (the view's classes multiply the search's work): at most
    PER_NODE_MAX_NODES nodes, some class of two or more; and pipelines allowed (``max_stages``
    1: the view adds no plan, its one stage holds one node).  Not beside mixed stages over two
    classes (the mixed search's two phases keep the view as classes); with mixed stages asked
    and no two classes to pair, the view's nodes of one zone may pair.  The search
    (solve._guarded) and the oracle read this one rule."""
    from planner.search.mixed import class_pairs  # here: mixed.py imports modules that import this one

    nodes = sum(c.node_class.count for c in classes)
    return (nodes <= PER_NODE_MAX_NODES and any(c.node_class.count >= 2 for c in classes)
            and training.max_stages != 1 and not (training.mixed_stages and class_pairs(classes)))


def classes_without_bf16(topology) -> list:
    return [c for c in topology.node_classes() if not c.gpu.supports_bf16]
