"""The rank map: which process runs where (DESIGN §4, ``launch``).

- Node ranks follow the order in which nodes first appear in the plan (stage order, then
  replica order, then device order), so stage 0's node is node rank 0 (the rendezvous host).
- ``nproc_per_node`` is the number of that node's GPUs the plan uses; unused GPUs get no rank.
- Global ranks are numbered node by node and, within a node, by local GPU index.  This is how
  torchrun (torchelastic) numbers ranks when nodes run different process counts: a node's first
  rank is the sum of the process counts of the nodes with lower node rank.
"""

from __future__ import annotations

from planner.errors import InputError
from planner.plan.model import LaunchInfo, LaunchNode, LaunchRank, Plan
from planner.spec.cluster import Cluster


def rank_map(plan: Plan) -> LaunchInfo:
    """The node list and the rank of every device, from the plan alone; deterministic."""
    placement: dict[str, tuple[int, int, int]] = {}  # device -> (stage, replica, tp_rank)
    by_node: dict[str, list[str]] = {}  # insertion order = first appearance
    for stage in plan.stages:
        for r, rep in enumerate(stage.replicas):
            for t, dev in enumerate(rep.devices):
                if dev in placement:
                    raise InputError(f"device {dev!r} is used twice in the plan; check it with "
                                     "planner.plan.check.check_plan first")
                placement[dev] = (stage.index, r, t)
                by_node.setdefault(dev.rpartition(":")[0], []).append(dev)
    nodes, ranks = [], []
    for node_rank, (node, devices) in enumerate(by_node.items()):
        nodes.append(LaunchNode(node=node, node_rank=node_rank, nproc_per_node=len(devices)))
        for dev in sorted(devices, key=lambda d: int(d.rpartition(":")[2])):
            stage, replica, tp_rank = placement[dev]
            ranks.append(LaunchRank(rank=len(ranks), device=dev, stage=stage, replica=replica,
                                    tp_rank=tp_rank))
    return LaunchInfo(nodes=tuple(nodes), ranks=tuple(ranks))


def build_launch(cluster: Cluster, plan: Plan) -> LaunchInfo:
    """``rank_map`` after checking that every node the plan uses is in ``cluster``."""
    for dev in plan.devices():
        node = dev.rpartition(":")[0]
        if node not in cluster.node_by_name:
            raise InputError(f"device {dev!r} is on node {node!r}, which cluster "
                             f"{cluster.name!r} does not have")
    return rank_map(plan)
