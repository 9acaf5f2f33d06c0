"""ZB-V and DualPipeV plans end to end on the cost side: pipeline time from the action-list
executor (hand-checked sends on the V), the head on rank 0, memory, simulate and the CLI."""

from __future__ import annotations

import json

import pytest
from test_simulate import SPECS, _plan_file  # the simulate tests' plan file, one copy

from planner.cost.schedule import StageTiming, bottleneck_stage, pipeline_breakdown, pipeline_time_s

pytest.importorskip("planner.cost")


def test_v_time_at_unit_chunk_times():
    # per rank f = 2, b = 4 with w = 2: each chunk F = I = W = 1
    for p, m in ((1, 3), (2, 4), (4, 8), (4, 3), (3, 12)):
        stages = [StageTiming(forward_s=2, backward_s=4, backward_weight_s=2)] * p
        assert pipeline_time_s(stages, m, "zb-v", 2) == 6 * m + max(p - 1, 4 * p - 2 * m - 2)
        if m >= 2 * p:
            assert pipeline_time_s(stages, m, "dualpipev", 2) == 6 * m + p - 1


def test_v_sends_hand_computed():
    # p = 2, m = 1, chunk F = I = W = 1, every cross-rank send 0.5 and blocking.  Path:
    # F0 (r0) [0,1] send [1,1.5]; F1, F2 on r1 [1.5,3.5] (1 -> 2 stays on the rank), send [3.5,4];
    # F3 (r0) [4,5], I3 [5,6], send [6,6.5]; I2 (r1) [6.5,7.5], W2 [7.5,8.5] (ZB-V runs a
    # chunk-1 W right after its I), I1 [8.5,9.5], send [9.5,10]; I0 (r0) [10,11], W0 [11,12].
    # Stage 2's activation and stage 3's gradient go over the 0-1 link that rank 1's
    # send_backward_s and rank 0's send_forward_s price (without that swap: 11).
    stages = [StageTiming(forward_s=2, backward_s=4, backward_weight_s=2, send_forward_s=0.5),
              StageTiming(forward_s=2, backward_s=4, backward_weight_s=2, send_backward_s=0.5)]
    assert pipeline_time_s(stages, 1, "zb-v", 2) == pytest.approx(12)
    # each boundary twice each way per micro-batch, as interleaving with v = 2
    assert bottleneck_stage(stages, "zb-v", 2) == 0
    parts = pipeline_breakdown(stages, 4, "zb-v", 2)
    assert parts["pp_comm"] == pytest.approx(4 * 2 * 0.5)
    assert sum(parts.values()) == pytest.approx(pipeline_time_s(stages, 4, "zb-v", 2))


def test_v_beats_zb_h1_and_1f1b_on_equal_stages_with_sends():
    st = [StageTiming(forward_s=1, backward_s=2, backward_weight_s=1, send_forward_s=0.05 if i < 3 else 0,
                      send_backward_s=0.05 if i else 0) for i in range(4)]
    one = pipeline_time_s(st, 8, "1f1b")
    zb = pipeline_time_s(st, 8, "zb-h1")
    for name in ("zb-v", "dualpipev"):
        assert pipeline_time_s(st, 8, name, 2) < zb < one


def _sim(tmp_path, schedule, **changes):
    from planner.plan.check import load_plan
    from planner.simulate import simulate_plan
    from planner.spec import load_cluster

    v = 2 if schedule in ("zb-v", "dualpipev") else 1
    sub = tmp_path / schedule
    sub.mkdir(exist_ok=True)
    cluster = load_cluster(SPECS / "tiny-mixed.yaml")
    return simulate_plan(cluster, load_plan(_plan_file(sub, schedule=schedule, virtual_stages=v, **changes)))


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipev"])
def test_evaluate_and_simulate_agree_exactly(tmp_path, schedule):
    from planner.cost.memory import in_flight_micro_batches
    from planner.simulate.plan import plan_execution

    sim = _sim(tmp_path, schedule)
    ev = sim.evaluation
    assert sim.simulated_pipeline_s == pytest.approx(sim.closed_form_pipeline_s, rel=1e-12)
    assert plan_execution(sim).makespan_s == pytest.approx(sim.simulated_pipeline_s, rel=1e-12)
    assert all(0 < s.backward_weight_s < s.backward_s for s in ev.stages)
    out = sim.to_json()
    assert out["schedule"] == schedule and out["virtual_stages"] == 2
    assert sorted({e["kind"] for e in out["timeline"]}) == ["bwd", "fwd", "wgt"]
    # every (chunk, micro-batch) once forward, and a backward as B or as I + W
    fwd = {(e["stage"], e["chunk"], e["micro_batch"]) for e in out["timeline"] if e["kind"] == "fwd"}
    assert len(fwd) == 2 * 2 * 8
    # the executor's peak (chunk micro-batches) is twice the memory model's whole-stage count
    assert [c / 2 for c in sim.result.max_in_flight] == [in_flight_micro_batches(schedule, 2, s, 8, 2)
                                                         for s in range(2)]
    # faster than 1F1B and ZB-H1 on the same placement
    assert sim.closed_form_pipeline_s < _sim(tmp_path, "zb-h1").closed_form_pipeline_s
    assert sim.closed_form_pipeline_s < _sim(tmp_path, "1f1b").closed_form_pipeline_s


