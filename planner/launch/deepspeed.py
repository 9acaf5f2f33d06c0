"""``--format deepspeed``: ``ds_config.json``, the stage boundaries for
``deepspeed.pipe.PipelineModule`` and the torchrun wrapper per node.

Checked against deepspeedai/DeepSpeed ``deepspeed/runtime/pipe/module.py`` (commit
12e65a6b112abebe37e46f87a25890641a9dd8d9) and ``deepspeed/runtime/pipe/topology.py``:
``partition_method`` accepts only ``"uniform"``, ``"parameters"`` and ``"type:<regex>"`` (anything
else raises NotImplementedError), and ``__init__`` calls ``self._partition_layers`` which sets
``self.parts`` and the local layer range.  Fixed boundaries therefore go through a subclass that
overrides ``_partition_layers``; the generated ``pipeline_module.py`` is that subclass.
``ProcessTopology`` numbers ranks row-major over its axes (the last axis fastest), so the axis
order written here reproduces the rank map.
"""

from __future__ import annotations

from planner.errors import InputError
from planner.launch.common import (
    LaunchOptions,
    Problems,
    check_structure,
    check_uniform,
    dump_json,
    global_batch_size,
    num_layers,
    precision,
    precision_comment,
    precision_env,
)
from planner.launch.ranks import AXES_DP_PP_TP, AXES_PP_DP_TP, describe_nodes, framework_layout
from planner.launch.schedule_csv import ROUTES as _V_CLASS
from planner.launch.torchrun import RANK_MAP, node_scripts, rank_map
from planner.plan import Plan
from planner.plan.model import V_SCHEDULES

TOOL = "DeepSpeed"
DEEPSPEED_COMMIT = "12e65a6b112abebe37e46f87a25890641a9dd8d9"
CONFIG = "ds_config.json"
PIPELINE = "deepspeed_pipeline.json"
MODULE = "pipeline_module.py"
_AXIS_NAMES = {"pp": "pipe", "dp": "data", "tp": "model"}


def parts(plan: Plan) -> list[int]:
    """PipelineModule ``parts`` over the layer list [embedding, block_0 .. block_{L-1}, head]:
    stage ``s`` builds layers ``parts[s]:parts[s+1]``."""
    bounds = [0] + [1 + s.blocks[1] for s in plan.stages[:-1]] + [num_layers(plan) + 2]
    return bounds


def check(plan: Plan) -> None:
    check_structure(plan, "deepspeed")
    check_uniform(plan, "deepspeed", TOOL)
    problems = Problems("deepspeed")
    if plan.schedule == "interleaved-1f1b" and plan.virtual_stages > 1:
        problems.add(f"schedule interleaved-1f1b with {plan.virtual_stages} virtual stages: DeepSpeed's "
                     "pipeline engine runs one stage per rank (TrainSchedule); re-plan with schedule 1f1b")
    if plan.schedule == "bitpipe":
        problems.add("schedule bitpipe: DeepSpeed's pipeline engine runs one pipeline (TrainSchedule, "
                     "one stage per rank); BitPipe runs two in opposite directions over the same ranks "
                     "with a second weight copy per rank all-reduced over rank pairs; re-plan with "
                     "schedule 1f1b")
    if plan.schedule == "zb-h1":
        problems.add("schedule zb-h1: DeepSpeed's pipeline engine runs its 1F1B TrainSchedule, which "
                     "runs each backward whole; it has no zero-bubble schedule: re-plan with schedule "
                     "1f1b, or use --format pipelining (torch's ScheduleInterleavedZeroBubble)")
    if plan.schedule in V_SCHEDULES:
        problems.add(f"schedule {plan.schedule}: DeepSpeed's pipeline engine runs one stage per rank "
                     "with its 1F1B TrainSchedule (no V placement, each backward whole): re-plan with "
                     f"schedule 1f1b, or use --format pipelining (torch's {_V_CLASS[plan.schedule]})")
    if plan.schedule == "latency-aware":
        problems.add("schedule latency-aware: DeepSpeed's pipeline engine runs its fixed 1F1B "
                     "TrainSchedule and cannot follow the plan's per-rank action lists; re-plan with "
                     "schedule 1f1b")
    if plan.context_parallel > 1:
        # DeepSpeed's engine has no ring-attention context parallelism (its Ulysses sequence
        # parallelism is an all-to-all over heads that the plan did not price)
        problems.add(f"context_parallel {plan.context_parallel}: DeepSpeed has no ring-attention context "
                     "parallelism; re-plan with training.context_parallel_degrees [1], or use --format "
                     "megatron or torchtitan")
    if plan.expert_parallel > 1:
        # DeepSpeed's expert parallelism is deepspeed.moe.layer.MoE(ep_size=...) built into the
        # model code; its JSON config has no field for it, and planner writes no model code
        problems.add(f"expert_parallel {plan.expert_parallel}: DeepSpeed sets expert parallelism in "
                     "the model code (deepspeed.moe.layer.MoE's ep_size), not in its config, and "
                     "planner does not map it; re-plan with expert_parallel 1 "
                     "(training.expert_parallel_degrees), or use --format megatron or torchtitan")
    if plan.recompute in ("selective", "op"):
        problems.add(f"recompute {plan.recompute}: PipelineModule only checkpoints whole layers "
                     "(activation_checkpoint_interval); re-plan with recompute none or full")
    if plan.zero_shard_degree is not None:
        # ZeRO++'s hpZ (zero_hpz_partition_size) keeps the optimizer state and gradients sharded
        # over all data-parallel ranks and adds a second copy of the weights per node for the
        # backward gathers (deepspeed.ai/tutorials/zeropp): not HSDP's replicated groups
        problems.add(f"zero_shard_degree {plan.zero_shard_degree}: DeepSpeed has no hybrid sharding "
                     "(ZeRO++'s zero_hpz_partition_size still shards the optimizer state over all "
                     "replicas and adds a weight copy per node); re-plan without it "
                     "(training.zero_shard_degrees), or use --format torchtitan or megatron")
    if plan.zero_stage >= 2 and plan.num_stages > 1:
        # deepspeed/runtime/pipe/engine.py (PipelineEngine.__init__) asserts
        # zero_optimization_stage() < 2: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        problems.add(f"zero_stage {plan.zero_stage} with {plan.num_stages} pipeline stages: DeepSpeed's "
                     "PipelineEngine refuses ZeRO-2 and ZeRO-3 with pipeline parallelism; re-plan with "
                     "zero_stage 0 or 1 (training.zero_stages), or with one stage")
    problems.raise_if_any()


