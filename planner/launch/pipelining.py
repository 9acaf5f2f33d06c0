"""``--format pipelining``: the stage split, schedule and process groups for
``torch.distributed.pipelining`` (checked against the installed torch 2.13.0:
``torch/distributed/pipelining/__init__.py``, ``schedules.py``, ``stage.py``).

What the stock schedules can express, and so what this format accepts: one pipeline per replica
chain (replica ``r`` of every stage), all chains alike in shape.  So every stage has the same
number of replicas, every replica the same tp, and chain ``r`` takes the same share on every
stage.  Shares may differ *between* chains: each chain is its own pipeline fed ``share_r``
sequences per micro-batch, and the per-stage gradient all-reduce weights chain ``r`` by
``share_r / micro_batch_size``.  A stage whose replica count differs from its neighbours' (one
stage's output split over a different number of consumers) has no stock schedule: refused.
"""

from __future__ import annotations

from planner.launch.common import (
    LaunchOptions,
    Problems,
    check_structure,
    chunks,
    dump_json,
    odd_tp,
    precision,
    precision_comment,
    precision_env,
)
from planner.launch.ranks import plan_layout
from planner.launch.schedule_csv import CSV_FILE, ROUTES, Route, actions_csv, class_problems, route
from planner.launch.torchrun import RANK_MAP, node_scripts, rank_map
from planner.plan import Plan
from planner.plan.model import V_SCHEDULES

SPEC = "pipelining.json"
SNIPPET = "pipelining_setup.py"
RUNTIME_CLASS = "_PipelineScheduleRuntime"  # what runs a CSV schedule


def _refuse_bitpipe(plan: Plan) -> None:
    # before the route: BitPipe has lists (actions.generate) but no runtime that holds a stage
    # on two ranks, and the message should say why rather than "no class, no CSV"
    if plan.schedule == "bitpipe":
        Problems("pipelining", [("schedule bitpipe: torch.distributed.pipelining has no schedule class "
                                 "for it (a stage there belongs to one pipeline, while BitPipe runs two "
                                 "in opposite directions over the same ranks with a second weight copy "
                                 "per rank, all-reduced over rank pairs); re-plan with schedule "
                                 "interleaved-1f1b or zb-h1")]).raise_if_any()


def check(plan: Plan, how: Route) -> None:
    check_structure(plan, "pipelining")
    problems = Problems("pipelining")
    if plan.expert_parallel > 1:
        problems.add(f"expert_parallel {plan.expert_parallel}: torch.distributed.pipelining has no "
                     "expert parallelism of its own; use --format megatron or torchtitan")
    ref = plan.stages[0]
    tp = ref.replicas[0].tp
    for stage in plan.stages[1:]:
        if len(stage.replicas) != len(ref.replicas):
            problems.add(f"stage {stage.index} has {len(stage.replicas)} replicas, stage 0 has "
                         f"{len(ref.replicas)}: torch.distributed.pipelining runs one pipeline per "
                         "replica chain, so every stage needs the same number of replicas")
            continue
        for j, (r, r0) in enumerate(zip(stage.replicas, ref.replicas)):
            if r.micro_batch_share != r0.micro_batch_share:
                problems.add(f"stage {stage.index} replica {j} takes {r.micro_batch_share} sequences per "
                             f"micro-batch, stage 0 replica {j} takes {r0.micro_batch_share}: a replica "
                             "chain is one pipeline and needs the same share on every stage")
    for stage in plan.stages:
        odd = odd_tp(stage, tp)
        if odd:
            problems.add(f"{odd}: stages exchange activations one rank per tp position, so every "
                         "replica needs the same tensor-parallel size")
    if plan.context_parallel > 1:
        problems.add(f"context_parallel {plan.context_parallel}: the generated pipelining script splits "
                     "no sequence (it builds pipeline, data and tensor-parallel groups only); use --format "
                     "torchtitan or megatron, or re-plan with training.context_parallel_degrees [1]")
    for problem in class_problems(plan, how):
        problems.add(problem)
    # ScheduleInterleaved1F1B refuses num_micro_batches not a multiple of max(1, n // stages);
    # check_structure's layout rule (a multiple of the stages) is stricter, so it never gets here.
    problems.raise_if_any()


