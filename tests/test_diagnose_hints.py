"""The "would fit" hints of an infeasible job (search/diagnose.py, search/hint_checks.py): each
candidate change is named only where a search that allows it alone finds a plan, and the
tests apply every hint named, as a user would (added to the settings given), and plan with it.
Cases from a robustness sweep and a review: hints that named ZeRO-3 beside a proof that no
sharding fits, ZeRO for a single replica, full recompute or a smaller batch that did not help
(GPipe, fixed micro-batch sizes), tp 8 for a model of 20 heads, a GPU size beside the line
that the states exceed every GPU together; and hints dropped that did help (full recompute and
context parallelism for llama2-7b at 32k tokens)."""

from __future__ import annotations

import re

import pytest

from planner import api
from planner.errors import InfeasibleError
from planner.search.hint_checks import _with_groups
from planner.spec import cluster_from_dict

TIME_LIMIT_S = 10


@pytest.fixture(autouse=True)
def _work_clock_decides(monkeypatch):
    """The checks' wall-clock guard off: on a loaded machine it cut checks short (a hint then
    goes to "not decided"), so what the tests see would depend on the load; the checks' work
    clock alone is the same on any machine."""
    from planner.search import hint_checks
    monkeypatch.setattr(hint_checks, "WALL_S", 600.0)
WOULD_FIT = "would fit (each alone; a search with it finds a plan): "


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


def _line(text: str, start: str) -> str | None:
    return next((x.strip() for x in text.splitlines() if x.strip().startswith(start)), None)


def _hints(text: str) -> list[str]:
    """The hints named as giving a plan (none: [])."""
    line = _line(text, WOULD_FIT)
    return line[len(WOULD_FIT):].split(", ") if line else []


def _no_plan(text: str) -> list[str]:
    """The changes the checks showed to give no plan."""
    line = _line(text, "no other single change checked") or _line(text, "no single change checked")
    return line.split(": ", 1)[1].split(", ") if line else []


def _apply(hint: str, cluster, training):
    """(cluster, training) with ``hint`` applied to the settings given."""
    union = {"full recompute": ("recompute_modes", "full"), "the 1f1b schedule": ("schedules", "1f1b"),
             "ZeRO over all replicas": ("zero_shard_degrees", "all")}
    for start, (field, value) in union.items():
        if hint.startswith(start):
            return cluster, training.model_copy(update={field: (*getattr(training, field), value)})
    patterns = {r"ZeRO-(\d) ": lambda m: {"zero_stages": (*training.zero_stages, int(m[1]))},
                r"--context-parallel ([\d,]+)": lambda m: {"context_parallel_degrees": tuple(map(int, m[1].split(",")))},
                r"--expert-parallel ([\d,]+)": lambda m: {"expert_parallel_degrees": tuple(map(int, m[1].split(",")))},
                r"tp up to (\d+)": lambda m: {"max_tp": int(m[1])},
                r"a global batch of (\d+)": lambda m: {"global_batch_size": int(m[1])},
                r"more than \d+ stages": lambda m: {"max_stages": None},
                r"any micro-batch size": lambda m: {"micro_batch_sizes": None}}
    for pattern, update in patterns.items():
        if m := re.search(pattern, hint):
            return cluster, training.model_copy(update=update(m))
    if hint.startswith("twice the nodes"):
        return _with_groups(cluster, lambda g: g.model_copy(update={"count": 2 * (g.count or 1)})), training
    m = re.match(r"GPUs with at least (\d+) GiB in place of the (\S+)", hint)
    assert m, f"a hint the test cannot apply: {hint}"
    gib, name = int(m[1]), m[2]
    return _with_groups(cluster, lambda g: g if g.gpu.name != name else g.model_copy(
        update={"gpu": g.gpu.model_copy(update={"memory_bytes": gib * 2**30})})), training


def _each_hint_gives_a_plan(text: str, cluster, model, training) -> list[str]:
    hints = _hints(text)
    for hint in hints:
        c, t = _apply(hint, cluster, training)
        assert api.plan(c, model, t, time_limit_s=TIME_LIMIT_S).plan is not None, hint
    return hints


T4X8 = {"gpu": "T4", "network": "25 Gbit/s"}
LLAMA_7B_FP16 = api.Training(global_batch_size=64, seq_len=2048, precision="fp16")


@pytest.mark.parametrize("zero_stages", [(0, 1), (3,)])
def test_states_over_every_gpu_leave_only_more_memory(zero_stages):
    """8 T4s hold 107.21 GiB after the workspace, llama2-7b's fp16 states need 125.52 GiB: no
    ZeRO stage, recompute or batch can fit it; the states' line alone says what would, and
    nothing is checked."""
    cluster = _cluster(1, T4X8["gpu"], network=T4X8["network"])
    text = _reason(cluster, "llama2-7b", LLAMA_7B_FP16.model_copy(update={"zero_stages": zero_stages}))
    assert "need 125.52 GiB even split" in text and "would fit: at least 10 GPUs of these types" in text
    assert "would fit" not in _line(text, "single blocks fit")
    assert not _hints(text) and "single change" not in text and "not decided" not in text