def ds_layout(plan: Plan):
    for axes in (AXES_PP_DP_TP, AXES_DP_PP_TP):
        layout = framework_layout(plan, axes)
        if layout is not None:
            return layout, axes
    raise InputError(
        "launch --format deepspeed: DeepSpeed's ProcessTopology numbers ranks over (pipe, data, model) "
        "or (data, pipe, model), and torchrun gives each node one contiguous block of ranks; under "
        f"neither order does every node hold a contiguous block here ({describe_nodes(plan)}). "
        "Place each stage's replicas, or each replica chain, on whole nodes")


def ds_config(plan: Plan) -> dict:
    prec = precision(plan)
    # fp32 / tf32: no bf16 or fp16 section, so DeepSpeed trains in fp32 (its default).
    mixed = {"bf16": {"enabled": prec == "bf16"}, "fp16": {"enabled": prec == "fp16"}} \
        if prec in ("bf16", "fp16") else {}
    return {
        "train_batch_size": global_batch_size(plan),
        "train_micro_batch_size_per_gpu": plan.stages[0].replicas[0].micro_batch_share,
        "gradient_accumulation_steps": plan.num_micro_batches,
        **mixed,
        "zero_optimization": {"stage": plan.zero_stage},
        # Checkpoints stay whole on each rank (no partitioning across TP, no CPU copies): that
        # is the memory the cost model charges for full recompute.
        "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False,
                                     "contiguous_memory_optimization": False,
                                     "synchronize_checkpoint_boundary": False, "profile": False},
    }


