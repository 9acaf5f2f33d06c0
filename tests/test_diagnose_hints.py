"""The "would fit" hints of an infeasible job (search/diagnose.py): each derived from the memory
arithmetic and named only where it can help, and the ones that say so checked by a search that
allows them.  Cases from a robustness sweep, where the hints named ZeRO-3 beside a proof that
no sharding fits, ZeRO-1 after ZeRO-3 had failed, and ZeRO for a single replica."""

from __future__ import annotations

import re

import pytest

from planner import api
from planner.errors import InfeasibleError
from planner.spec import cluster_from_dict

TIME_LIMIT_S = 10


def _cluster(count: int, gpu, gpus_per_node: int = 8, network: str | None = None):
    node = {"name": "r", "count": count, "gpu": gpu, "gpus_per_node": gpus_per_node}
    if network:
        node["network_bandwidth"] = network
    return cluster_from_dict({"name": "c", "nodes": [node]})


def _gpu(memory: str) -> dict:
    return {"name": "G", "memory": memory, "peak_tflops": 100, "memory_bandwidth": "1 TB/s",
            "intra_node_bandwidth": "100 GB/s"}


def _reason(cluster, model, training) -> str:
    with pytest.raises(InfeasibleError) as err:
        api.plan(cluster, model, training, time_limit_s=TIME_LIMIT_S)
    return str(err.value)


def _would_fit(text: str, line_start: str) -> list[str]:
    """The hints of the line of ``text`` that starts with ``line_start``."""
    line = next(x.strip() for x in text.splitlines() if x.strip().startswith(line_start))
    return line.split("; would fit: ")[1].split(", ")


def _feasible(cluster, model, training) -> bool:
    return api.plan(cluster, model, training, time_limit_s=TIME_LIMIT_S).plan is not None


T4X8 = {"gpu": "T4", "network": "25 Gbit/s"}
LLAMA_7B_FP16 = api.Training(global_batch_size=64, seq_len=2048, precision="fp16")


@pytest.mark.parametrize("zero_stages", [(0, 1), (3,)])
def test_states_over_every_gpu_leave_only_more_memory(zero_stages):
    """8 T4s hold 107.21 GiB after the workspace, llama2-7b's fp16 states need 125.52 GiB: no
    ZeRO stage, recompute or batch can fit it, and none is named (ZeRO-1 least of all after
    ZeRO-3 failed)."""
    cluster = _cluster(1, T4X8["gpu"], network=T4X8["network"])
    text = _reason(cluster, "llama2-7b", LLAMA_7B_FP16.model_copy(update={"zero_stages": zero_stages}))
    assert "need 125.52 GiB even split" in text and "at least 10 GPUs of these types" in text
    assert _would_fit(text, "single blocks fit") == ["more GPUs"]


def test_one_replica_gets_no_zero_hint_and_the_state_line():
    """One GPU: ZeRO over one replica shards nothing, so it is not named; the states (6.8 TB
    of llama3-405b against 20.85 GiB) get their line though single blocks do not fit."""
    text = _reason(_cluster(1, "RTX4090-24GB", gpus_per_node=1), "llama3-405b",
                   api.Training(global_batch_size=8, seq_len=4096))
    assert "ZeRO-3" not in text and "allow ZeRO" not in text
    assert "need 6803.72 GiB even split" in text and "the 1 GPUs hold 20.85 GiB" in text
    assert _would_fit(text, "RTX4090-24GB") == ["GPUs with more than 57.17 GiB"]


def test_a_gpu_the_workspace_fills_gets_no_zero_hint_nor_a_negative_count():
    text = _reason(_cluster(1, _gpu("0.001 GB"), gpus_per_node=2, network="1 bit/s"), "llama2-7b",
                   api.Training(global_batch_size=8, seq_len=2048))
    assert "ZeRO-3" not in text and "allow ZeRO" not in text
    assert "hold 0.00 GiB after the 1.50 GiB workspace each" in text
    assert "would fit: GPUs with more memory than the 1.50 GiB workspace" in text
    assert not re.search(r"at least -?\d+ GPUs", text)