def test_one_replica_gets_no_zero_hint_and_the_state_line():
    """One GPU: ZeRO over one replica shards nothing, so it is not named; the states (6.8 TB
    of llama3-405b against 20.85 GiB) get their line, and the GPU type's line, though it gives
    the 57.17 GiB one block needs, offers no GPU size as the fix: 327 GPUs are what is short."""
    text = _reason(_cluster(1, "RTX4090-24GB", gpus_per_node=1), "llama3-405b",
                   api.Training(global_batch_size=8, seq_len=4096))
    assert "ZeRO-3" not in text and "allow ZeRO" not in text
    assert "need 6803.72 GiB even split" in text and "the 1 GPUs hold 20.85 GiB" in text
    assert "would fit: at least 327 GPUs" in text
    per_type = _line(text, "RTX4090-24GB")
    assert "needs 57.17 GiB per GPU" in per_type and "would fit" not in per_type
    assert "GPUs with more than" not in text and not _hints(text)


def test_a_gpu_the_workspace_fills_gets_no_zero_hint_nor_a_negative_count():
    text = _reason(_cluster(1, _gpu("0.001 GB"), gpus_per_node=2, network="1 bit/s"), "llama2-7b",
                   api.Training(global_batch_size=8, seq_len=2048))
    assert "ZeRO-3" not in text and "allow ZeRO" not in text
    assert "hold 0.00 GiB after the 1.50 GiB workspace each" in text
    assert "would fit: GPUs with more memory than the 1.50 GiB workspace" in text
    assert not re.search(r"at least -?\d+ GPUs", text)


def test_a_split_whose_states_need_sharding_names_the_lowest_stage_that_fits():
    """One stage of tp 4 leaves 8 replicas of llama2-13b on 32 RTX 3090s: ZeRO-2 is named (not
    ZeRO-3: the lowest stage that gives a plan), beside tp 8, no stage cap and twice the nodes;
    each gives a plan, a smaller batch does not."""
    cluster = _cluster(4, "RTX3090-24GB")
    training = api.Training(global_batch_size=64, seq_len=2048, max_stages=1, max_tp=4)
    text = _reason(cluster, "llama2-13b", training)
    assert _each_hint_gives_a_plan(text, cluster, "llama2-13b", training) == [
        "tp up to 8 (training.max_tp: 8)", "ZeRO-2 (--zero-stage 0,1,2)",
        "more than 1 stages (training.max_stages unset)", "twice the nodes (64 GPUs)"]
    assert "a smaller global batch" in _no_plan(text)


def test_hsdp_over_two_replicas_gets_no_zero_stage():
    """The same with ZeRO sharded over pairs of replicas (zero_shard_degrees 2): ZeRO-2 was
    named, priced as if over all replicas; over pairs neither ZeRO-2 nor ZeRO-3 gives a plan,
    nor sharding over all with ZeRO-1, and none is named."""
    cluster = _cluster(4, "RTX3090-24GB")
    training = api.Training(global_batch_size=64, seq_len=2048, max_stages=1, max_tp=4, zero_shard_degrees=(2,))
    text = _reason(cluster, "llama2-13b", training)
    assert _each_hint_gives_a_plan(text, cluster, "llama2-13b", training) == [
        "tp up to 8 (training.max_tp: 8)", "more than 1 stages (training.max_stages unset)"]
    assert {"ZeRO-2", "ZeRO-3", "ZeRO over all replicas"} <= set(_no_plan(text))


def test_a_block_whose_states_need_sharding_names_that_stage():
    """A 4-block model of hidden size 12288 on 64 GPUs of 12 GB, tp held to 1: one block with
    ZeRO-1 over the 64 replicas needs 12.79 GiB; ZeRO-2 and tp 8 each give a plan, 13 GiB GPUs
    (one block's need) do not."""
    wide = api.load_model({"name": "wide4", "num_layers": 4, "hidden_size": 12288, "num_attention_heads": 96,
                           "num_kv_heads": 96, "ffn_hidden_size": 49152, "mlp": "gelu", "vocab_size": 32000,
                           "tied_embeddings": True, "max_seq_len": 4096})
    cluster = _cluster(8, _gpu("12 GB"), network="100 Gbit/s")
    training = api.Training(global_batch_size=64, seq_len=2048, max_tp=1)
    text = _reason(cluster, wide, training)
    assert "needs 12.79 GiB per GPU" in _line(text, "G@")
    assert _each_hint_gives_a_plan(text, cluster, wide, training) == [
        "tp up to 8 (training.max_tp: 8)", "ZeRO-2 (--zero-stage 0,1,2)"]
    assert "G with 13 GiB" in _no_plan(text)


def test_a_stage_whose_split_cannot_hold_the_states_is_not_named_for_a_block():
    """llama2-70b on 320 GPUs of 6 GB, tp 1: ZeRO-3 would fit one block, but no split holds it
    (its gathered weights beside the shards), nor ZeRO-2: both are shown to give no plan, and
    nothing unchecked is named (tp 8 was, and gives none either)."""
    cluster = _cluster(40, _gpu("6 GB"), network="100 Gbit/s")
    training = api.Training(global_batch_size=256, seq_len=2048, max_tp=1)
    text = _reason(cluster, "llama2-70b", training)
    assert not _each_hint_gives_a_plan(text, cluster, "llama2-70b", training)
    assert {"ZeRO-2", "ZeRO-3"} <= set(_no_plan(text))


