"""Plans a format cannot express are refused with the stage and the feature named; bad
options and inconsistent plans are input errors (exit 2), never a traceback."""

from __future__ import annotations

import pytest
from test_launch_formats import chain_plan, make_plan, rep

from planner.errors import InputError, InputErrors
from planner.launch import render
from planner.plan import Plan


def refusal(plan, fmt, **kw) -> str:
    kw.setdefault("master_addr", "h")
    with pytest.raises(InputError) as exc:
        render(plan, fmt, **kw)
    return str(exc.value)


UNEVEN_COUNT = [[rep(["a:0", "a:1"]), rep(["a:2", "a:3"])],
                [rep(["b:0", "b:1"], 1), rep(["b:2", "b:3"], 2), rep(["b:4", "b:5"], 1)]]


@pytest.mark.parametrize("fmt,tool", [("megatron", "Megatron-LM"), ("deepspeed", "DeepSpeed")])
def test_uneven_replica_counts_refused(fmt, tool):
    msg = refusal(make_plan(UNEVEN_COUNT), fmt)
    assert (f"stage 1 has 3 replicas, stage 0 has 2: {tool} needs the same data-parallel size "
            "on every stage") in msg
    assert f"launch --format {fmt}" in msg


@pytest.mark.parametrize("fmt,tool", [("megatron", "Megatron-LM"), ("deepspeed", "DeepSpeed")])
def test_uneven_shares_refused(fmt, tool):
    plan = make_plan([[rep(["a:0", "a:1"], 3), rep(["a:2", "a:3"], 1)],
                      [rep(["b:0", "b:1"], 3), rep(["b:2", "b:3"], 1)]])
    msg = refusal(plan, fmt)
    assert "stage 0 splits each micro-batch unevenly between its replicas (shares [3, 1])" in msg
    assert "stage 1 splits" in msg  # every offending stage is reported, not just the first
    assert tool in msg


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed", "pipelining"])
def test_mixed_tp_refused(fmt):
    plan = make_plan([[rep(["a:0", "a:1"]), rep(["a:2", "a:3"])],
                      [rep(["b:0", "b:1", "b:2", "b:3"]), rep(["b:4", "b:5", "b:6", "b:7"])]])
    msg = refusal(plan, fmt)
    # one line per stage, however many replicas differ (pipelining gave one per replica, 12
    # lines and "... 20 more problems" on a real plan, until a review)
    assert "stage 1 replica 0 (and 1 more of its replicas) has tp 4, stage 0 replica 0 has tp 2" in msg
    assert msg.count("has tp 4") == 1


def test_several_problems_come_together():
    plan = make_plan([[rep(["a:0", "a:1"], 3), rep(["a:2", "a:3"], 1)],
                      [rep(["b:0", "b:1", "b:2", "b:3"], 4)]])
    with pytest.raises(InputErrors) as exc:
        render(plan, "megatron", master_addr="h")
    assert len(exc.value.errors) == 3  # replica count, tp, shares


def test_pipelining_refuses_what_stock_schedules_cannot_run():
    msg = refusal(make_plan(UNEVEN_COUNT), "pipelining")
    assert "stage 1 has 3 replicas, stage 0 has 2" in msg and "one pipeline per replica chain" in msg
    swapped = make_plan([[rep(["a:0", "a:1"], 3), rep(["a:2", "a:3"], 1)],
                         [rep(["b:0", "b:1"], 1), rep(["b:2", "b:3"], 3)]])
    msg = refusal(swapped, "pipelining")
    assert "stage 1 replica 0 takes 1 sequences per micro-batch, stage 0 replica 0 takes 3" in msg
    odd = make_plan(blocks=((0, 4), (4, 8)), schedule="interleaved-1f1b", virtual_stages=2,
                    num_micro_batches=5)
    # refused by the layout rule every format shares (stricter than ScheduleInterleaved1F1B's)
    assert "multiple of the number of stages" in refusal(odd, "pipelining")


