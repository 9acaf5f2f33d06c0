"""Megatron-LM output trains the architecture that was planned: GPT-style catalog models keep
Megatron's defaults (learned positions, LayerNorm, biased linears), Llama-style ones pass RoPE,
RMSNorm, SwiGLU, no bias, untied embeddings, GQA and the FFN size."""

from __future__ import annotations

import json

import pytest
from test_launch_formats import make_plan

from planner.errors import InputError
from planner.launch import render
from planner.plan import Plan
from planner.spec import load_model

ARCH_FLAGS = ("--position-embedding-type", "--rotary-base", "--use-rope-scaling", "--normalization",
              "--disable-bias-linear", "--swiglu", "--untie-embeddings-and-output-weights",
              "--group-query-attention")


def megatron_args_for(model: str) -> list[str]:
    layers = load_model(model).num_layers
    half = layers // 2
    plan = make_plan(blocks=((0, half), (half, layers)), inputs={
        "cluster": "t", "model": load_model(model).to_mapping(),
        "training": {"global_batch_size": 64, "seq_len": 2048, "precision": "bf16"}})
    return json.loads(render(plan, "megatron", master_addr="h")["megatron_args.json"])["args"]


def value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("model", ["megatron-gpt-1.7b", "gpt3-175b"])
def test_gpt_style_keeps_megatrons_defaults(model):
    args = megatron_args_for(model)
    assert [f for f in ARCH_FLAGS if f in args] == []
    assert value(args, "--ffn-hidden-size") == str(4 * load_model(model).hidden_size)


def test_untied_gpt_style_unties_only():
    args = megatron_args_for("mcore-gpt-1.7b")
    assert [f for f in ARCH_FLAGS if f in args] == ["--untie-embeddings-and-output-weights"]


@pytest.mark.parametrize("model, base, groups, ffn", [
    ("llama2-7b", "10000", None, "11008"),
    ("llama2-70b", "10000", "8", "28672"),
    ("llama3-8b", "500000", "8", "14336"),
])
def test_llama_style_carries_its_architecture(model, base, groups, ffn):
    args = megatron_args_for(model)
    assert value(args, "--position-embedding-type") == "rope"
    assert value(args, "--rotary-base") == base
    assert value(args, "--normalization") == "RMSNorm"
    for flag in ("--disable-bias-linear", "--swiglu", "--untie-embeddings-and-output-weights"):
        assert flag in args
    assert value(args, "--ffn-hidden-size") == ffn
    assert "--use-rope-scaling" not in args
    if groups is None:
        assert "--group-query-attention" not in args and "--num-query-groups" not in args
    else:
        assert "--group-query-attention" in args and value(args, "--num-query-groups") == groups


def test_llama31_rope_scaling():
    args = megatron_args_for("llama3-405b")
    assert "--use-rope-scaling" in args and value(args, "--rope-scaling-factor") == "8"


def test_architecture_survives_the_plan_file():
    """The plan stores the model mapping; the fields reach a launch from the written file."""
    plan = make_plan(blocks=((0, 16), (16, 32)), inputs={
        "cluster": "t", "model": load_model("llama3-8b").to_mapping(),
        "training": {"global_batch_size": 64, "seq_len": 2048, "precision": "bf16"}})
    again = Plan.from_json(json.loads(plan.dumps()))
    model = load_model(again.inputs.model)
    assert (model.position_embedding, model.rotary_base, model.normalization, model.linear_bias) == \
        ("rope", 500000, "rmsnorm", False)
    # GPT-style mappings stay as they were before the fields existed.
    assert "position_embedding" not in load_model("gpt3-175b").to_mapping()


def test_rotary_base_without_rope_is_refused():
    with pytest.raises(InputError, match="rotary_base"):
        load_model({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128,
                    "rotary_base": 10000})


def test_the_attention_kernel_priced_is_the_one_launched():
    """A plan priced with flash attention asks Megatron for it; one priced unfused (stated, or a
    plan without the key, written before flash became the default) says that Megatron's auto
    backend runs a fused kernel instead."""
    def rendered(**training):
        t = {"global_batch_size": 64, "seq_len": 2048, "precision": "bf16", **training}
        plan = make_plan(inputs={"cluster": "t", "model": make_plan().inputs.model, "training": t})
        return json.loads(render(plan, "megatron", master_addr="h")["megatron_args.json"])
    flash = rendered(attention="flash")
    assert value(flash["args"], "--attention-backend") == "flash"
    for unfused in (rendered(), rendered(attention="unfused")):
        assert "--attention-backend" not in unfused["args"]
        assert any("re-plan with training attention: flash" in n for n in unfused["notes"])
