"""Fast checks of the reference runner: everything it refuses is refused before a process
starts, with exit 2 and the reason; rank map, model shrinking and schedules."""

from __future__ import annotations

import json
import subprocess

import pytest

from planner.cli.main import main
from planner.errors import InputError
from planner.launch import runner
from planner.plan import Plan

TINY = {"name": "tiny", "num_layers": 4, "hidden_size": 32, "num_attention_heads": 4, "vocab_size": 64}


def rep(tp, share, devices):
    return {"gpu_type": "cpu", "tp": tp, "micro_batch_share": share, "devices": list(devices)}


def make_plan(stages, mbs=4, nmb=2, schedule="1f1b", model=TINY, **extra) -> Plan:
    data = {"inputs": {"cluster": "local", "model": model,
                       "training": {"global_batch_size": mbs * nmb, "seq_len": 8}},
            "micro_batch_size": mbs, "num_micro_batches": nmb, "schedule": schedule,
            "stages": [{"index": i, "blocks": list(b), "embedding": i == 0, "head": i == len(stages) - 1,
                        "replicas": reps} for i, (b, reps) in enumerate(stages)]}
    data.update(extra)
    return Plan.from_json(data)


def two_stage(tp0=1, tp1=1, **kw):
    return make_plan([((0, 2), [rep(tp0, 4, [f"a:{i}" for i in range(tp0)])]),
                      ((2, 4), [rep(tp1, 4, [f"b:{i}" for i in range(tp1)])])], **kw)


@pytest.fixture
def no_spawn(monkeypatch):
    """Fail the test if the runner tries to start a process."""
    def boom(*a, **k):
        raise AssertionError("a process was started")
    monkeypatch.setattr(subprocess, "Popen", boom)


def test_tp_not_dividing_heads_is_refused(no_spawn):
    with pytest.raises(InputError, match=r"stage 1 replica 0: tp=3 does not divide the model's 4 attention heads"):
        runner.run_plan(two_stage(tp1=3))


def test_tp_not_dividing_shrunk_heads_is_refused(no_spawn):
    # 8 heads in the plan's model divide by tp=8; the override's 4 do not.
    plan = two_stage(tp0=8, model={**TINY, "hidden_size": 64, "num_attention_heads": 8})
    with pytest.raises(InputError, match="tp=8 does not divide the model's 4 attention heads"):
        runner.run_plan(plan, model_override={"hidden_size": 32, "num_attention_heads": 4})


def test_interleaved_knobs_are_checked(no_spawn):
    # 3 micro-batches over 2 stages, and 2 blocks per stage do not cut into 3 chunks.
    plan = two_stage(schedule="interleaved-1f1b", virtual_stages=3, nmb=3)
    with pytest.raises(InputError) as err:
        runner.run_plan(plan)
    assert "multiple of the number of stages" in str(err.value)
    assert "stages[0].blocks: 2 blocks do not split into virtual_stages=3 equal chunks" in str(err.value)
    with pytest.raises(InputError, match="virtual_stages=2 needs schedule \"interleaved-1f1b\""):
        runner.run_plan(two_stage(virtual_stages=2))


def test_interleaved_chunks_are_dealt_round_robin():
    plan = make_plan([((0, 4), [rep(1, 4, ["a:0"])]), ((4, 6), [rep(1, 4, ["b:0"])])],
                     model={**TINY, "num_layers": 6}, schedule="interleaved-1f1b", virtual_stages=2)
    assert [(c["stage"], c["chunk"], c["blocks"], c["embedding"], c["head"])
            for c in runner.model_chunks(plan)] == [
        (0, 0, [0, 2], True, False), (1, 0, [2, 3], False, False),
        (0, 1, [3, 5], False, False), (1, 1, [5, 6], False, True)]
    assert [c["blocks"] for c in runner.model_chunks(two_stage())] == [[0, 2], [2, 4]]