def spec(plan: Plan, layout, how: Route) -> dict:
    rank_at = layout.rank_of()
    d, tp = len(plan.stages[0].replicas), plan.stages[0].replicas[0].tp
    p = plan.num_stages
    pp_groups = [[rank_at[(s, r, t)] for s in range(p)] for r in range(d) for t in range(tp)]
    dp_groups = [[rank_at[(s, r, t)] for r in range(d)] for s in range(p) for t in range(tp)]
    tp_groups = [[rank_at[(s, r, t)] for t in range(tp)] for s in range(p) for r in range(d)]
    pieces = chunks(plan, "pipelining")
    ranks = {}
    for slot in layout.ranks:
        s, r, t = slot.stage, slot.replica, slot.tp_rank
        share = plan.stages[s].replicas[r].micro_batch_share
        ranks[str(slot.rank)] = {
            "stage": s, "replica": r, "tp_rank": t, "device": slot.device,
            "pipeline_stages": [c.index for c in pieces if c.stage == s],
            "pp_group": r * tp + t, "dp_group": s * tp + t, "tp_group": s * d + r,
            "micro_batch_share": share,
            "dp_grad_weight": share / plan.micro_batch_size,
        }
    return {
        "torch_version": "2.13.0",
        "schedule_class": how.class_name or RUNTIME_CLASS,
        "n_microbatches": plan.num_micro_batches,
        "num_pipeline_stages": len(pieces),
        "stages": [c.to_json() for c in pieces],
        "groups": {"pp": pp_groups, "dp": dp_groups, "tp": tp_groups},
        "ranks": ranks,
        "notes": _notes(plan, d, how),
        **({"schedule_csv": CSV_FILE} if how.uses_csv else {}),
    }


def _notes(plan: Plan, d: int, how: Route) -> list[str]:
    notes = [("each replica chain is its own pipeline: feed chain r share_r * n_microbatches "
              "sequences per step; after backward, all-reduce (SUM) every parameter's gradient "
              "times dp_grad_weight over the rank's dp group")]
    if plan.schedule in V_SCHEDULES:
        notes.append(f"{plan.schedule}: {ROUTES[plan.schedule]} with two stages per rank in a V: "
                     "each stage's blocks are cut into two equal pieces dealt down the ranks and back "
                     "(rank r builds pipeline stages r and 2p-1-r; rank 0 holds the embedding and the "
                     "head); each backward runs as input- and weight-gradient steps; torch does not "
                     "support it under torch.compile")
    elif plan.virtual_stages > 1:
        notes.append("interleaved: each stage's blocks are cut into virtual_stages equal pieces "
                     "dealt round-robin; 'stages' lists each piece's blocks")
    if how.uses_csv:
        notes.append(f"schedule {plan.schedule} runs from its per-rank action lists: "
                     f"_PipelineScheduleRuntime loads {CSV_FILE} (one row per pipeline rank, cells "
                     "<stage><F|B|I|W><micro-batch>) and adds the sends and receives itself")
    elif plan.schedule == "zb-h1":
        notes.append("zb-h1: ScheduleInterleavedZeroBubble with one stage per rank (ZB-H1) runs each "
                     "backward as an input-gradient and a deferred weight-gradient step; torch does "
                     "not support it under torch.compile")
    if plan.recompute != "none":
        notes.append(f"recompute {plan.recompute}: wrap the blocks with "
                     "torch.utils.checkpoint inside each stage module")
    if plan.zero_stage == 1 and d > 1:
        notes.append("zero_stage 1: shard the optimizer state over the dp group")
    elif plan.zero_stage == 2 and d > 1:
        notes.append("zero_stage 2: shard the optimizer state and gradients over the dp group")
    elif plan.zero_stage == 3 and d > 1:
        notes.append("zero_stage 3: fully_shard each block and the stage module over the dp group "
                     f"(FSDP2, reshard_after_forward={plan.reshards_after_forward})")
    if plan.zero_shard_degree is not None and d > 1:
        shard = plan.shard_replicas(d)
        notes.append(f"zero_shard_degree {shard} (HSDP): shard over groups of {shard} consecutive "
                     f"replicas of the dp group and replicate across the {d // shard} groups (FSDP2: "
                     f"fully_shard on a 2-D ('replicate', 'shard') mesh of shape ({d // shard}, {shard}))")
    prec = precision(plan)
    if prec in ("fp32", "tf32"):
        notes.append(f"precision {prec}: build the stage modules and their inputs in torch.float32 "
                     "(no autocast)" + ("; the node scripts export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 "
                                       "for TF32 matmuls" if prec == "tf32" else ""))
    return notes


