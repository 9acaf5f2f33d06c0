"""``--format torchtitan``: a job-config TOML fragment for torchtitan plus the torchrun wrapper
per node.

Field names are torchtitan's ``JobConfig`` at commit ``e347b1e5e6b6`` (pytorch/torchtitan,
``torchtitan/config/job_config.py``, classes ``Parallelism``, ``Training``,
``ActivationCheckpoint``; ``JOB_CONFIG_FIELDS`` records them).  That is the last commit whose
trainer reads TOML (``--job.config_file``): 9810191b ("Config System Refactor: TOML to Python
Dataclass Registry", Feb 2026) replaced the TOML files with Python config functions; the
``--section.option`` flags it keeps use the same names.  How the fields act was read from the same
commit's ``torchtitan/distributed/pipeline_parallel.py``:

- ``pipeline_parallel_schedule`` is a name ``torch.distributed.pipelining.get_schedule_class``
  knows ("1F1B", "GPipe", "Interleaved1F1B", "InterleavedZeroBubble", "PipelineScheduleSingle",
  "PipelineScheduleMulti", "ZBVZeroBubble", "DualPipeV", ...); it also decides one model chunk
  per rank (single-stage classes) or several, and for ZBVZeroBubble and DualPipeV the V map
  (style "v": rank r builds global stages r and 2p - 1 - r).  With ``pipeline_parallel_schedule_csv`` set, ``_PipelineScheduleRuntime`` runs
  the CSV instead and the name only shapes the split.
- ``local_batch_size`` is per data-parallel rank; its micro-batch count is
  ``local_batch_size // pipeline_parallel_microbatch_size``.
- ``pipeline_parallel_layers_per_stage`` splits layers evenly, counting the embedding and the
  output as ``pipeline_parallel_first/last_stage_less_layers`` extra layers (we write 0 so the
  split is exactly the plan's); ``module_fqns_per_model_part`` lists each chunk's modules
  (torchtitan's decoder names: ``tok_embeddings``, ``layers.<i>``, ``norm``, ``output``).
- The device mesh is ("pp", "dp_replicate", "dp_shard", "cp", "tp"), pipeline slowest and
  tensor parallel fastest along global ranks (``distributed/parallel_dims.py``).
- ``expert_parallel_degree`` (MoE) is carved out of ``dp_shard`` x ``cp`` when
  ``expert_tensor_parallel_degree`` equals the TP degree (ParallelDims' check:
  ``(dp_shard * cp) % ep == 0``), the inner part of ``dp_shard``: consecutive replicas, as the
  plan's groups.  A plan without ZeRO has no dp_shard, so its ep replicas are written as an
  FSDP group inside each EP group (HSDP), noted in the file.

``[compile]`` (class ``Compile``) follows the plan's ``elementwise``: fused turns torch.compile on
for the model's blocks (not the loss, which the plan priced as eager ``F.cross_entropy``), eager
leaves it off (planner.cost.elementwise).

torchtitan builds one pipeline shape for all ranks, so it cannot express per-stage TP or replica
counts, uneven micro-batch shares, or fp16 (``mixed_precision_param`` is bfloat16 or float32).
"""

from __future__ import annotations

import json

from planner.launch.common import (
    LaunchOptions,
    Problems,
    check_structure,
    check_uniform,
    chunks,
    dump_json,
    global_batch_size,
    precision,
    precision_comment,
    precision_env,
    seq_len,
    shell_join,
)
from planner.launch.ranks import AXES_PP_DP_TP, describe_nodes, framework_layout
from planner.launch.schedule_csv import CSV_FILE, Route, actions_csv, class_problems, route
from planner.launch.torchrun import RANK_MAP, node_scripts, rank_map
from planner.plan import Plan

TOOL = "torchtitan"
TORCHTITAN_COMMIT = "e347b1e5e6b6941d789d16d340145294d82dc71e"
CONFIG_FILE = "torchtitan.toml"