def test_bad_layout_lists_every_problem(no_spawn):
    plan = make_plan([((0, 1), [rep(1, 3, ["a:0"])]), ((2, 4), [rep(1, 4, ["a:0"])])],
                     model=TINY)
    with pytest.raises(InputError) as err:
        runner.run_plan(plan)
    text = str(err.value)
    assert "stage 1 should start at block 1, not 2" in text
    assert "stages[0].replicas: micro_batch_share of the replicas sums to 3, but micro_batch_size is 4" in text
    assert "device 'a:0' is used twice" in text


def test_too_many_processes_for_the_cpu(no_spawn, monkeypatch):
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 1)
    plan = make_plan([((0, 4), [rep(1, 1, [f"a:{i}"]) for i in range(5)])], mbs=5, nmb=1)
    with pytest.raises(InputError, match="5 devices, one process each, but this machine has 1 CPU cores"):
        runner.run_plan(plan)


def test_nccl_without_enough_gpus(no_spawn):
    torch = pytest.importorskip("torch")
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    plan = make_plan([((0, 4), [rep(1, 1, [f"a:{i}"]) for i in range(n + 1)])], mbs=n + 1, nmb=1)
    with pytest.raises(InputError, match=f"{n + 1} devices, one process and GPU each, but {n} CUDA"):
        runner.run_plan(plan, backend="nccl")


def test_full_size_model_that_cannot_fit_asks_for_tiny(no_spawn):
    big = {"name": "big", "num_layers": 4, "hidden_size": 16384, "num_attention_heads": 128,
           "vocab_size": 256000}
    plan = two_stage(model=big)
    with pytest.raises(InputError, match="--tiny"):
        runner.run_plan(plan)


def test_global_batch_must_match_inputs(no_spawn):
    plan = Plan.from_json({**json.loads(two_stage().dumps()),
                           "inputs": {"cluster": "local", "model": TINY,
                                      "training": {"global_batch_size": 7, "seq_len": 8}}})
    with pytest.raises(InputError, match="inputs.training.global_batch_size is 7"):
        runner.run_plan(plan)


def test_rank_map_is_node_major_in_first_appearance_order():
    plan = make_plan([((0, 2), [rep(2, 4, ["b:1", "b:0"])]),
                      ((2, 4), [rep(1, 2, ["a:0"]), rep(1, 2, ["b:2"])])])
    ranks = runner.rank_map(plan)
    assert [(r.rank, r.device, r.stage, r.replica, r.tp_rank) for r in ranks] == [
        (0, "b:0", 0, 0, 1), (1, "b:1", 0, 0, 0), (2, "b:2", 1, 1, 0), (3, "a:0", 1, 0, 0)]


def test_rank_map_agrees_with_plan_rankmap():
    rankmap = pytest.importorskip("planner.plan.rankmap")
    from planner.spec import cluster_from_dict

    cluster = cluster_from_dict({"name": "c", "nodes": [
        {"name": "a", "gpu": "A100-SXM4-80GB", "gpus_per_node": 4, "network_bandwidth": "100 Gbit/s"},
        {"name": "b", "gpu": "A100-SXM4-80GB", "gpus_per_node": 4, "network_bandwidth": "100 Gbit/s"}]})
    plan = make_plan([((0, 2), [rep(2, 4, ["b:1", "b:0"])]),
                      ((2, 4), [rep(1, 2, ["a:0"]), rep(1, 2, ["b:2"])])])
    ours = [(r.rank, r.device, r.stage, r.replica, r.tp_rank) for r in runner.rank_map(plan)]
    theirs = [(r.rank, r.device, r.stage, r.replica, r.tp_rank)
              for r in rankmap.build_launch(cluster, plan).ranks]
    assert ours == theirs


