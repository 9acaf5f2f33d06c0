"""The reference runner against a single-process run on the same data: after 3 steps the loss
and every parameter agree to 1e-5 (float64), for plans with uneven blocks, a stage with more
replicas than its neighbour, uneven shares, TP 2, mixed TP inside a stage, 1F1B, GPipe,
interleaved 1F1B, tied and untied embeddings.

One launch per plan (module-scoped fixtures): starting torch processes costs seconds each.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.cli.main import main
from planner.launch import runner
from planner.plan import Plan

pytestmark = pytest.mark.slow

STEPS = 3
TOL = 1e-5


def rep(tp, share, devices):
    return {"gpu_type": "cpu", "tp": tp, "micro_batch_share": share, "devices": list(devices)}


def make_plan(model, stages, mbs, nmb, schedule, virtual_stages=1) -> Plan:
    return Plan.from_json({
        "inputs": {"cluster": "local", "model": model,
                   "training": {"global_batch_size": mbs * nmb, "seq_len": 8}},
        "micro_batch_size": mbs, "num_micro_batches": nmb, "schedule": schedule,
        "virtual_stages": virtual_stages,
        "stages": [{"index": i, "blocks": list(b), "embedding": i == 0, "head": i == len(stages) - 1,
                    "replicas": reps} for i, (b, reps) in enumerate(stages)]})


# Tied embeddings: the last stage's copy of the embedding must get the first stage's gradient.
GELU = {"name": "tiny-gelu", "num_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
        "vocab_size": 64, "tied_embeddings": True}
SWIGLU_GQA = {"name": "tiny-swiglu", "num_layers": 4, "hidden_size": 32, "num_attention_heads": 4,
              "num_kv_heads": 2, "ffn_hidden_size": 48, "mlp": "swiglu", "vocab_size": 64}

# 6 processes, 1F1B: stage 0 holds 1 block in 3 replicas of tp 1 (shares 2, 1, 1); stage 1 holds
# 3 blocks in 2 replicas, one of tp 2 (share 3) and one of tp 1 (share 1). Sample 2 of each
# micro-batch crosses from stage-0 replica 1 to stage-1 replica 0, sample 3 from replica 2 to 1.
PLAN_6 = make_plan(GELU, [
    ((0, 1), [rep(1, 2, ["n0:0"]), rep(1, 1, ["n0:1"]), rep(1, 1, ["n0:2"])]),
    ((1, 4), [rep(2, 3, ["n1:0", "n1:1"]), rep(1, 1, ["n1:2"])]),
], mbs=4, nmb=3, schedule="1f1b")

# 6 processes, GPipe over 3 stages: blocks 0-1 in two tp-2 replicas (the same-tp gradient
# path), then 2 blocks, then the head alone; swiglu and grouped-query attention (one kv head
# per tp rank).
PLAN_6G = make_plan(SWIGLU_GQA, [
    ((0, 2), [rep(2, 1, ["g:0", "g:1"]), rep(2, 1, ["g:4", "g:5"])]),
    ((2, 4), [rep(1, 2, ["g:2"])]),
    ((4, 4), [rep(1, 2, ["g:3"])]),
], mbs=2, nmb=3, schedule="gpipe")


# 4 processes, interleaved 1F1B with 2 chunks per stage (stage 0 runs blocks 0 and 2, stage 1
# blocks 1 and 3; the last chunk of stage 1 wraps to stage 0): 2 replicas with shares 2 and 1
# feeding, and fed back by, one tp-2 replica.
PLAN_4I = make_plan(GELU, [
    ((0, 2), [rep(1, 2, ["i:0"]), rep(1, 1, ["i:1"])]),
    ((2, 4), [rep(2, 3, ["i:2", "i:3"])]),
], mbs=3, nmb=4, schedule="interleaved-1f1b", virtual_stages=2)


def _reference(plan: Plan):
    from planner.launch import tiny_model as tm

    shape = tm.Shape(**runner.model_shape(plan))
    gb = plan.micro_batch_size * plan.num_micro_batches
    return tm.reference_run(shape, gb, STEPS, seed=0, dtype="float64")


def _run(plan: Plan):
    seen = []
    result = runner.run_plan(plan, steps=STEPS, dtype="float64", return_params=True,
                             on_step=lambda *a: seen.append(a))
    # Live progress reports the same numbers as the result, once per step, in order.
    assert seen == list(zip(range(STEPS), result.losses, result.step_time_s))
    return result, _reference(plan)


@pytest.fixture(scope="module")
def run6():
    return _run(PLAN_6)


@pytest.fixture(scope="module")
def run6g():
    return _run(PLAN_6G)


@pytest.fixture(scope="module")
def run4i():
    return _run(PLAN_4I)


@pytest.mark.parametrize("name", ["run6", "run6g", "run4i"])
def test_matches_single_process_reference(name, request):
    assert_matches_reference(*request.getfixturevalue(name))


def assert_matches_reference(result, reference):
    """Loss and every parameter within TOL of the single-process run, and both moved."""
    ref_losses, ref_params = reference
    assert len(result.losses) == STEPS and len(result.step_time_s) == STEPS
    assert all(t > 0 for t in result.step_time_s)
    np.testing.assert_allclose(result.losses, ref_losses, rtol=0, atol=TOL)
    # The loss must move, or a runner that never updates would pass.
    assert abs(ref_losses[-1] - ref_losses[0]) > 1e-4
    assert sorted(result.params) == sorted(ref_params)
    for key, want in ref_params.items():
        got = result.params[key]
        assert got.shape == want.shape, key
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL, err_msg=key)
    # The parameters did move from their initial values.
    from planner.launch import tiny_model as tm
    init = tm.init_full("blocks.0.attn.q.weight", ref_params["blocks.0.attn.q.weight"].shape, 0,
                        tm.torch_dtype("float64")).numpy()
    assert np.abs(result.params["blocks.0.attn.q.weight"] - init).max() > 1e-4
    assert result.replica_max_abs_diff <= TOL


def test_run_reports_layout(run6, run6g):
    result6, _ = run6
    assert result6.world_size == 6
    assert [(r.stage, r.replica, r.tp_rank) for r in result6.ranks] == [
        (0, 0, 0), (0, 1, 0), (0, 2, 0), (1, 0, 0), (1, 0, 1), (1, 1, 0)]
    assert run6g[0].world_size == 6


def test_crashed_rank_stops_the_others_and_is_named(monkeypatch, tmp_path, capsys):
    plan = make_plan(GELU, [((0, 2), [rep(1, 1, ["a:0"])]), ((2, 4), [rep(1, 1, ["a:1"])])],
                     mbs=1, nmb=2, schedule="1f1b")
    path = tmp_path / "plan.json"
    path.write_text(plan.dumps())
    monkeypatch.setenv("PLANNER_RUNNER_FAIL_RANK", "1")
    # Rank 0 would wait in its collectives for the 120 s timeout; the runner must stop it first.
    assert main(["run", str(path), "--steps", "2", "--timeout", "90"]) == 1
    err = capsys.readouterr().err
    assert "rank 1 (stage 1, replica 0, tp rank 0, device a:1) failed" in err
    assert "RuntimeError: injected failure on rank 1" in err


def test_cli_json(tmp_path, capsys):
    plan = make_plan({**GELU, "hidden_size": 256, "num_attention_heads": 16},
                     [((0, 3), [rep(1, 1, ["a:0"])]), ((3, 4), [rep(1, 1, ["a:1"])])],
                     mbs=1, nmb=2, schedule="gpipe")
    path = tmp_path / "plan.json"
    path.write_text(plan.dumps())
    assert main(["run", str(path), "--steps", "2", "--tiny", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "step 1: loss" in captured.err  # progress goes to stderr when stdout carries JSON
    assert out["world_size"] == 2 and len(out["losses"]) == 2 and len(out["step_time_s"]) == 2
    # --tiny keeps the blocks but shrinks the vocabulary to 128: the first loss is near ln(128).
    assert abs(out["losses"][0] - np.log(128)) < 0.5
    assert len(out["param_digest"]) == 64


def test_taken_port_is_retried_once(monkeypatch):
    import socket

    plan = make_plan(GELU, [((0, 2), [rep(1, 1, ["a:0"])]), ((2, 4), [rep(1, 1, ["a:1"])])],
                     mbs=1, nmb=1, schedule="1f1b")
    with socket.socket() as busy:  # a port someone else holds, handed out as "free"
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        free = runner._free_port
        handed = iter([taken])
        monkeypatch.setattr(runner, "_free_port", lambda: next(handed, None) or free())
        ports = []
        launch = runner._launch
        monkeypatch.setattr(runner, "_launch", lambda cfg, *a: (ports.append(cfg["port"]), launch(cfg, *a))[1])
        result = runner.run_plan(plan, steps=1)
    assert ports[0] == taken and ports[1] != taken and len(ports) == 2
    assert len(result.losses) == 1


def test_solver_plan_runs_and_matches_reference():
    """End to end: what `planner plan` writes for this machine's 4-process pseudo cluster runs
    as-is and trains the same numbers as one process (sequence shortened to keep it quick)."""
    from pathlib import Path

    from planner import api

    root = Path(__file__).resolve().parents[1]
    cluster = api.load_cluster(root / "cluster_specs" / "cpu-local-4.yaml")
    model = api.load_model(root / "profiles" / "models" / "cpu-small.yaml")
    training = api.Training(global_batch_size=8, seq_len=128)
    plan = Plan.from_json(api.plan(cluster, model, training, time_limit_s=30).plan.to_json())
    result = runner.run_plan(plan, steps=2, seq_len=16, dtype="float64", return_params=True)
    from planner.launch import tiny_model as tm

    shape = tm.Shape(**runner.model_shape(plan, seq_len=16))
    ref_losses, ref_params = tm.reference_run(shape, 8, 2, dtype="float64")
    np.testing.assert_allclose(result.losses, ref_losses, rtol=0, atol=TOL)
    for key, want in ref_params.items():
        np.testing.assert_allclose(result.params[key], want, rtol=0, atol=TOL, err_msg=key)
