"""``--format megatron``: Megatron-LM arguments plus the torchrun wrapper per node.

Argument names checked against NVIDIA/Megatron-LM ``megatron/training/arguments.py`` (commit
000c4ac24f61159c138b0975def722c65245983c, after Megatron-Core v0.14; the model-architecture flags
--position-embedding-type {learned_absolute,rope}, --rotary-base, --use-rope-scaling,
--rope-scaling-factor, --normalization {LayerNorm,RMSNorm}, --disable-bias-linear, --swiglu,
--untie-embeddings-and-output-weights, --group-query-attention, --num-query-groups and
--ffn-hidden-size in its _add_network_size_args / _add_training_args) and the layout grammar
against ``megatron/core/transformer/pipeline_parallel_layer_layout.py``: a stage is written
``E`` (embedding), ``t`` (one transformer layer), ``L`` (loss/head), stages split by ``|``,
``t*5`` repeats; schedule stages are listed virtual-chunk-major.

Mixture-of-Experts flags (--num-experts, --moe-router-topk, --moe-ffn-hidden-size,
--moe-shared-expert-intermediate-size, --moe-layer-freq, --moe-token-dispatcher-type,
--moe-grouped-gemm, --expert-model-parallel-size, --kv-channels) as named in Megatron-LM's
``_add_moe_args`` / ``_add_network_size_args`` of ``megatron/training/arguments.py`` (names
confirmed in a copy of that function; not re-read at MEGATRON_COMMIT).  Expert-parallel groups
are consecutive data-parallel ranks (``ep`` before ``dp`` in both rank orders), i.e. the plan's
consecutive replicas of a stage, as planner.cost.moe groups them; experts are tensor-parallel
over the same tp (Megatron's default --expert-tensor-parallel-size).

Megatron-LM builds its process groups from the global rank (``tp-cp-ep-dp-pp`` order, tensor
parallel fastest, or ``tp-cp-ep-pp-dp`` with ``--use-tp-pp-dp-mapping``); the rank map is
written in that numbering and CUDA_VISIBLE_DEVICES puts each rank on the plan's device.
"""

from __future__ import annotations

from planner.errors import InputError
from planner.launch.common import (
    LaunchOptions,
    Problems,
    check_structure,
    check_uniform,
    chunks,
    dump_json,
    global_batch_size,
    num_layers,
    precision,
    precision_comment,
    precision_env,
    seq_len,
    shell_join,
)
from planner.launch.ranks import AXES_DP_PP_TP, AXES_PP_DP_TP, describe_nodes, framework_layout
from planner.launch.schedule_csv import ROUTES as _V_CLASS
from planner.launch.torchrun import RANK_MAP, node_scripts, rank_map
from planner.plan import Plan
from planner.plan.model import V_SCHEDULES
from planner.spec import load_model

TOOL = "Megatron-LM"
MEGATRON_COMMIT = "000c4ac24f61159c138b0975def722c65245983c"
ARGS_FILE = "megatron_args.json"


def layout_string(plan: Plan) -> str:
    """``--pipeline-model-parallel-layout`` for the plan's (possibly uneven) stages."""
    parts = []
    for c in chunks(plan, "megatron"):
        n = c.last - c.first
        body = "t" * n if n <= 2 else f"t*{n}"
        parts.append(("E" if c.embedding else "") + body + ("L" if c.head else ""))
    return "|".join(parts)


def pipeline_args(plan: Plan) -> list[str]:
    """Stage boundaries: nothing for an even split, ``--num-layers-per-virtual-pipeline-stage``
    for an even interleaved split, the layout string for anything uneven."""
    p, v = plan.num_stages, plan.virtual_stages
    sizes = {s.num_blocks for s in plan.stages}
    if p == 1:
        return []
    if len(sizes) == 1:
        per_stage = sizes.pop()
        if v == 1:
            return []
        chunks(plan, "megatron")  # refuses stages not divisible by v, with the stage named
        return ["--num-layers-per-virtual-pipeline-stage", str(per_stage // v)]
    return ["--pipeline-model-parallel-layout", layout_string(plan)]


def model_args(plan: Plan) -> list[str]:
    model = load_model(plan.inputs.model)
    if model.num_layers != num_layers(plan):
        raise InputError(f"launch --format megatron: the plan's stages hold {num_layers(plan)} blocks "
                         f"but inputs.model has num_layers {model.num_layers}")
    seq = seq_len(plan)
    args = ["--num-layers", str(model.num_layers), "--hidden-size", str(model.hidden_size),
            "--num-attention-heads", str(model.num_attention_heads)]
    if model.kv_heads != model.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.kv_heads)]
    args += ["--ffn-hidden-size", str(model.ffn_size)]
    if model.mlp == "swiglu":
        args.append("--swiglu")
    args += ["--seq-length", str(seq),
             "--max-position-embeddings", str(max(seq, model.max_seq_len or 0))]
    if not model.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    return args + architecture_args(model) + moe_args(model)


