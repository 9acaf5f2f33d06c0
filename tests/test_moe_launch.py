"""Launching Mixture-of-Experts plans (issue 20): Megatron-LM's MoE and expert-parallel flags,
torchtitan's expert_parallel_degree, and the formats that cannot run them refusing."""

from __future__ import annotations

import json

import pytest
from test_launch_formats import make_plan
from test_launch_sources import megatron_parser

from planner.errors import InputError
from planner.launch import render

# Megatron-Core-style MoE: 8 layers, the first dense, 8 experts of which each token takes 2,
# one shared expert.
MOE = {"name": "m", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
       "num_kv_heads": 4, "ffn_hidden_size": 2816, "mlp": "swiglu", "vocab_size": 32000,
       "tied_embeddings": False, "num_experts": 8, "moe_top_k": 2, "moe_ffn_hidden_size": 1408,
       "num_shared_experts": 1, "first_k_dense_layers": 1}


def moe_plan(ep=2, model=MOE, **knobs):
    inputs = {"cluster": "t", "model": model,
              "training": {"global_batch_size": 64, "seq_len": 2048, "precision": "bf16"}}
    return make_plan(expert_parallel=ep, inputs=inputs, **knobs)


def moe_parser():
    """megatron_parser plus the MoE flags as ``_add_moe_args`` of Megatron-LM's
    megatron/training/arguments.py defines them (types; --moe-layer-freq takes an int or a
    Python list expression, its moe_freq_type; the dispatcher's choices)."""
    p = megatron_parser()
    for flag in ("--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size",
                 "--moe-shared-expert-intermediate-size", "--expert-model-parallel-size",
                 "--kv-channels"):
        p.add_argument(flag, type=int)
    p.add_argument("--moe-layer-freq", type=str)
    p.add_argument("--moe-token-dispatcher-type", choices=["allgather", "alltoall", "flex"])
    p.add_argument("--moe-grouped-gemm", action="store_true")
    return p


def megatron(plan) -> list[str]:
    return json.loads(render(plan, "megatron", master_addr="h")["megatron_args.json"])["args"]


def test_megatron_gets_the_experts_and_the_expert_parallel_size():
    parsed = moe_parser().parse_args(megatron(moe_plan()))
    assert (parsed.num_experts, parsed.moe_router_topk, parsed.moe_ffn_hidden_size) == (8, 2, 1408)
    assert parsed.moe_shared_expert_intermediate_size == 1408
    assert parsed.expert_model_parallel_size == 2
    assert parsed.moe_token_dispatcher_type == "alltoall" and parsed.moe_grouped_gemm
    # Megatron evaluates the pattern as a Python list: layer 0 dense, the other 7 MoE
    pattern = eval(parsed.moe_layer_freq, {"__builtins__": {}})
    assert pattern == [0, 1, 1, 1, 1, 1, 1, 1]


def test_megatron_writes_every_nth_layer_pattern_and_wide_heads():
    model = {**MOE, "first_k_dense_layers": 0, "moe_layer_freq": 2, "head_dim": 128}
    parsed = moe_parser().parse_args(megatron(moe_plan(model=model)))
    assert eval(parsed.moe_layer_freq, {"__builtins__": {}}) == [1, 0, 1, 0, 1, 0, 1, 0]
    assert parsed.kv_channels == 128


def test_megatron_leaves_dense_plans_without_moe_flags():
    args = megatron(make_plan())
    assert not [a for a in args if "expert" in a or a.startswith("--moe") or a == "--kv-channels"]


def test_megatron_refuses_ep_with_tp_without_sequence_parallel():
    with pytest.raises(InputError, match="requires --sequence-parallel"):
        megatron(moe_plan(sequence_parallel=False))


def test_torchtitan_takes_ep_out_of_the_shard_degree():
    toml = render(moe_plan(), "torchtitan", master_addr="h")["torchtitan.toml"]
    assert "expert_parallel_degree = 2" in toml and "expert_tensor_parallel_degree = 2" in toml
    no_zero = render(moe_plan(zero_stage=0), "torchtitan", master_addr="h")["torchtitan.toml"]
    # torchtitan's ParallelDims: (dp_shard x cp) % ep == 0, so the EP group is an FSDP group
    assert "data_parallel_shard_degree = 2" in no_zero and "data_parallel_replicate_degree = 1" in no_zero
    assert "HSDP" in no_zero


@pytest.mark.parametrize("fmt, message", [("deepspeed", "deepspeed.moe.layer.MoE"),
                                          ("pipelining", "no expert parallelism")])
def test_formats_without_expert_parallelism_refuse_it(fmt, message):
    with pytest.raises(InputError, match=message):
        render(moe_plan(), fmt, master_addr="h")


def test_the_reference_runner_refuses_moe_models():
    from planner.launch.runner import model_shape
    with pytest.raises(InputError, match="trains dense models"):
        model_shape(moe_plan(ep=1))


def test_deepseek_v3_layer_pattern_names_its_three_dense_layers():
    from planner import catalog
    from planner.launch.megatron import moe_args, moe_layer_pattern
    model = catalog.model("deepseek-v3")
    pattern = eval(moe_layer_pattern(model), {"__builtins__": {}})
    assert pattern == [0, 0, 0] + [1] * 58
    args = moe_args(model)
    assert args[args.index("--moe-shared-expert-intermediate-size") + 1] == "2048"
    assert args[args.index("--num-experts") + 1] == "256"
