"""Which process runs what: the rank layouts the formats use.

torchrun's static rendezvous numbers global ranks node by node (node rank 0 gets ranks
0..n0-1, node rank 1 the next n1, ...; torch/distributed/elastic/agent/server/api.py,
``_assign_worker_ranks``).  Within a node, LOCAL_RANK ``i`` is the ``i``-th entry of
CUDA_VISIBLE_DEVICES, so any device order inside a node is reachable; across nodes, each node's
ranks must be one contiguous block.

* ``plan_layout``: the plan's own rank map (``planner.plan.rankmap.build_launch`` when a cluster
  is at hand, else ``plan.launch``, else derived by the same rule): nodes in the order they first
  appear in the plan, ranks node by node, by GPU index inside a node.  torchrun and pipelining use it, since the training
  script (or our process-group snippet) reads the map.
* ``framework_layout``: Megatron-LM and DeepSpeed compute each rank's (pipeline, data, tensor)
  coordinates from the global rank themselves, so the map must follow their numbering.
"""

from __future__ import annotations

from itertools import product

from planner.errors import InputError
from planner.launch.common import Layout, NodeSlot, RankSlot
from planner.plan import LaunchInfo, Plan

# Axis orders, slowest first; the last axis varies fastest along global ranks.
AXES_PP_DP_TP = ("pp", "dp", "tp")  # Megatron-LM default "tp-cp-ep-dp-pp"; DeepSpeed pipe,data,model
AXES_DP_PP_TP = ("dp", "pp", "tp")  # Megatron-LM --use-tp-pp-dp-mapping; DeepSpeed data,pipe,model


def _node_of(device: str) -> str:
    return device.rpartition(":")[0]


def _plan_slots(plan: Plan) -> list[tuple[int, int, int, str]]:
    """(stage, replica, tp_rank, device) in plan order."""
    return [(s.index, j, t, d) for s in plan.stages for j, r in enumerate(s.replicas)
            for t, d in enumerate(r.devices)]


def derive_launch(plan: Plan) -> LaunchInfo:
    """The rank map of DESIGN §4 from the plan alone (no cluster at hand)."""
    from planner.plan.rankmap import rank_map

    return rank_map(plan)


def _launch_info(plan: Plan, cluster) -> tuple[LaunchInfo, str]:
    if cluster is not None:
        from planner.plan.rankmap import build_launch

        return build_launch(cluster, plan), "plan.rankmap"
    if plan.launch is not None:
        return plan.launch, "plan.launch"
    return derive_launch(plan), "derived"


def plan_layout(plan: Plan, cluster=None) -> Layout:
    info, source = _launch_info(plan, cluster)
    _check_launch_info(plan, info, source)
    ranks_by_node: dict[str, list] = {}
    for r in sorted(info.ranks, key=lambda r: r.rank):
        ranks_by_node.setdefault(_node_of(r.device), []).append(r)
    nodes = []
    for n in sorted(info.nodes, key=lambda n: n.node_rank):
        slots = tuple(RankSlot(r.rank, n.node, i, r.device, r.stage, r.replica, r.tp_rank)
                      for i, r in enumerate(ranks_by_node.get(n.node, [])))
        nodes.append(NodeSlot(n.node, n.node_rank, slots))
    layout = Layout(tuple(nodes), rank_order="plan")
    _check_node_blocks(layout, source)
    return layout


def _check_launch_info(plan: Plan, info: LaunchInfo, source: str) -> None:
    """A hand-edited ``launch`` block must still describe this plan's devices exactly."""
    expected = {(s, r, t): d for s, r, t, d in _plan_slots(plan)}
    got = {}
    for i, r in enumerate(info.ranks):
        key = (r.stage, r.replica, r.tp_rank)
        if expected.get(key) != r.device:
            raise InputError(f"launch: {source}.ranks[{i}] puts stage {r.stage} replica {r.replica} "
                             f"tp rank {r.tp_rank} on {r.device}, but the plan's stages put it on "
                             f"{expected.get(key, 'no device')}; drop the launch block to rebuild it")
        got[key] = r.device
    missing = sorted(set(expected) - set(got))
    if missing:
        s, r, t = missing[0]
        raise InputError(f"launch: {source}.ranks lacks stage {s} replica {r} tp rank {t} "
                         f"({expected[missing[0]]}); drop the launch block to rebuild it")
    if sorted(r.rank for r in info.ranks) != list(range(len(info.ranks))):
        raise InputError(f"launch: {source}.ranks must number ranks 0..{len(info.ranks) - 1} once each")
    if sorted(n.node_rank for n in info.nodes) != list(range(len(info.nodes))):
        raise InputError(f"launch: {source}.nodes must number node ranks 0..{len(info.nodes) - 1} once each")
    for n in info.nodes:
        count = sum(1 for r in info.ranks if _node_of(r.device) == n.node)
        if count != n.nproc_per_node:
            raise InputError(f"launch: {source}.nodes says {n.node} runs {n.nproc_per_node} processes, "
                             f"its ranks number {count}")


def _check_node_blocks(layout: Layout, source: str) -> None:
    expected = 0
    for node in layout.nodes:
        ranks = [r.rank for r in node.ranks]
        if ranks != list(range(expected, expected + len(ranks))):
            raise InputError(f"launch: {source} gives node {node.node} (node rank {node.node_rank}) "
                             f"ranks {ranks}; torchrun gives each node the next {len(ranks)} ranks "
                             f"from {expected}")
        expected += len(ranks)


def framework_layout(plan: Plan, axes: tuple[str, str, str]) -> Layout | None:
    """Number ranks as a framework does from (pp, dp, tp) with ``axes`` slowest first; None when
    some node's ranks are not one contiguous block (torchrun could not start them there).
    The plan must already be uniform (same replica count and tp everywhere)."""
    # "tp" runs over a replica's devices: tp x cp with context parallelism, tensor-parallel
    # fastest, then context-parallel, as Megatron's tp-cp-ep-dp-pp and torchtitan's mesh
    # (..., "cp", "tp") number them
    dims = {"pp": plan.num_stages, "dp": len(plan.stages[0].replicas),
            "tp": len(plan.stages[0].replicas[0].devices)}
    device_at = {(s, r, t): d for s, r, t, d in _plan_slots(plan)}
    by_node: dict[str, list[tuple[int, int, int, int, str]]] = {}
    for rank, coord in enumerate(product(*(range(dims[a]) for a in axes))):
        c = dict(zip(axes, coord))
        device = device_at[(c["pp"], c["dp"], c["tp"])]
        by_node.setdefault(_node_of(device), []).append((rank, c["pp"], c["dp"], c["tp"], device))
    nodes, expected = [], 0
    for node_rank, (node, slots) in enumerate(sorted(by_node.items(), key=lambda kv: kv[1][0][0])):
        ranks = [s[0] for s in slots]
        if ranks != list(range(expected, expected + len(ranks))):
            return None
        expected += len(ranks)
        nodes.append(NodeSlot(node, node_rank, tuple(
            RankSlot(rank, node, i, device, pp, dp, tp)
            for i, (rank, pp, dp, tp, device) in enumerate(slots))))
    return Layout(tuple(nodes), rank_order="-".join(reversed(axes)))


def describe_nodes(plan: Plan) -> str:
    """Which node holds which (stage, replica), for refusal messages; long plans are cut."""
    parts = [f"stage {s.index} replica {j} on {r.node}"
             for s in plan.stages for j, r in enumerate(s.replicas)]
    limit = 16
    return "; ".join(parts[:limit]) + (f"; ... {len(parts) - limit} more" if len(parts) > limit else "")