def test_a_split_whose_states_need_sharding_names_the_lowest_stage_that_fits():
    """One stage of tp 4 leaves 8 replicas of llama2-13b on 32 RTX 3090s: ZeRO-1 leaves 22.7 GiB
    of states a GPU (20.85 GiB of room), ZeRO-2 12.1 GiB.  ZeRO-2 is named, not ZeRO-3 nor
    the activation savers, and with it allowed a plan exists."""
    cluster = _cluster(4, "RTX3090-24GB")
    training = api.Training(global_batch_size=64, seq_len=2048, max_stages=1, max_tp=4)
    text = _reason(cluster, "llama2-13b", training)
    assert _would_fit(text, "single blocks fit") == ["more GPUs", "ZeRO-2", "more than 1 stages"]
    assert _feasible(cluster, "llama2-13b", training.model_copy(update={"zero_stages": (0, 1, 2)}))


def test_a_block_whose_states_need_sharding_names_that_stage():
    """A 4-block model of hidden size 12288 on 64 GPUs of 12 GB, tp held to 1: one block with
    ZeRO-1 over the 64 replicas needs 12.79 GiB; ZeRO-2 fits it, and a plan with it exists."""
    wide = api.load_model({"name": "wide4", "num_layers": 4, "hidden_size": 12288, "num_attention_heads": 96,
                           "num_kv_heads": 96, "ffn_hidden_size": 49152, "mlp": "gelu", "vocab_size": 32000,
                           "tied_embeddings": True, "max_seq_len": 4096})
    cluster = _cluster(8, _gpu("12 GB"), network="100 Gbit/s")
    training = api.Training(global_batch_size=64, seq_len=2048, max_tp=1)
    text = _reason(cluster, wide, training)
    assert _would_fit(text, "G@") == ["allow ZeRO-2 (training.zero_stages)", "allow tp up to 8",
                                      "GPUs with more than 12.79 GiB"]
    assert _feasible(cluster, wide, training.model_copy(update={"zero_stages": (0, 1, 2)}))


def test_a_stage_whose_split_cannot_hold_the_states_is_not_named_for_a_block():
    """llama2-70b on 320 GPUs of 6 GB, tp 1: ZeRO-3 would fit one block, but its gathered weights
    (two blocks, 3.2 GiB) beside the shards leave a split's GPUs over their room, so only a
    larger TP is named; with ZeRO-3 allowed no stage is named at all."""
    cluster = _cluster(40, _gpu("6 GB"), network="100 Gbit/s")
    training = api.Training(global_batch_size=256, seq_len=2048, max_tp=1)
    text = _reason(cluster, "llama2-70b", training)
    assert _would_fit(text, "G@") == ["allow tp up to 8", "GPUs with more than 6.90 GiB"]
    text = _reason(cluster, "llama2-70b", training.model_copy(update={"zero_stages": (3,)}))
    assert _would_fit(text, "single blocks fit") == ["more GPUs"]


def test_activations_over_name_their_savers_and_a_smaller_batch_only_where_it_helps():
    """llama2-13b, 16,384-token sequences without recompute on 16 RTX 3090s: the states fit, the
    activations do not.  Full recompute and a smaller batch are named (each gives a plan: one
    sequence a replica), at two sequences still; context parallelism is not, as tp 8 already
    divides the activations as far as cp would."""
    cluster = _cluster(2, "RTX3090-24GB")
    training = api.Training(global_batch_size=64, seq_len=16384, recompute_modes=("none",))
    text = _reason(cluster, "llama2-13b", training)
    assert _would_fit(text, "single blocks fit") == ["more GPUs", "full recompute", "a smaller global batch"]
    assert _feasible(cluster, "llama2-13b", training.model_copy(update={"global_batch_size": 1}))
    assert _feasible(cluster, "llama2-13b", training.model_copy(update={"recompute_modes": ("none", "full")}))
    _reason(cluster, "llama2-13b", training.model_copy(update={"context_parallel_degrees": (1, 2, 4)}))
    two = training.model_copy(update={"global_batch_size": 2})
    assert _would_fit(_reason(cluster, "llama2-13b", two), "single blocks fit")[-1] == "a smaller global batch"