# torchtitan/config/job_config.py at TORCHTITAN_COMMIT: every field of the sections we write.
JOB_CONFIG_FIELDS: dict[str, tuple[str, ...]] = {
    "parallelism": (
        "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
        "tensor_parallel_degree", "disable_loss_parallel", "enable_async_tensor_parallel",
        "pipeline_parallel_degree", "module_fqns_per_model_part",
        "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
        "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
        "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
        "pipeline_parallel_expert_parallel_overlap", "context_parallel_degree",
        "context_parallel_load_balancer", "context_parallel_rotate_method", "expert_parallel_degree",
        "expert_tensor_parallel_degree", "expert_parallel_comm_backend"),
    "training": (
        "dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm",
        "steps", "enable_cpu_offload", "dtype", "mixed_precision_param", "mixed_precision_reduce",
        "gc_freq", "gc_debug", "dataloader"),
    "activation_checkpoint": (
        "mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop",
        "memory_budget", "visualize_memory_budget_pareto", "preserve_rng_state", "determinism_check",
        "debug"),
    # class Compile: enable, components (default ["model", "loss"]), backend; "model" compiles
    # each TransformerBlock (models/llama3/infra/parallelize.py apply_compile)
    "compile": ("enable", "components", "backend"),
}

# torch class -> the name torch's get_schedule_class (and so torchtitan) takes for it
SCHEDULE_NAMES = {"ScheduleGPipe": "GPipe", "Schedule1F1B": "1F1B",
                  "ScheduleInterleaved1F1B": "Interleaved1F1B",
                  "ScheduleInterleavedZeroBubble": "InterleavedZeroBubble",
                  # pipeline_parallel.py builds these two with style "v": rank r holds global
                  # stages r and 2p - 1 - r of module_names_per_stage, the V of chunks()
                  "ScheduleZBVZeroBubble": "ZBVZeroBubble", "ScheduleDualPipeV": "DualPipeV"}
SINGLE_STAGE = {"GPipe", "1F1B", "PipelineScheduleSingle"}  # subclasses of PipelineScheduleSingle
PRECISION_PARAM = {"bf16": "bfloat16", "fp32": "float32", "tf32": "float32"}
RECOMPUTE_MODE = {"none": "none", "full": "full", "selective": "selective", "op": "selective"}


def check(plan: Plan) -> None:
    check_structure(plan, "torchtitan")
    check_uniform(plan, "torchtitan", TOOL)
    prec = precision(plan)
    if prec not in PRECISION_PARAM:
        Problems("torchtitan", [(f"precision {prec}: torchtitan's training.mixed_precision_param is "
                                 "bfloat16 or float32; re-plan with bf16")]).raise_if_any()


def schedule_fields(plan: Plan, how: Route) -> dict:
    """pipeline_parallel_schedule (and _csv) for the route torch takes."""
    if how.uses_csv:
        shape = "PipelineScheduleSingle" if how.actions.chunks == 1 else "PipelineScheduleMulti"
        return {"pipeline_parallel_schedule": shape, "pipeline_parallel_schedule_csv": CSV_FILE}
    Problems("torchtitan", class_problems(plan, how)).raise_if_any()
    name = SCHEDULE_NAMES.get(how.class_name)
    if name is None:
        Problems("torchtitan", [(f"schedule {plan.schedule}: torch's {how.class_name} has no "
                                 "name torchtitan's pipeline_parallel_schedule takes; use "
                                 "--schedule-csv")]).raise_if_any()
    return {"pipeline_parallel_schedule": name}


def split_fields(plan: Plan, schedule_name: str) -> dict:
    """layers_per_stage where torchtitan's even split is exactly the plan's, else every chunk's
    modules by name."""
    pieces = chunks(plan, "torchtitan")
    sizes = {c.last - c.first for c in pieces}
    per_rank = plan.virtual_stages
    single = schedule_name in SINGLE_STAGE
    # pipeline_llm refuses 1 chunk per rank for a multi-stage class and >1 for a single one
    if len(sizes) == 1 and (per_rank == 1) == single:
        return {"pipeline_parallel_layers_per_stage": sizes.pop(),
                "pipeline_parallel_first_stage_less_layers": 0,
                "pipeline_parallel_last_stage_less_layers": 0}
    parts = []
    for c in pieces:
        names = (["tok_embeddings"] if c.embedding else []) + [f"layers.{i}" for i in range(c.first, c.last)]
        parts.append(names + (["norm", "output"] if c.head else []))
    return {"module_fqns_per_model_part": parts}