def test_deepspeed_refuses_interleaving_and_selective_recompute():
    plan = make_plan(blocks=((0, 4), (4, 8)), schedule="interleaved-1f1b", virtual_stages=2,
                     recompute="selective")
    with pytest.raises(InputErrors) as exc:
        render(plan, "deepspeed", master_addr="h")
    text = str(exc.value)
    assert "interleaved-1f1b with 2 virtual stages" in text and "recompute selective" in text


def test_interleaving_needs_divisible_stages_and_micro_batches():
    plan = make_plan(blocks=((0, 3), (3, 8)), schedule="interleaved-1f1b", virtual_stages=2)
    for fmt in ("megatron", "pipelining"):
        assert "3 blocks do not split into virtual_stages=2 equal chunks" in refusal(plan, fmt)
    odd = make_plan(blocks=((0, 4), (4, 8)), schedule="interleaved-1f1b", virtual_stages=2,
                    num_micro_batches=5)
    assert "multiple of the number of stages (2)" in refusal(odd, "megatron")


@pytest.mark.parametrize("fmt,tool", [("megatron", "Megatron-LM"), ("deepspeed", "DeepSpeed")])
def test_zb_h1_refused_by_megatron_and_deepspeed(fmt, tool):
    msg = refusal(make_plan(blocks=((0, 4), (4, 8)), schedule="zb-h1"), fmt)
    assert "schedule zb-h1: " + tool in msg and "no zero-bubble schedule" in msg
    assert "re-plan with schedule 1f1b" in msg and "--format pipelining" in msg


@pytest.mark.parametrize("fmt,tool", [("megatron", "Megatron-LM"), ("deepspeed", "DeepSpeed")])
@pytest.mark.parametrize("schedule,cls", [("zb-v", "ScheduleZBVZeroBubble"), ("dualpipev", "ScheduleDualPipeV")])
def test_v_schedules_refused_by_megatron_and_deepspeed(fmt, tool, schedule, cls):
    msg = refusal(make_plan(blocks=((0, 4), (4, 8)), schedule=schedule, virtual_stages=2), fmt)
    assert f"schedule {schedule}: {tool}" in msg and "V" in msg and "each backward whole" in msg
    assert "re-plan with schedule 1f1b" in msg and f"--format pipelining (torch's {cls})" in msg


def test_zb_h1_micro_batches_torch_can_split_into_rounds():
    # ScheduleInterleavedZeroBubble: rounds = max(1, m // p), m a multiple of the rounds
    odd = make_plan(blocks=((0, 4), (4, 8)), schedule="zb-h1", num_micro_batches=5)
    assert "multiple of its rounds, max(1, 5 // 2) = 2" in refusal(odd, "pipelining")
    for m in (1, 2, 4, 6):
        assert render(make_plan(blocks=((0, 4), (4, 8)), schedule="zb-h1", num_micro_batches=m),
                      "pipelining", master_addr="h")


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed"])
def test_nodes_without_a_contiguous_rank_block_refused(fmt):
    # Node a holds stage 0 replica 0 and stage 1 replica 1: no framework numbering gives a a block.
    plan = make_plan([[rep(["a:0", "a:1"]), rep(["b:0", "b:1"])],
                      [rep(["b:2", "b:3"]), rep(["a:2", "a:3"])]])
    msg = refusal(plan, fmt)
    assert "contiguous block" in msg and "stage 1 replica 1 on a" in msg
    assert render(plan, "torchrun", master_addr="h")  # torchrun's own map has no such rule


def test_master_address_and_port():
    plan = make_plan()
    for fmt in ("torchrun", "megatron", "deepspeed", "pipelining"):
        msg = refusal(plan, fmt, master_addr=None)
        assert "--master-addr is required" in msg and "'a'" in msg
    assert "not a host name" in refusal(plan, "torchrun", master_addr="10.0.0.1; rm -rf /")
    assert "1..65535" in refusal(plan, "torchrun", master_port=70000)
    assert render(plan, "torchrun", master_addr="[fd00::1]")