def moe_layer_pattern(model) -> str:
    """--moe-layer-freq as Megatron's list expression: 1 for a MoE layer, 0 for a dense one."""
    flags = [int(model.is_moe_layer(i)) for i in range(model.num_layers)]
    if model.moe_layer_freq == 1:   # k dense layers, then MoE: "([0]*3+[1]*58)"
        k = model.first_k_dense_layers
        return f"([0]*{k}+[1]*{model.num_layers - k})"
    return "[" + ",".join(map(str, flags)) + "]"


def moe_args(model) -> list[str]:
    """Wide heads and Mixture of Experts (module docstring); nothing for dense GPT/Llama models."""
    args = []
    if model.attention_head_dim is not None:
        args += ["--kv-channels", str(model.attention_head_dim)]
    if not model.is_moe:
        return args
    args += ["--num-experts", str(model.num_experts), "--moe-router-topk", str(model.moe_top_k),
             "--moe-ffn-hidden-size", str(model.moe_ffn_size)]
    if model.num_shared_experts:
        args += ["--moe-shared-expert-intermediate-size", str(model.shared_ffn_size)]
    if model.num_moe_layers != model.num_layers:
        args += ["--moe-layer-freq", moe_layer_pattern(model)]
    # the all-to-all dispatcher and batched expert GEMMs are what planner.cost prices
    return args + ["--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"]


def architecture_args(model) -> list[str]:
    """What makes a Llama-style model differ from Megatron-LM's GPT defaults (learned_absolute
    positions, LayerNorm, biased linears), so the launched run trains the planned model."""
    args = []
    if model.position_embedding == "rope":
        args += ["--position-embedding-type", "rope"]
        if model.rotary_base is not None:
            args += ["--rotary-base", str(model.rotary_base)]
        if model.rope_scaling_factor is not None:
            # Megatron-LM's --use-rope-scaling applies the Llama 3.1 frequency scaling.
            args += ["--use-rope-scaling", "--rope-scaling-factor", f"{model.rope_scaling_factor:g}"]
    if model.normalization == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if not model.linear_bias:
        args.append("--disable-bias-linear")
    return args