def test_plan_launch_ranks_are_used_and_checked():
    plan = two_stage()
    ranks = [{"rank": 0, "device": "b:0", "stage": 1, "replica": 0, "tp_rank": 0},
             {"rank": 1, "device": "a:0", "stage": 0, "replica": 0, "tp_rank": 0}]
    launch = {"nodes": [{"node": "b", "node_rank": 0, "nproc_per_node": 1},
                        {"node": "a", "node_rank": 1, "nproc_per_node": 1}], "ranks": ranks}
    with_launch = Plan.from_json({**plan.to_json(), "launch": launch})
    assert [r.device for r in runner.rank_map(with_launch)] == ["b:0", "a:0"]
    ranks[0]["stage"] = 0
    broken = Plan.from_json({**plan.to_json(), "launch": launch})
    with pytest.raises(InputError, match="plan.launch.ranks"):
        runner.rank_map(broken)


def test_tiny_override_keeps_blocks_and_tp_validity():
    model = {"name": "m", "num_layers": 6, "hidden_size": 1024, "num_attention_heads": 16,
             "num_kv_heads": 4, "vocab_size": 32000, "mlp": "swiglu"}
    plan = make_plan([((0, 6), [rep(1, 4, ["a:0"])])], model=model)
    shape = runner.model_shape(plan, runner.TINY_MODEL, runner.TINY_SEQ_LEN)
    assert shape == {"num_layers": 6, "hidden_size": 64, "num_heads": 8, "num_kv_heads": 4,
                     "ffn_size": 256, "vocab_size": 128, "seq_len": 16, "mlp": "swiglu",
                     "tied_embeddings": False}
    with pytest.raises(InputError, match="num_layers must stay"):
        runner.model_shape(plan, {"num_layers": 2})


def test_overlaps_cut_a_micro_batch_between_replicas():
    p2p = pytest.importorskip("planner.launch.p2p")
    nxt = [{"offset": 0, "share": 3}, {"offset": 3, "share": 1}]
    assert p2p.overlaps(0, 2, nxt) == [(0, 0, 2)]
    assert p2p.overlaps(2, 4, nxt) == [(0, 2, 3), (1, 3, 4)]


def test_cli_bad_plan_exits_2(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(two_stage(tp1=3).dumps())
    assert main(["run", str(path)]) == 2
    assert "tp=3 does not divide" in capsys.readouterr().err
    path.write_text("{not json")
    assert main(["run", str(path)]) == 2


def test_chunks_agree_with_the_launchers():
    common = pytest.importorskip("planner.launch.common")
    for v, sched in ((1, "1f1b"), (2, "interleaved-1f1b")):
        plan = make_plan([((0, 4), [rep(1, 4, ["a:0"])]), ((4, 6), [rep(1, 4, ["b:0"])])],
                         model={**TINY, "num_layers": 6}, schedule=sched, virtual_stages=v)
        ours = [(c["stage"], c["chunk"], *c["blocks"], c["embedding"], c["head"])
                for c in runner.model_chunks(plan)]
        theirs = [(c.stage, c.chunk, c.first, c.last, c.embedding, c.head)
                  for c in common.chunks(plan, "pipelining")]
        assert ours == theirs


def test_importing_the_runner_and_cli_does_not_import_torch():
    code = ("import sys, planner.launch.runner, planner.cli.run, planner.cli.main; "
            "print('torch' in sys.modules)")
    out = subprocess.run([__import__("sys").executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_zero_with_mixed_tp_in_a_stage_is_refused(no_spawn):
    """The runner shards a stage's parameters shard by shard over replicas of one tp."""
    plan = make_plan([((0, 4), [rep(2, 2, ["a:0", "a:1"]), rep(1, 2, ["a:2"])])], zero_stage=2)
    with pytest.raises(InputError, match="zero_stage: 2 with replicas of different tp in stage 0"):
        runner.run_plan(plan, steps=1)
    same = make_plan([((0, 4), [rep(1, 2, ["a:0"]), rep(1, 2, ["a:1"])])], zero_stage=3)
    runner.check_plan(same, runner.model_shape(same))  # one tp per stage: accepted