def test_activations_over_name_their_savers_and_a_smaller_batch_only_where_it_helps():
    """llama2-13b, 16,384-token sequences without recompute on 16 RTX 3090s: the states fit, the
    activations do not.  Full recompute, one sequence and twice the nodes each give a plan;
    context parallelism does not (tp 8 already divides the activations as far)."""
    cluster = _cluster(2, "RTX3090-24GB")
    training = api.Training(global_batch_size=64, seq_len=16384, recompute_modes=("none",))
    text = _reason(cluster, "llama2-13b", training)
    assert _each_hint_gives_a_plan(text, cluster, "llama2-13b", training) == [
        "full recompute (--recompute none,full)", "a global batch of 1 sequence (--global-batch-size 1)",
        "twice the nodes (32 GPUs)"]
    assert "context parallelism" in _no_plan(text)


def test_long_sequences_name_recompute_and_context_parallelism():
    """The review's regression: llama2-7b at 32,768 tokens, tp held to 2, no recompute, on 16
    A100-40GB.  The estimate fit (it left out the embedding, head and logits) and only more GPUs
    were named; full recompute, cp and tp 8 each give a plan, and are named."""
    cluster = _cluster(2, "A100-SXM4-40GB", network="100 Gbit/s")
    training = api.Training(global_batch_size=16, seq_len=32768, max_tp=2, recompute_modes=("none",))
    text = _reason(cluster, "llama2-7b", training)
    assert _each_hint_gives_a_plan(text, cluster, "llama2-7b", training) == [
        "full recompute (--recompute none,full)", "tp up to 8 (training.max_tp: 8)",
        "context parallelism (--context-parallel 1,2,4,8)"]
    assert {"ZeRO-2", "ZeRO-3", "a smaller global batch", "twice the nodes"} <= set(_no_plan(text))
    assert text == _reason(cluster, "llama2-7b", training)      # the checks count work, not seconds


@pytest.mark.parametrize("restriction, not_named", [
    ({"schedules": ("gpipe",)}, "full recompute"),           # GPipe holds every micro-batch
    ({"micro_batch_sizes": (4,)}, "a global batch"),         # four sequences a replica at least
])
def test_restricted_spaces_name_only_what_helps_there(restriction, not_named):
    """llama2-13b at 16,384 tokens on 16 RTX 3090s again, with GPipe alone or micro-batches of
    four: the hints priced as if 1F1B and one sequence a replica were allowed (full recompute,
    a smaller batch) give no plan there and are not named; what is named gives one."""
    cluster = _cluster(2, "RTX3090-24GB")
    training = api.Training(global_batch_size=64, seq_len=16384, recompute_modes=("none",), **restriction)
    text = _reason(cluster, "llama2-13b", training)
    hints = _each_hint_gives_a_plan(text, cluster, "llama2-13b", training)
    assert hints and not any(h.startswith(not_named) for h in hints)


def test_no_tp_hint_above_what_the_heads_allow():
    """gpt-neo-2.7b has 20 heads: no TP above 4 exists, so tp 8 is never named however tight."""
    cluster = _cluster(16, _gpu("2 GB"), network="100 Gbit/s")
    training = api.Training(global_batch_size=128, seq_len=16384, max_tp=4, recompute_modes=("none",))
    text = _reason(cluster, "gpt-neo-2.7b", training)
    assert "tp up to" not in text
    assert not _each_hint_gives_a_plan(text, cluster, "gpt-neo-2.7b", training)


@pytest.mark.parametrize("schedule, gbs, needle, near", [
    ("interleaved-1f1b", 11, "a micro-batch count that is a multiple of the stage count", "10 and 12"),
    ("dualpipev", 3, "at least 2 micro-batches per stage", "4")])
def test_no_tuple_at_all_names_the_schedule_rule_and_nearby_batches(schedule, gbs, needle, near):
    """A global batch the schedule's rules cannot split (11 sequences over interleaving's p | m
    on 8 GPUs; 3 for DualPipeV's m >= 2p) has no knob tuple at all: the reason is that rule,
    not memory, and the nearest batches named do give plans."""
    cluster = api.load_cluster("cluster_specs/tiny-2zone.yaml")
    training = {"global_batch_size": gbs, "seq_len": 512, "schedules": [schedule]}
    with pytest.raises(InfeasibleError) as err:
        api.plan(cluster, "opt-350m", training, time_limit_s=TIME_LIMIT_S)
    msg = str(err.value)
    assert needle in msg and f"near it that meet them: {near}" in msg and "memory" not in msg
    for g in map(int, near.split(" and ")):
        assert api.plan(cluster, "opt-350m", {**training, "global_batch_size": g}, time_limit_s=TIME_LIMIT_S).plans