SNIPPET_TEXT = '''"""Process groups and schedule for torch.distributed.pipelining from a planner plan.

Generated by `planner launch --format pipelining`; do not edit.  Call after
dist.init_process_group (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK):

    schedule, groups, me = build(make_stage_module, device, loss_fn)
    schedule.step(inputs) on stage 0, schedule.step(target=...) on the last, schedule.step() between

make_stage_module(piece) gets one entry of the spec's "stages" ({"blocks": [first, last),
"embedding": bool, "head": bool, ...}) and returns the nn.Module for it.
"""

import json
import os

import torch.distributed as dist
from torch.distributed.pipelining import (
    PipelineStage, Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe, ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

SCHEDULES = {"Schedule1F1B": Schedule1F1B, "ScheduleGPipe": ScheduleGPipe,
             "ScheduleInterleaved1F1B": ScheduleInterleaved1F1B,
             "ScheduleInterleavedZeroBubble": ScheduleInterleavedZeroBubble,
             "ScheduleZBVZeroBubble": ScheduleZBVZeroBubble, "ScheduleDualPipeV": ScheduleDualPipeV,
             "_PipelineScheduleRuntime": _PipelineScheduleRuntime}
LIST_TAKING = (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble,
               ScheduleDualPipeV, _PipelineScheduleRuntime)
HERE = os.path.dirname(os.path.abspath(__file__))
SPEC_PATH = os.path.join(HERE, "pipelining.json")


def load_spec(path=SPEC_PATH):
    with open(path) as fh:
        return json.load(fh)


def build_groups(spec, rank):
    """dist.new_group is collective: every rank creates every group, in the same order."""
    mine = {}
    for kind in ("pp", "dp", "tp"):
        for ranks in spec["groups"][kind]:
            group = dist.new_group(ranks=ranks)
            if rank in ranks:
                mine[kind] = group
    return mine


def build(make_stage_module, device, loss_fn, spec=None):
    spec = spec or load_spec()
    rank = dist.get_rank()
    me = spec["ranks"][str(rank)]
    groups = build_groups(spec, rank)
    stages = [PipelineStage(make_stage_module(spec["stages"][i]), i, spec["num_pipeline_stages"],
                            device, group=groups["pp"]) for i in me["pipeline_stages"]]
    cls = SCHEDULES[spec["schedule_class"]]
    if cls in LIST_TAKING:  # they take the rank's list of stages
        schedule = cls(stages, n_microbatches=spec["n_microbatches"], loss_fn=loss_fn)
    else:
        schedule = cls(stages[0], n_microbatches=spec["n_microbatches"], loss_fn=loss_fn)
    if spec.get("schedule_csv"):
        # per pipeline rank, its ordered actions; torch adds the sends, receives and reductions
        schedule._load_csv(os.path.join(HERE, spec["schedule_csv"]), format="compute_only")
    return schedule, groups, me
'''


def render(plan: Plan, opts: LaunchOptions, cluster=None) -> dict[str, str]:
    _refuse_bitpipe(plan)
    how = route(plan, force_csv=opts.schedule_csv)
    check(plan, how)
    layout = plan_layout(plan, cluster)
    data = spec(plan, layout, how)
    files = node_scripts(layout, opts, opts.script or "train.py", extra_env=precision_env(plan), comment=[
        (f"torch.distributed.pipelining ({data['schedule_class']}); the script builds its groups "
         f"with {SNIPPET}."), *precision_comment(plan)])
    files[SPEC] = dump_json(data)
    files[SNIPPET] = SNIPPET_TEXT
    if how.uses_csv:
        files[CSV_FILE] = actions_csv(how.actions)
    files[RANK_MAP] = dump_json(rank_map(plan, layout, opts))
    return files