def sections(plan: Plan, how: Route | None) -> dict[str, dict]:
    """{section: {field: value}} for the TOML; ``how`` None when there is no pipeline."""
    ref = plan.stages[0].replicas
    d, tp, share = len(ref), ref[0].tp, ref[0].micro_batch_share
    p, m = plan.num_stages, plan.num_micro_batches
    # context_parallel_degree: the mesh's "cp" dimension, just outside "tp" (the plan's device
    # order); FSDP shards over dp_shard x cp, as the cost model's ZeRO over replicas x cp
    par: dict = {"pipeline_parallel_degree": p, "tensor_parallel_degree": tp,
                 "context_parallel_degree": plan.context_parallel}
    # ZeRO-1 and ZeRO-2 have no torchtitan switch; FSDP (shard) is the nearest, noted in the file
    if plan.zero_stage == 0:
        # with cp > 1 torchtitan still wraps the model in FSDP over the cp ranks (weights
        # replicated over cp need their gradients reduced): noted in _comments
        par |= {"data_parallel_replicate_degree": d, "data_parallel_shard_degree": 1}
    else:
        # HSDP (zero_shard_degree): the mesh's dp_shard is inside dp_replicate, so FSDP shards
        # over consecutive replicas, the plan's groups
        shard = plan.shard_replicas(d)
        par |= {"data_parallel_replicate_degree": d // shard, "data_parallel_shard_degree": shard}
    ep = plan.expert_parallel
    if ep > 1:   # experts tensor-parallel over the same tp, as planner.cost prices them
        par |= {"expert_parallel_degree": ep, "expert_tensor_parallel_degree": tp}
        if plan.zero_stage == 0:   # EP needs dp_shard >= ep (module docstring)
            par |= {"data_parallel_replicate_degree": d // ep, "data_parallel_shard_degree": ep}
    if plan.zero_stage == 3:
        # "always" / "never" apply reshard_after_forward to every FSDP unit; torchtitan's
        # "default" picks by itself (never with a pipeline), which the plan did not price
        par["fsdp_reshard_after_forward"] = "always" if plan.reshards_after_forward else "never"
    training: dict = {"seq_len": seq_len(plan), "global_batch_size": global_batch_size(plan),
                      "mixed_precision_param": PRECISION_PARAM[precision(plan)]}
    if how is not None:
        fields = schedule_fields(plan, how)
        par |= fields
        par |= split_fields(plan, fields["pipeline_parallel_schedule"])
        par["pipeline_parallel_microbatch_size"] = share
        training["local_batch_size"] = share * m    # one step is m micro-batches through the pipe
    else:
        training["local_batch_size"] = share        # no pipeline: m accumulation steps of share
    ac: dict = {"mode": RECOMPUTE_MODE[plan.recompute]}
    if plan.recompute in ("selective", "op"):
        ac["selective_ac_option"] = "op"  # torchtitan's only selective policy besides every-n-layers
    # elementwise fused: torch.compile fuses each block's elementwise ops, as priced; the loss is
    # left out of components, so it runs the eager F.cross_entropy the plain loss priced.
    # eager: no compile, each op its own kernel, as priced.
    fused = plan.training_choice("elementwise") == "fused"
    compile_ = {"enable": True, "components": ["model"]} if fused else {"enable": False}
    return {"parallelism": par, "training": training, "activation_checkpoint": ac, "compile": compile_}


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # an ASCII JSON string is a TOML basic string
    if isinstance(value, list) and value and isinstance(value[0], list):
        rows = ",\n".join("  " + _toml_value(v) for v in value)
        return f"[\n{rows},\n]"
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


def toml_text(plan: Plan, data: dict[str, dict], comments: list[str]) -> str:
    lines = [(f"# torchtitan job-config fragment for a planner plan ({plan.num_stages} stages, "
             f"schedule {plan.schedule})."),
             f"# Field names: pytorch/torchtitan torchtitan/config/job_config.py at {TORCHTITAN_COMMIT[:12]};",
             "# merge into a full job config ([model], [optimizer], dataset ...). Generated; do not edit."]
    lines += [f"# {c}" for c in comments]
    for section, fields in data.items():
        lines += ["", f"[{section}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in fields.items()]
    return "\n".join(lines) + "\n"


def _comments(plan: Plan, how: Route | None, asked_csv: bool = False) -> list[str]:
    out = []
    if asked_csv and how is None:
        # one stage runs no pipeline schedule (torchtitan reads none at pipeline degree 1)
        out.append(f"--schedule-csv: the plan has one stage, so there is no pipeline schedule and "
                   f"no {CSV_FILE} to write")
    if how is not None and how.uses_csv:
        out.append(f"schedule {plan.schedule} runs from {CSV_FILE} (per-rank action lists); the node "
                   "scripts pass its absolute path, since torchtitan resolves it from its working folder")
    if plan.zero_stage == 1 and len(plan.stages[0].replicas) > 1:
        out.append("zero_stage 1: torchtitan has no optimizer-only sharding; data_parallel_shard_degree "
                   "runs FSDP, which also shards weights and gradients (less memory than planned, "
                   "one all-gather of the weights per step more traffic)")
    if plan.zero_stage == 2 and len(plan.stages[0].replicas) > 1:
        out.append("zero_stage 2: torchtitan has no gradient-only sharding; data_parallel_shard_degree "
                   "runs FSDP, which also shards the weights (less memory than planned, their "
                   "all-gathers per micro-batch more traffic)")
    if plan.context_parallel > 1:
        out.append(f"context_parallel_degree {plan.context_parallel}: torchtitan's ring attention "
                   "(context_parallel_rotate_method allgather by default; the plan priced a ring of "
                   "p2p K/V sends); seq_len must be a multiple of 2 x the degree")
        if plan.zero_stage == 0:
            out.append("zero_stage 0 with context parallelism: torchtitan applies FSDP over the cp "
                       "ranks (dp_shard x cp), which shards weights and optimizer state the plan kept "
                       "whole (less memory than planned)")
    if plan.expert_parallel > 1 and plan.zero_stage == 0:
        out.append(f"expert_parallel {plan.expert_parallel} without ZeRO: torchtitan takes expert "
                   "parallelism out of data_parallel_shard_degree, so each expert-parallel group "
                   "runs as an FSDP group (HSDP across groups): less memory than planned, weight "
                   "all-gathers inside the group more traffic")
    if plan.recompute == "selective":
        out.append("recompute selective: torchtitan has no attention-core-only recompute; its op policy "
                   "(used here) also redoes every second matmul and the elementwise ops, more time than "
                   "the plan priced: re-plan with recompute op to price what torchtitan runs")
    elif plan.recompute == "op":
        out.append("recompute op: torchtitan's per-op selective activation checkpointing, as priced")
    if plan.training_choice("attention") != "flash":
        out.append("attention: torchtitan's attention is F.scaled_dot_product_attention (fused); the plan "
                   "priced the unfused core, whose s x s scores take more memory and time than torchtitan "
                   "spends: re-plan with training attention: flash")
    if plan.training_choice("cross_entropy") != "plain":
        out.append("loss: torchtitan computes F.cross_entropy on an fp32 copy of the logits; the plan "
                   "priced Megatron's fused kernel, so the head stage needs 8 more bytes per logit of a "
                   "micro-batch than planned, and its loss moves more bytes per logit than priced "
                   "(planner.cost.cross_entropy): re-plan with training cross_entropy: plain")
    if plan.training_choice("elementwise") == "fused":
        out.append("compile: the plan priced fused elementwise ops, so each block is compiled "
                   "(torch.compile, components model); the loss stays eager F.cross_entropy, and the "
                   "first steps include compilation. Re-plan with elementwise: eager to run without it")
    else:
        out.append("compile: off, each op of a block runs as its own kernel, as priced (elementwise: "
                   "eager); torch.compile would run faster than priced")
    return out + precision_comment(plan)


def render(plan: Plan, opts: LaunchOptions, cluster=None) -> dict[str, str]:
    check(plan)
    how = route(plan, force_csv=opts.schedule_csv, fmt="torchtitan") if plan.num_stages > 1 else None
    data = sections(plan, how)
    layout = framework_layout(plan, AXES_PP_DP_TP)
    if layout is None:
        Problems("torchtitan", [("torchtitan numbers ranks pipeline slowest, then data-parallel, then "
                                 "tensor-parallel, and torchrun gives each node one contiguous block of "
                                 f"ranks; that does not hold here ({describe_nodes(plan)}): place each "
                                 "stage's replicas on whole nodes")]).raise_if_any()
    args = ["--job.config_file", f"$DIR/{CONFIG_FILE}"]
    if how is not None and how.uses_csv:
        args += ["--parallelism.pipeline_parallel_schedule_csv", f"$DIR/{CSV_FILE}"]
    script, args = (opts.script, args) if opts.script else ("-m", ["torchtitan.train", *args])
    files = node_scripts(layout, opts, script, args, extra_env=precision_env(plan), comment=[
        (f"torchtitan at {TORCHTITAN_COMMIT[:12]} (TOML job configs); {CONFIG_FILE} holds the plan's "
        "parallelism and batch; complete it with the model, optimizer and dataset sections."),
        *precision_comment(plan)])
    files[CONFIG_FILE] = toml_text(plan, data, _comments(plan, how, opts.schedule_csv))
    if how is not None and how.uses_csv:
        files[CSV_FILE] = actions_csv(how.actions)
    files[RANK_MAP] = dump_json(rank_map(plan, layout, opts, extra={
        "torchtitan_commit": TORCHTITAN_COMMIT, "command_line": shell_join(args)}))
    return files