def test_unknown_format_and_inconsistent_plans():
    assert "choose one of torchrun, megatron, deepspeed, pipelining" in refusal(make_plan(), "slurm")
    inconsistent = make_plan(inputs={"cluster": "t", "model": make_plan().inputs.model,
                                     "training": {"global_batch_size": 100, "seq_len": 2048}})
    assert "= 4 * 16 = 64, but inputs.training.global_batch_size is 100" in refusal(inconsistent, "megatron")
    bad_blocks = make_plan(blocks=((0, 3), (4, 8)))
    assert "stage 1 should start at block 3, not 4" in refusal(bad_blocks, "torchrun")
    launch = {"nodes": [{"node": "a", "node_rank": 0, "nproc_per_node": 4},
                        {"node": "b", "node_rank": 1, "nproc_per_node": 4}],
              "ranks": [{"rank": i, "device": d, "stage": i // 4, "replica": (i // 2) % 2, "tp_rank": i % 2}
                        for i, d in enumerate(["a:0", "a:1", "a:2", "a:3", "b:0", "b:1", "b:3", "b:2"])]}
    edited = Plan.from_json({**make_plan().to_json(), "launch": launch})
    assert "plan.launch.ranks[6] puts stage 1 replica 1 tp rank 0 on b:3" in refusal(edited, "torchrun")
    model = make_plan(inputs={"cluster": "t", "model": {"name": "x", "num_layers": 12, "hidden_size": 64,
                                                        "num_attention_heads": 4, "vocab_size": 100},
                              "training": {"global_batch_size": 64, "seq_len": 128}})
    assert "the stages must cover blocks [0, 12) of x; they end at 8" in refusal(model, "megatron")


def test_cluster_must_hold_the_plans_devices():
    from planner.spec import cluster_from_dict

    small = cluster_from_dict({"name": "t", "nodes": [
        {"name": "a", "gpu": "A100-SXM4-80GB", "gpus_per_node": 2, "network_bandwidth": "100 Gbit/s"},
        {"name": "b", "gpu": "A100-SXM4-80GB", "gpus_per_node": 4, "network_bandwidth": "100 Gbit/s"}]})
    assert "a has 2 GPUs" in refusal(make_plan(), "torchrun", cluster=small)
    assert "chain" not in refusal(chain_plan(), "torchrun", cluster=small)


def test_every_device_the_cluster_lacks_is_listed_at_once():
    from planner.spec import cluster_from_dict

    only_a = cluster_from_dict({"name": "t", "nodes": [
        {"name": "a", "gpu": "A100-SXM4-80GB", "gpus_per_node": 2, "network_bandwidth": "100 Gbit/s"}]})
    msg = refusal(make_plan(), "torchrun", cluster=only_a)
    assert "uses a:2, but a has 2 GPUs" in msg and "uses a:3, but a has 2 GPUs" in msg
    assert "uses b:0, but the cluster has no node 'b'" in msg and "uses b:3, but the cluster has no node 'b'" in msg


@pytest.mark.parametrize("fmt", ["pipelining", "torchtitan"])
def test_1f1b_with_fewer_micro_batches_than_stages_goes_through_the_lists(fmt):
    # Schedule1F1B.__init__ refuses n_microbatches < stages; Megatron and DeepSpeed run such a
    # plan, and the search may return one, so torch's launch names the rule and the CSV route
    four = [[rep(["a:0", "a:1"])], [rep(["a:2", "a:3"])], [rep(["b:0", "b:1"])], [rep(["b:2", "b:3"])]]
    few = make_plan(four, blocks=((0, 2), (2, 4), (4, 6), (6, 8)), schedule="1f1b", num_micro_batches=2)
    msg = refusal(few, fmt)
    assert "Schedule1F1B needs at least as many micro-batches as stages" in msg and "--schedule-csv" in msg
    files = render(few, fmt, master_addr="h", schedule_csv=True)
    rows = files["pipeline_schedule.csv"].strip().splitlines()
    assert len(rows) == 4 and all(row.count("F") == 2 and row.count("B") == 2 for row in rows)
    enough = make_plan(four, blocks=((0, 2), (2, 4), (4, 6), (6, 8)), schedule="1f1b", num_micro_batches=4)
    assert render(enough, fmt, master_addr="h")