def test_v_prices_the_head_on_rank_0(tmp_path):
    # In the V the head is rank 0's second chunk: rank 0 gets the head's time and logits, the
    # last rank loses them (the same placement under zb-h1 keeps the head on the last stage).
    v = _sim(tmp_path, "zb-v").evaluation
    h1 = _sim(tmp_path, "zb-h1").evaluation
    assert v.stages[0].forward_s > h1.stages[0].forward_s
    assert v.stages[1].forward_s < h1.stages[1].forward_s
    assert v.stages[0].forward_s + v.stages[1].forward_s == pytest.approx(
        h1.stages[0].forward_s + h1.stages[1].forward_s, rel=1e-9)
    # 12 blocks each; rank 1 holds min(4, 8 + 1 + 1, 16) / 2 = 2 micro-batches without logits,
    # rank 0 2 with them, where zb-h1's rank 1 holds 2 with logits
    assert v.memory_by_replica[1][0].activations_bytes < h1.memory_by_replica[1][0].activations_bytes
    assert v.memory_by_replica[0][0].activations_bytes > h1.memory_by_replica[0][0].activations_bytes


def test_cli_evaluate_and_simulate(tmp_path):
    pytest.importorskip("matplotlib")
    from click.testing import CliRunner

    from planner.cli.main import cli

    runner = CliRunner()
    for schedule in ("zb-v", "dualpipev"):
        sub = tmp_path / schedule
        sub.mkdir()
        plan = _plan_file(sub, schedule=schedule, virtual_stages=2)
        res = runner.invoke(cli, ["simulate", str(SPECS / "tiny-mixed.yaml"), str(plan), "--width", "40",
                                  "--timeline", str(sub / "t.png")])
        assert res.exit_code == 0, res.output
        assert schedule in res.output and "weight gradient" in res.output and "2 virtual stages" in res.output
        assert (sub / "t.png").read_bytes()[:4] == b"\x89PNG"
        res = runner.invoke(cli, ["evaluate", str(SPECS / "tiny-mixed.yaml"), str(plan), "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["iteration_time_s"] > 0
        res = runner.invoke(cli, ["evaluate", str(SPECS / "tiny-mixed.yaml"), str(plan)])
        assert res.exit_code == 0, res.output


def test_cli_bad_v_knob_is_exit_2(tmp_path, capsys):
    from planner.cli.main import main

    plan = _plan_file(tmp_path, schedule="dualpipev", virtual_stages=2, num_micro_batches=2,
                      micro_batch_size=16, stages=_stages_with_share(16))
    assert main(["evaluate", str(SPECS / "tiny-mixed.yaml"), str(plan)]) == 2
    err = capsys.readouterr().err
    assert "num_micro_batches" in err and "dualpipev needs num_micro_batches >= 2 x stages = 4" in err
    assert "Traceback" not in err


def _stages_with_share(share: int) -> list[dict]:
    return [{"index": i, "blocks": [12 * i, 12 * i + 12], "embedding": i == 0, "head": i == 1, "replicas": [
        {"gpu_type": "A100-SXM4-80GB", "tp": 2, "micro_batch_share": share,
         "devices": [f"a100:{2 * i}", f"a100:{2 * i + 1}"]}]} for i in range(2)]
