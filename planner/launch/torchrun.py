"""``--format torchrun``: one torchrun command per node with static rendezvous, and the rank
map the training script reads.

Arguments checked against torch 2.13.0's own parser (torch/distributed/run.py,
``get_args_parser``): ``--nnodes``, ``--nproc-per-node``, ``--node-rank``, ``--master-addr``,
``--master-port``; ``--rdzv-backend`` defaults to ``static``, which takes its endpoint from the
master address and port and each node's rank from ``--node-rank``.  The other formats reuse
``node_scripts`` as their per-node wrapper.
"""

from __future__ import annotations

from planner.launch.common import (
    LaunchOptions,
    Layout,
    NodeSlot,
    check_structure,
    dump_json,
    node_script,
    node_script_name,
    precision,
    precision_comment,
    precision_env,
)
from planner.launch.ranks import plan_layout
from planner.plan import Plan

RANK_MAP = "rank_map.json"
RANK_MAP_SCHEMA = "planner.rank_map/v1"


def torchrun_argv(layout: Layout, node: NodeSlot, master_addr: str, master_port: int,
                  script: str, script_args: list[str] = ()) -> list[str]:
    """The command for one node; ``script`` may be ``$DIR/...`` (expanded by the node script)."""
    return ["torchrun",
            "--nnodes", str(len(layout.nodes)),
            "--nproc-per-node", str(node.nproc),
            "--node-rank", str(node.node_rank),
            "--master-addr", master_addr,
            "--master-port", str(master_port),
            script, *script_args]


def node_env(node: NodeSlot, opts: LaunchOptions, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {"PLANNER_RANK_MAP": f"$DIR/{RANK_MAP}"}
    gpus = (opts.gpus_per_node or {}).get(node.node)
    visible = node.visible_devices(gpus)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    env.update(extra or {})
    return env


def node_scripts(layout: Layout, opts: LaunchOptions, script: str, script_args: list[str] = (),
                 extra_env: dict[str, str] | None = None, comment: list[str] = ()) -> dict[str, str]:
    master_addr, master_port = opts.checked_master(layout.nodes[0].node, len(layout.nodes))
    files = {}
    for node in layout.nodes:
        argv = torchrun_argv(layout, node, master_addr, master_port, script, list(script_args))
        files[node_script_name(node)] = node_script(node, node_env(node, opts, extra_env), argv,
                                                    list(comment))
    return files


def rank_map(plan: Plan, layout: Layout, opts: LaunchOptions, extra: dict | None = None) -> dict:
    """Global rank -> device, stage, replica, tp rank, node; plus what a script needs to build
    its groups without re-reading the plan (stage blocks, shares, the schedule)."""
    master_addr, master_port = opts.checked_master(layout.nodes[0].node, len(layout.nodes))
    data = {
        "schema": RANK_MAP_SCHEMA,
        "rank_order": layout.rank_order,
        "world_size": layout.world_size,
        "master_addr": master_addr,
        "master_port": master_port,
        "nodes": [{"node": n.node, "node_rank": n.node_rank, "nproc_per_node": n.nproc,
                   "cuda_visible_devices": n.visible_devices((opts.gpus_per_node or {}).get(n.node)),
                   "script": node_script_name(n)} for n in layout.nodes],
        "ranks": [r.to_json() for r in layout.ranks],
        "stages": [{"index": s.index, "blocks": list(s.blocks), "embedding": s.embedding,
                    "head": s.head, "micro_batch_shares": [r.micro_batch_share for r in s.replicas],
                    "tp": [r.tp for r in s.replicas]} for s in plan.stages],
        "micro_batch_size": plan.micro_batch_size,
        "num_micro_batches": plan.num_micro_batches,
        "schedule": plan.schedule,
        "virtual_stages": plan.virtual_stages,
        "recompute": plan.recompute,
        "zero_stage": plan.zero_stage,
        "sequence_parallel": plan.sequence_parallel,
        "precision": precision(plan),
    }
    if plan.zero_shard_degree is not None:   # HSDP: ZeRO groups of this many consecutive replicas
        data["zero_shard_degree"] = plan.zero_shard_degree
    if plan.zero_stage == 3:   # FSDP2's reshard_after_forward (only ZeRO-3 plans carry it)
        data["reshard_after_forward"] = plan.reshards_after_forward
    if plan.context_parallel > 1:
        # a rank's "tp_rank" is its place in the replica's devices: tp innermost, then cp, so its
        # tensor-parallel rank is tp_rank % tp and its context-parallel rank tp_rank // tp
        data["context_parallel"] = plan.context_parallel
        for r in data["ranks"]:
            tp = plan.stages[r["stage"]].replicas[r["replica"]].tp
            r["cp_rank"] = r["tp_rank"] // tp
    if plan.dynamic_shares is not None:
        # the shares above are where a run starts; a controller may move whole sequences between a
        # stage's replicas within these bounds (planner run --dynamic-batching, launch/dynamic.py)
        data["dynamic_shares"] = plan.dynamic_shares.model_dump()
    if plan.pipeline_actions is not None:  # latency-aware: the per-stage action order to run
        data["pipeline_actions"] = [list(acts) for acts in plan.pipeline_actions]
    data.update(extra or {})
    return data


def render(plan: Plan, opts: LaunchOptions, cluster=None) -> dict[str, str]:
    check_structure(plan, "torchrun")
    layout = plan_layout(plan, cluster)
    script = opts.script or "train.py"
    files = node_scripts(layout, opts, script, extra_env=precision_env(plan), comment=[
        f"The training script reads {RANK_MAP} (path in $PLANNER_RANK_MAP) to learn its stage,",
        "replica and tensor-parallel rank from RANK.", *precision_comment(plan)])
    files[RANK_MAP] = dump_json(rank_map(plan, layout, opts))
    return files