def training_args(plan: Plan, tp: int) -> tuple[list[str], list[str]]:
    args = ["--micro-batch-size", str(plan.stages[0].replicas[0].micro_batch_share),
            "--global-batch-size", str(global_batch_size(plan))]
    notes = []
    if plan.recompute == "full":
        # One layer per recompute unit: every layer's input is kept, all else recomputed,
        # which is what the cost model's "full" mode charges.
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1"]
    elif plan.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif plan.recompute == "op":
        raise InputError("launch --format megatron: recompute op is torchtitan's per-op checkpointing, "
                         "which Megatron-LM does not have (--recompute-granularity selective redoes the "
                         "attention core only); re-plan with recompute selective or full")
    if plan.sequence_parallel:
        if tp > 1:
            args.append("--sequence-parallel")
        else:
            notes.append("sequence_parallel is set but tp is 1: Megatron-LM turns it off, so it is not passed")
    if plan.zero_stage == 1:
        args.append("--use-distributed-optimizer")
    elif plan.zero_stage >= 2:
        # Megatron FSDP (arguments.py at MEGATRON_COMMIT): --data-parallel-sharding-strategy
        # optim_grads shards optimizer state and grads (ZeRO-2), optim_grads_params the weights
        # too (ZeRO-3); validate_args requires --ckpt-format fsdp_dtensor with it
        strategy = "optim_grads" if plan.zero_stage == 2 else "optim_grads_params"
        args += ["--use-distributed-optimizer", "--use-megatron-fsdp",
                 "--data-parallel-sharding-strategy", strategy, "--ckpt-format", "fsdp_dtensor"]
        notes.append(f"zero_stage {plan.zero_stage}: Megatron FSDP ({strategy}); it asserts "
                     "CUDA_DEVICE_MAX_CONNECTIONS is not 1, so the node scripts leave it unset")
    if plan.zero_shard_degree is not None:
        n = len(plan.stages[0].replicas)
        # HSDP (parallel_state.py at MEGATRON_COMMIT): k instances split each dp x cp group into
        # k consecutive chunks, the distributed optimizer (or Megatron FSDP, whose outer group is
        # then the inter-instance one) shards inside a chunk and all-reduces across the chunks
        args += ["--num-distributed-optimizer-instances", str(n // plan.shard_replicas(n))]
    prec = precision(plan)
    if prec in ("bf16", "fp16"):
        args.append(f"--{prec}")
    else:
        # Without --fp16/--bf16 Megatron-LM keeps params, grads and activations in fp32
        # (params_dtype float32) and sets no TF32 switch of its own (arguments.py at MEGATRON_COMMIT).
        notes.append(f"{prec}: neither --fp16 nor --bf16, so Megatron-LM trains in fp32")
        if prec == "tf32":
            notes.append("tf32: Megatron-LM does not set torch.backends.cuda.matmul.allow_tf32; the node "
                         "scripts export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, which turns it on")
        else:
            notes.append("fp32: Transformer Engine (the default --transformer-impl transformer_engine) runs "
                         "fp32 GEMMs on TF32 tensor cores whatever PyTorch's setting (CUBLAS_COMPUTE_32F_FAST_TF32 "
                         "in its cublaslt_gemm.cu), faster than the plan's FP32 CUDA-core pricing; add "
                         "--transformer-impl local for plain fp32 matmuls")
    # --attention-backend (flash, fused, unfused, local, auto; auto by default) picks the kernel
    if plan.training_choice("attention") == "flash":
        args += ["--attention-backend", "flash"]
    else:
        notes.append("attention: the plan priced the unfused core (training attention: unfused, or a plan "
                     "written before flash became the default); Megatron-Core's --attention-backend auto "
                     "picks a fused kernel, faster and without the s x s scores in memory: re-plan with "
                     "training attention: flash to price it, or pass --attention-backend unfused to run "
                     "what was priced")
    if plan.training_choice("elementwise") == "eager":
        notes.append("elementwise: the plan priced eager PyTorch ops (training elementwise: eager); "
                     "Megatron-LM fuses the norms, RoPE, activation and bias-dropout-adds (Transformer "
                     "Engine / Apex kernels), so it will run faster than priced: re-plan with "
                     "elementwise: fused to price it")
    if plan.training_choice("cross_entropy") == "plain":
        notes.append("cross_entropy: the plan priced F.cross_entropy on an fp32 copy of the logits "
                     "(training cross_entropy: plain); Megatron-LM computes its vocab-parallel fused "
                     "loss, which moves fewer bytes and keeps no fp32 copy: re-plan with cross_entropy: "
                     "fused to price what it runs")
    if plan.schedule == "gpipe" and plan.num_stages > 1:
        notes.append("schedule gpipe runs as Megatron-LM's 1F1B: the same bubble with fewer "
                     "micro-batches in flight, so it fits wherever the GPipe plan fits")
    return args, notes


def megatron_layout(plan: Plan):
    layout = framework_layout(plan, AXES_PP_DP_TP)
    if layout is not None:
        return layout, []
    layout = framework_layout(plan, AXES_DP_PP_TP)
    if layout is not None:
        return layout, ["--use-tp-pp-dp-mapping"]
    raise InputError(
        "launch --format megatron: Megatron-LM numbers ranks tensor-parallel first, then data-parallel, "
        "then pipeline (or pipeline before data-parallel with --use-tp-pp-dp-mapping), and torchrun "
        "gives each node one contiguous block of ranks; under neither order does every node hold a "
        f"contiguous block here ({describe_nodes(plan)}). Place each stage's replicas, or each "
        "replica chain, on whole nodes, or use --format torchrun or pipelining")


def build_args(plan: Plan) -> tuple[list[str], list[str], object]:
    check_structure(plan, "megatron")
    check_uniform(plan, "megatron", TOOL)
    interleaved = plan.schedule == "interleaved-1f1b" and plan.virtual_stages > 1
    m, p = plan.num_micro_batches, plan.num_stages
    if plan.schedule == "bitpipe":
        Problems("megatron", [("schedule bitpipe: Megatron-LM has no bidirectional schedule (BitPipe runs "
                               "two pipelines in opposite directions over the same ranks, with a second "
                               "weight copy per rank all-reduced over rank pairs; its authors ship it as a "
                               "Megatron-LM fork, not upstream); re-plan with schedule interleaved-1f1b "
                               "or 1f1b")]).raise_if_any()
    if plan.schedule == "zb-h1":
        # core/pipeline_parallel/schedules.py: forward_backward_no_pipelining,
        # _pipelining_without_interleaving (1F1B) and _with_interleaving; none splits a backward.
        Problems("megatron", [("schedule zb-h1: Megatron-LM's pipeline schedules (1F1B and interleaved "
                               "1F1B) run each backward whole and have no zero-bubble schedule; re-plan "
                               "with schedule 1f1b, or use --format pipelining (torch's "
                               "ScheduleInterleavedZeroBubble)")]).raise_if_any()
    if plan.schedule in V_SCHEDULES:
        Problems("megatron", [(f"schedule {plan.schedule}: Megatron-LM's pipeline schedules place "
                               "virtual stages round-robin (interleaved 1F1B), not in a V, and run each "
                               "backward whole; re-plan with schedule 1f1b or interleaved-1f1b, or use "
                               f"--format pipelining (torch's {_V_CLASS[plan.schedule]})")]).raise_if_any()
    if plan.schedule == "latency-aware":
        Problems("megatron", [("schedule latency-aware: Megatron-LM's pipeline schedules are fixed "
                               "(1F1B, interleaved 1F1B) and cannot follow the plan's per-rank action "
                               "lists; re-plan with schedule 1f1b")]).raise_if_any()
    if plan.zero_stage == 3 and not plan.reshards_after_forward:
        # arguments.py at MEGATRON_COMMIT: Megatron FSDP has no reshard-after-forward switch; only
        # --use-torch-fsdp2 has one (--torch-fsdp2-no-reshard-after-forward), and validate_args
        # refuses that path with pipeline parallelism and with the distributed optimizer
        Problems("megatron", [("reshard_after_forward false with zero_stage 3: Megatron FSDP "
                               "(--use-megatron-fsdp) has no switch to keep gathered parameters "
                               "after forward; re-plan with reshard_after_forward true "
                               "(training.reshard_after_forward), or use --format torchtitan")]).raise_if_any()
    if interleaved and p == 1:
        Problems("megatron", [("interleaved 1F1B with one stage has nothing to interleave: "
                               "re-plan with schedule 1f1b")]).raise_if_any()
    if interleaved and (m < p or m % p):
        # forward_backward_pipelining_with_interleaving (core/pipeline_parallel/schedules.py)
        # takes micro-batches in groups of the pipeline size by default and rejects a count
        # below it or a remainder group smaller than it.
        Problems("megatron", [(f"interleaved 1F1B with {m} micro-batches over {p} stages: Megatron-LM "
                               "needs a multiple of the pipeline size; re-plan num_micro_batches")]
                 ).raise_if_any()
    tp = plan.stages[0].replicas[0].tp
    ep = plan.expert_parallel
    if ep > 1 and tp > 1 and not plan.sequence_parallel:
        # validate_args: MoE with both expert and tensor parallelism needs sequence parallelism
        Problems("megatron", [(f"expert_parallel {ep} with tp {tp} and sequence_parallel false: "
                               "Megatron-LM requires --sequence-parallel when expert and tensor "
                               "parallelism are combined; re-plan with sequence_parallel true")]
                 ).raise_if_any()
    layout, mapping_args = megatron_layout(plan)
    # --context-parallel-size: ModelParallelConfig.context_parallel_size (arguments.py builds the
    # flag from it, megatron/training/argument_utils.py); the default --cp-comm-type p2p is the
    # ring the plan priced; validate_args asserts seq_length % (2 cp) == 0, as the plan check does
    cp_args = ["--context-parallel-size", str(plan.context_parallel)] if plan.context_parallel > 1 else []
    parallel = ["--tensor-model-parallel-size", str(tp), *cp_args,
                "--pipeline-model-parallel-size", str(plan.num_stages), *pipeline_args(plan),
                *mapping_args]
    if ep > 1:
        parallel += ["--expert-model-parallel-size", str(ep)]
    train, notes = training_args(plan, tp)
    return parallel + model_args(plan) + train, notes, layout


def render(plan: Plan, opts: LaunchOptions, cluster=None) -> dict[str, str]:
    args, notes, layout = build_args(plan)
    tp = plan.stages[0].replicas[0].tp
    script = opts.script or "pretrain_gpt.py"
    # Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with tensor parallelism before Blackwell
    # (validate_args), so the kernel order overlaps TP communication as it expects.
    # Megatron FSDP (ZeRO-2/3) asserts the opposite and only warns about TP (validate_args).
    # The same holds for context parallelism (validate_args: "tensor model parallelism or context
    # parallelism").
    env = ({"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if (tp > 1 or plan.context_parallel > 1)
           and plan.zero_stage < 2 else {})
    env.update(precision_env(plan))
    files = node_scripts(layout, opts, script, args, extra_env=env, comment=[
        f"Megatron-LM at {MEGATRON_COMMIT[:12]}; add data, tokenizer and optimizer arguments",
        "after this script's name: ./<this script> --data-path ... --tokenizer-type ...",
        *precision_comment(plan)])
    files[ARGS_FILE] = dump_json({
        "megatron_lm_commit": MEGATRON_COMMIT,
        "args": args,
        "command_line": shell_join(args),
        "rank_order": layout.rank_order,
        "data_parallel_size": len(plan.stages[0].replicas),
        "notes": notes,
    })
    files[RANK_MAP] = dump_json(rank_map(plan, layout, opts))
    return files
