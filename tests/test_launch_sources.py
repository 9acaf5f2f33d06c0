"""The emitted Megatron-LM arguments parse with the definitions Megatron-LM gives them.

Megatron-LM is not installed here, so the flags this package emits are restated from
``megatron/training/arguments.py`` at commit 000c4ac24f61159c138b0975def722c65245983c (types,
``store_true`` flags and ``choices`` as written there) and parsed the way Megatron does
(``allow_abbrev=False``).  A flag missing from this table, a value of the wrong type or a
choice Megatron lacks fails the test."""

from __future__ import annotations

import argparse
import json

import pytest
from test_launch_formats import chain_plan, make_plan

from planner.launch import render


def megatron_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                 "--num-layers-per-virtual-pipeline-stage", "--num-layers", "--hidden-size",
                 "--num-attention-heads", "--num-query-groups", "--ffn-hidden-size", "--seq-length",
                 "--max-position-embeddings", "--micro-batch-size", "--global-batch-size",
                 "--recompute-num-layers"):
        p.add_argument(flag, type=int)
    p.add_argument("--pipeline-model-parallel-layout", type=str)
    p.add_argument("--recompute-granularity", type=str, choices=["full", "selective"])
    p.add_argument("--recompute-method", type=str, choices=["uniform", "block"])
    p.add_argument("--position-embedding-type", type=str,
                   choices=["learned_absolute", "rope", "mrope", "relative", "none"])
    p.add_argument("--rotary-base", type=int)
    p.add_argument("--rope-scaling-factor", type=float)
    p.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"])
    p.add_argument("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    for flag in ("--use-tp-pp-dp-mapping", "--group-query-attention", "--swiglu",
                 "--untie-embeddings-and-output-weights", "--sequence-parallel",
                 "--use-distributed-optimizer", "--bf16", "--fp16", "--use-rope-scaling"):
        p.add_argument(flag, action="store_true")
    return p


PLANS = {
    "uneven": lambda: make_plan(),
    "chains": lambda: chain_plan(),
    "interleaved": lambda: make_plan(blocks=((0, 4), (4, 8)), schedule="interleaved-1f1b", virtual_stages=2),
    "selective-fp16": lambda: make_plan(recompute="selective", inputs={
        "cluster": "t", "model": make_plan().inputs.model,
        "training": {"global_batch_size": 64, "seq_len": 2048, "precision": "fp16"}}),
    "llama3-405b": lambda: make_plan(blocks=((0, 63), (63, 126)), inputs={
        "cluster": "t", "model": "llama3-405b",
        "training": {"global_batch_size": 64, "seq_len": 8192, "precision": "bf16"}}),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_megatron_arguments_parse_with_megatrons_definitions(name):
    plan = PLANS[name]()
    args = json.loads(render(plan, "megatron", master_addr="h")["megatron_args.json"])["args"]
    parsed = megatron_parser().parse_args(args)
    assert parsed.tensor_model_parallel_size * parsed.pipeline_model_parallel_size * 2 == 8
    assert parsed.bf16 != parsed.fp16
    # validate_args: selective granularity takes no recompute method.
    if parsed.recompute_granularity == "selective":
        assert parsed.recompute_method is None
    # validate_args: at most one way of giving virtual stages.
    assert (parsed.num_layers_per_virtual_pipeline_stage is None
            or parsed.pipeline_model_parallel_layout is None)
    # Megatron's global batch must be a multiple of micro batch x data-parallel size.
    assert parsed.global_batch_size % (parsed.micro_batch_size * 2) == 0
