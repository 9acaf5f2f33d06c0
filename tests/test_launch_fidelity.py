"""Launching the fidelity sets' plans (tests/fidelity): Megatron-Core's published H100 runs come
back as the Megatron-LM arguments they were run with, and every plan of every set launches
with torchrun, each used device getting exactly one rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from planner.launch import render
from planner.plan.check import load_plan
from planner.spec import load_cluster

FIDELITY = Path(__file__).resolve().parent / "fidelity"


def _rows(name: str) -> list[dict]:
    path = FIDELITY / name / "rows.yaml"
    if not path.exists():
        return []
    return [row for row in yaml.safe_load(path.read_text())["rows"] if row.get("plan")]


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("row", _rows("megatron-core-h100"), ids=lambda r: r["id"])
def test_megatron_core_runs_come_back_as_their_arguments(row):
    base = FIDELITY / "megatron-core-h100"
    plan = load_plan(base / row["plan"])
    files = render(plan, "megatron", master_addr="10.0.0.1", cluster=load_cluster(base / row["cluster"]))
    out = json.loads(files["megatron_args.json"])
    args, config = out["args"], row["config"]
    assert int(_arg(args, "--tensor-model-parallel-size")) == config["tp"]
    assert int(_arg(args, "--pipeline-model-parallel-size")) == config["pp"]
    assert out["data_parallel_size"] == config["dp"]
    assert int(_arg(args, "--micro-batch-size")) == config["micro_batch_per_replica"]
    assert int(_arg(args, "--global-batch-size")) == config["global_batch_size"]
    for flag, key in (("--num-layers", "num_layers"), ("--hidden-size", "hidden_size"),
                      ("--num-attention-heads", "num_attention_heads"), ("--seq-length", "seq_len")):
        assert int(_arg(args, flag)) == config[key]
    rank_map = json.loads(files["rank_map.json"])
    assert rank_map["world_size"] == config["tp"] * config["pp"] * config["dp"]
    assert out["rank_order"] == "tp-dp-pp"  # whole-node stages: Megatron's default numbering


@pytest.mark.parametrize("name", ["megatron-core-h100", "sailor", "vtrain-multi"])
def test_every_fidelity_plan_launches_with_torchrun(name):
    rows = _rows(name)
    if not rows:
        pytest.skip(f"no plans in the {name} set")
    for row in rows:
        plan = load_plan(FIDELITY / name / row["plan"])
        data = json.loads(render(plan, "torchrun", master_addr="h")["rank_map.json"])
        devices = [r["device"] for r in data["ranks"]]
        assert sorted(devices) == sorted(plan.devices()), row["id"]
        assert [r["rank"] for r in data["ranks"]] == list(range(len(devices)))
        assert sum(n["nproc_per_node"] for n in data["nodes"]) == len(devices)