def pipeline_spec(plan: Plan, axes: tuple[str, ...]) -> dict:
    tp = plan.stages[0].replicas[0].tp
    dims = {"pp": plan.num_stages, "dp": len(plan.stages[0].replicas), "tp": tp}
    used = [a for a in axes if a != "tp" or tp > 1]  # like PipeDataParallelTopology when tp is 1
    notes = []
    if tp > 1:
        notes.append(f"tp {tp}: the layers must split themselves (e.g. Megatron-DeepSpeed); the "
                     "topology's 'model' axis gives their tensor-parallel groups")
    if plan.schedule == "gpipe" and plan.num_stages > 1:
        notes.append("schedule gpipe runs as DeepSpeed's 1F1B TrainSchedule: the same bubble with "
                     "fewer micro-batches in flight")
    if plan.sequence_parallel and tp > 1:
        notes.append("sequence_parallel is the layers' own business in DeepSpeed; enable it there")
    if plan.zero_stage >= 2:
        notes.append(f"zero_optimization.stage {plan.zero_stage}: DeepSpeed's PipelineEngine refuses "
                     "ZeRO-2/3 even with one stage, so hand deepspeed.initialize the plain model "
                     "(its layers in order), not PlannedPipelineModule")
    if plan.zero_stage == 3 and not plan.reshards_after_forward:
        notes.append("reshard_after_forward false: DeepSpeed ZeRO-3 has no such switch; raise "
                     "zero_optimization.stage3_max_reuse_distance so gathered parameters stay until "
                     "the backward (the plan keeps them gathered)")
    if plan.training_choice("elementwise") == "eager":
        notes.append("elementwise eager: priced as one PyTorch kernel per op (a Hugging Face model run "
                     "without torch.compile); Megatron-DeepSpeed's layers fuse them and run faster than "
                     "priced: re-plan with elementwise: fused for those")
    else:
        notes.append("elementwise fused: priced as fused kernels (Megatron-DeepSpeed's layers, or "
                     "torch.compile); a model whose ops run eagerly (Hugging Face without torch.compile) "
                     "moves about 3.5x those bytes: re-plan with elementwise: eager for it")
    if precision(plan) == "tf32":
        notes.append("tf32: ds_config has no fp16/bf16 section (fp32 training); the node scripts export "
                     "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 so PyTorch's fp32 matmuls use TF32 tensor cores")
    elif precision(plan) == "fp32":
        notes.append("fp32: ds_config has no fp16/bf16 section, so DeepSpeed trains in fp32")
    return {
        "deepspeed_commit": DEEPSPEED_COMMIT,
        "num_stages": plan.num_stages,
        "layers": ["embedding"] + [f"block_{i}" for i in range(num_layers(plan))] + ["head"],
        "parts": parts(plan),
        "topology": {"axes": [_AXIS_NAMES[a] for a in used], "dims": [dims[a] for a in used]},
        "activation_checkpoint_interval": 1 if plan.recompute == "full" else 0,
        "notes": notes,
    }


def module_snippet(spec: dict) -> str:
    return f'''"""Stage boundaries from a planner plan for deepspeed.pipe.PipelineModule.

Generated by `planner launch --format deepspeed`; do not edit.  PipelineModule's
partition_method knows only "uniform", "parameters" and "type:<regex>", so the plan's
boundaries are set by overriding _partition_layers.  Build the layer list as
[embedding, block_0, ..., block_{{L-1}}, head] ({spec["parts"][-1]} entries).
"""

from deepspeed.pipe import PipelineModule
from deepspeed.runtime.pipe.topology import ProcessTopology

PARTS = {spec["parts"]!r}
TOPOLOGY_AXES = {spec["topology"]["axes"]!r}
TOPOLOGY_DIMS = {spec["topology"]["dims"]!r}
ACTIVATION_CHECKPOINT_INTERVAL = {spec["activation_checkpoint_interval"]!r}


def topology():
    """The rank layout of rank_map.json: ranks numbered row-major over these axes."""
    return ProcessTopology(axes=list(TOPOLOGY_AXES), dims=list(TOPOLOGY_DIMS))


class PlannedPipelineModule(PipelineModule):
    def __init__(self, layers, **kwargs):
        kwargs.setdefault("topology", topology())
        kwargs.setdefault("activation_checkpoint_interval", ACTIVATION_CHECKPOINT_INTERVAL)
        # partition_method is ignored: _partition_layers below uses PARTS.
        super().__init__(layers, partition_method="uniform", **kwargs)

    def _partition_layers(self, method="uniform"):
        if len(self._layer_specs) != PARTS[-1]:
            raise RuntimeError(f"the plan expects {{PARTS[-1]}} layers (embedding, blocks, head), "
                               f"got {{len(self._layer_specs)}}")
        if self._topo.get_dim("pipe") != len(PARTS) - 1:
            raise RuntimeError(f"the plan has {{len(PARTS) - 1}} stages, the topology "
                               f"{{self._topo.get_dim('pipe')}}")
        self.parts = list(PARTS)
        stage_id = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])
'''


def render(plan: Plan, opts: LaunchOptions, cluster=None) -> dict[str, str]:
    check(plan)
    layout, axes = ds_layout(plan)
    spec = pipeline_spec(plan, axes)
    script = opts.script or "train.py"
    # --deepspeed_config is the flag deepspeed.add_config_arguments gives a training script.
    files = node_scripts(layout, opts, script, ["--deepspeed_config", f"$DIR/{CONFIG}"],
                         extra_env=precision_env(plan), comment=[
        f"DeepSpeed at {DEEPSPEED_COMMIT[:12]}; build the model with {MODULE}'s PlannedPipelineModule.",
        *precision_comment(plan)])
    files[CONFIG] = dump_json(ds_config(plan))
    files[PIPELINE] = dump_json(spec)
    files[MODULE] = module_snippet(spec)
    files[RANK_MAP] = dump_json(rank_map(plan, layout, opts))
    return files
