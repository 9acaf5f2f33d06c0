"""The event-driven pipeline simulator against hand-computed schedules."""

from __future__ import annotations

import random
from itertools import pairwise
from types import SimpleNamespace

import pytest

from planner.simulate import SimStage, simulate_pipeline, stage_orders


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p,m", [(1, 1), (1, 5), (2, 1), (2, 4), (3, 7), (4, 4), (4, 16), (8, 3)])
def test_equal_stages_free_sends_match_textbook(schedule, p, m):
    f, b = 1.5, 3.0
    res = simulate_pipeline([SimStage(f, b)] * p, m, schedule)
    assert res.makespan_s == pytest.approx((m + p - 1) * (f + b))
    assert res.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_unequal_stages_hand_computed():
    # Stage 0: f=1 b=2; stage 1: f=2 b=4; two micro-batches.
    #   1F1B stage 1: F0 [1,3] B0 [3,7] F1 [7,9] B1 [9,13]; stage 0: B0 [7,9] B1 [13,15].
    stages = [SimStage(1, 2), SimStage(2, 4)]
    one = simulate_pipeline(stages, 2, "1f1b")
    assert one.makespan_s == pytest.approx(15.0)
    got = [(e.stage, e.kind, e.micro_batch, e.start_s, e.end_s) for e in one.stage_events(1)]
    assert got == [(1, "fwd", 0, 1, 3), (1, "bwd", 0, 3, 7), (1, "fwd", 1, 7, 9), (1, "bwd", 1, 9, 13)]
    assert [(e.kind, e.start_s) for e in one.stage_events(0)] == [
        ("fwd", 0), ("fwd", 1), ("bwd", 7), ("bwd", 13)]
    assert simulate_pipeline(stages, 2, "gpipe").makespan_s == pytest.approx(15.0)


def test_blocking_sends_hand_computed():
    # 0.5 s activation send 0->1, 0.25 s gradient send 1->0; the sender waits for its send.
    #   stage 0: F0 [0,1] send [1,1.5]  F1 [1.5,2.5] send [2.5,3]
    #   stage 1: F0 [1.5,3.5] B0 [3.5,7.5] send [7.5,7.75] F1 [7.75,9.75] B1 [9.75,13.75] send ..14
    #   stage 0: B0 [7.75,9.75]  B1 [14,16]
    stages = [SimStage(1, 2, send_forward_s=0.5), SimStage(2, 4, send_backward_s=0.25)]
    res = simulate_pipeline(stages, 2, "1f1b")
    assert res.makespan_s == pytest.approx(16.0)
    assert [(e.kind, e.start_s, e.end_s) for e in res.stage_events(0)] == [
        ("fwd", 0, 1), ("fwd", 1.5, 2.5), ("bwd", 7.75, 9.75), ("bwd", 14, 16)]
    assert sorted({e.kind for e in res.transfers}) == ["send-bwd", "send-fwd"]
    assert len(res.transfers) == 4


def test_async_sends_delay_only_dependencies():
    # Same stages, sends beside compute: stage 1 starts at 1.5, its B1 ends at 13.5, stage 0's
    # B1 runs [13.75, 15.75].
    stages = [SimStage(1, 2, send_forward_s=0.5), SimStage(2, 4, send_backward_s=0.25)]
    res = simulate_pipeline(stages, 2, "1f1b", blocking_sends=False)
    assert res.makespan_s == pytest.approx(15.75)


def test_link_serialization_makes_slow_link_the_bottleneck():
    # GPipe, f=b=1 on both stages, 3 s per activation send, 3 micro-batches, async sends.
    # Serialized: sends [1,4] [4,7] [7,10]; stage 1 forwards end at 11; backwards
    # [11,12] [12,13] [13,14]; stage 0's last backward ends at 15.
    # As pure delays: sends [1,4] [2,5] [3,6]; stage 0 ends at 11.
    stages = [SimStage(1, 1, send_forward_s=3), SimStage(1, 1)]
    kw = {"blocking_sends": False}
    assert simulate_pipeline(stages, 3, "gpipe", **kw).makespan_s == pytest.approx(15.0)
    assert simulate_pipeline(stages, 3, "gpipe", serialize_links=False, **kw).makespan_s == pytest.approx(11.0)
    # Blocking: stage 0 is busy 4 s per forward: forwards reach stage 1 at 4, 8, 12.
    assert simulate_pipeline(stages, 3, "gpipe").makespan_s == pytest.approx(4 + 4 + 4 + 1 + 3 + 1)


@pytest.mark.parametrize("p,k,v", [(2, 1, 2), (2, 4, 2), (4, 2, 2), (4, 3, 4), (3, 2, 3)])
def test_interleaved_bubble_shrinks_by_v(p, k, v):
    m = k * p
    f, b = 2.0, 4.0
    inter = simulate_pipeline([SimStage(f, b)] * p, m, "interleaved-1f1b", v)
    plain = simulate_pipeline([SimStage(f, b)] * p, m, "1f1b")
    # Megatron's interleaved schedule: bubble (p - 1)(f + b) / v.
    assert inter.makespan_s == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)
    bubble_inter = inter.makespan_s - m * (f + b)
    bubble_plain = plain.makespan_s - m * (f + b)
    assert bubble_inter == pytest.approx(bubble_plain / v)
    assert len(inter.timeline) == 2 * m * v * p


def test_in_flight_micro_batches_per_schedule():
    p, m = 4, 8
    one = simulate_pipeline([SimStage(1, 2)] * p, m, "1f1b")
    assert one.max_in_flight == [4, 3, 2, 1]
    gp = simulate_pipeline([SimStage(1, 2)] * p, m, "gpipe")
    assert gp.max_in_flight == [m] * p


def _check_invariants(res, stages, v):
    p = len(stages)
    end = {}
    for e in res.timeline:
        end[(e.kind, e.virtual_stage, e.micro_batch)] = e.end_s
    for s in range(p):
        evs = res.stage_events(s)
        for a, b in pairwise(evs):
            assert b.start_s >= a.end_s - 1e-12, "a stage runs one op at a time"
    for e in res.timeline:
        if e.kind == "fwd" and e.virtual_stage > 0:
            prev = (e.virtual_stage - 1) % p
            send = stages[prev].send_forward_s if p > 1 else 0.0  # one stage: no link
            need = end[("fwd", e.virtual_stage - 1, e.micro_batch)] + send
            assert e.start_s >= need - 1e-9
        if e.kind == "bwd":
            assert e.start_s >= end[("fwd", e.virtual_stage, e.micro_batch)] - 1e-9
            if e.virtual_stage < p * v - 1:
                nxt = (e.virtual_stage + 1) % p
                send = stages[nxt].send_backward_s if p > 1 else 0.0
                need = end[("bwd", e.virtual_stage + 1, e.micro_batch)] + send
                assert e.start_s >= need - 1e-9
    assert res.makespan_s == pytest.approx(max(e.end_s for e in res.timeline))


def test_random_schedules_respect_dependencies_and_never_deadlock():
    rng = random.Random(7)
    for _ in range(60):
        p = rng.randint(1, 6)
        schedule = rng.choice(["gpipe", "1f1b", "interleaved-1f1b"])
        v = rng.randint(2, 4) if schedule == "interleaved-1f1b" else 1
        m = p * rng.randint(1, 4) if v > 1 else rng.randint(1, 12)
        stages = [SimStage(rng.uniform(0.5, 2), rng.uniform(1, 4), rng.choice([0, rng.uniform(0, 1)]),
                           rng.choice([0, rng.uniform(0, 1)])) for _ in range(p)]
        res = simulate_pipeline(stages, m, schedule, v)
        _check_invariants(res, stages, v)
        # No schedule beats doing the slowest stage's work back to back.
        assert res.makespan_s >= max(m * (s.forward_s + s.backward_s) for s in stages) - 1e-9


def test_accepts_cost_stage_timings_by_duck_typing():
    timings = [SimpleNamespace(forward_s=1.0, backward_s=2.0, send_forward_s=0.0, send_backward_s=0.0,
                               dp_sync_s=9.0)] * 3
    assert simulate_pipeline(timings, 4, "1f1b").makespan_s == pytest.approx(6 * 3.0)


def test_schedule_orders_and_bad_knobs():
    assert stage_orders("1f1b", 3, 4)[0] == [
        ("fwd", 0, 0), ("fwd", 0, 1), ("fwd", 0, 2), ("bwd", 0, 0), ("fwd", 0, 3), ("bwd", 0, 1),
        ("bwd", 0, 2), ("bwd", 0, 3)]
    with pytest.raises(ValueError, match="virtual_stages > 1"):
        stage_orders("1f1b", 2, 4, 2)
    with pytest.raises(ValueError, match=">= 2"):
        stage_orders("interleaved-1f1b", 2, 4, 1)
    with pytest.raises(ValueError, match="multiple"):
        stage_orders("interleaved-1f1b", 2, 3, 2)
    with pytest.raises(ValueError, match="unknown schedule"):
        stage_orders("zero-bubble", 2, 4)
    with pytest.raises(ValueError, match="non-negative"):
        simulate_pipeline([SimStage(-1, 1)], 2)


# -- agreement with the closed forms of planner.cost.schedule ------------------------------

def _closed_form():
    return pytest.importorskip("planner.cost.schedule")


def _random_timings(rng, cf, p, wrap):
    return [cf.StageTiming(rng.uniform(0.5, 2), rng.uniform(1, 3),
                           rng.uniform(0, 0.5) if (i < p - 1 or wrap) else 0.0,
                           rng.uniform(0, 0.5) if (i > 0 or wrap) else 0.0) for i in range(p)]


def test_gpipe_matches_closed_form_for_any_stages():
    cf = _closed_form()
    rng = random.Random(11)
    for _ in range(100):
        p, m = rng.randint(1, 6), rng.randint(1, 12)
        st = _random_timings(rng, cf, p, wrap=False)
        assert simulate_pipeline(st, m, "gpipe").makespan_s == pytest.approx(cf.pipeline_time_s(st, m, "gpipe"))


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4)])
def test_equal_stages_match_closed_form(schedule, v):
    cf = _closed_form()
    for p in (1, 2, 3, 5):
        for k in (1, 2, 3):
            m = k * p if v > 1 else k * 3 + 1
            st = [cf.StageTiming(1.25, 2.5)] * p
            assert simulate_pipeline(st, m, schedule, v).makespan_s == pytest.approx(
                cf.pipeline_time_s(st, m, schedule, v))


def test_1f1b_where_the_closed_form_is_not_exact():
    cf = _closed_form()
    # cost.schedule's own example: p=2, f=b=(2,1), m=2: true 8, formula 10.
    st = [cf.StageTiming(2, 2), cf.StageTiming(1, 1)]
    assert simulate_pipeline(st, 2, "1f1b").makespan_s == pytest.approx(8.0)
    assert cf.pipeline_time_s(st, 2, "1f1b") == pytest.approx(10.0)
    # And one where it is low.  Hand-computed (f, b) = (1,4) (4,1) (1,1) (1,2), m=4:
    #   stage 3 ends B3 at 22, stage 2 B3 at 23, stage 1 B3 at 24; stage 0 runs F0-F3 in
    #   [0,4], then B0 [14,18] B1 [19,23] B2 [23,27] B3 [27,31].  Formula: 15 + 3 * 5 = 30.
    st = [cf.StageTiming(1, 4), cf.StageTiming(4, 1), cf.StageTiming(1, 1), cf.StageTiming(1, 2)]
    res = simulate_pipeline(st, 4, "1f1b")
    assert res.makespan_s == pytest.approx(31.0)
    assert [(e.kind, e.start_s) for e in res.stage_events(0)] == [
        ("fwd", 0), ("fwd", 1), ("fwd", 2), ("fwd", 3), ("bwd", 14), ("bwd", 19), ("bwd", 23), ("bwd", 27)]
    assert cf.pipeline_time_s(st, 4, "1f1b") == pytest.approx(30.0)


# -- the plan-level simulation and the CLI command -----------------------------------------

SPECS = __import__("pathlib").Path(__file__).resolve().parent.parent / "cluster_specs"


def _plan_file(tmp_path, **changes):
    data = {
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "tiny-mixed", "model": "opt-350m",
                   "training": {"global_batch_size": 32, "seq_len": 2048, "precision": "bf16"}},
        "micro_batch_size": 4, "num_micro_batches": 8, "schedule": "1f1b",
        "stages": [
            {"index": 0, "blocks": [0, 12], "embedding": True, "replicas": [
                {"gpu_type": "A100-SXM4-80GB", "tp": 2, "micro_batch_share": 4, "devices": ["a100:0", "a100:1"]}]},
            {"index": 1, "blocks": [12, 24], "head": True, "replicas": [
                {"gpu_type": "A100-SXM4-80GB", "tp": 2, "micro_batch_share": 4, "devices": ["a100:2", "a100:3"]}]}],
        **changes}
    path = tmp_path / "plan.json"
    path.write_text(__import__("json").dumps(data))
    return path


def test_simulate_plan_agrees_with_closed_form_on_gpipe(tmp_path):
    pytest.importorskip("planner.cost")
    from planner.plan.check import load_plan
    from planner.simulate import simulate_plan
    from planner.spec import load_cluster

    cluster = load_cluster(SPECS / "tiny-mixed.yaml")
    sim = simulate_plan(cluster, load_plan(_plan_file(tmp_path, schedule="gpipe")))
    # GPipe's closed form is exact for any stages.
    assert sim.simulated_pipeline_s == pytest.approx(sim.closed_form_pipeline_s, rel=1e-9)
    assert sim.simulated_iteration_s == pytest.approx(sim.closed_form_iteration_s, rel=1e-9)
    out = sim.to_json()
    assert len(out["timeline"]) == 2 * 2 * 8
    assert out["stages"][0]["max_in_flight"] == 8


def test_cli_simulate_text_and_json(tmp_path):
    pytest.importorskip("planner.cost")
    import json as _json

    from click.testing import CliRunner

    from planner.cli.main import cli

    plan = _plan_file(tmp_path)
    runner = CliRunner()
    res = runner.invoke(cli, ["simulate", str(SPECS / "tiny-mixed.yaml"), str(plan), "--width", "40"])
    assert res.exit_code == 0, res.output
    assert "closed form" in res.output and "simulated" in res.output
    rows = [line for line in res.output.splitlines() if line.startswith("stage  ")]
    assert len(rows) == 2 and all(len(r.split("|")[1]) == 40 for r in rows)
    res = runner.invoke(cli, ["simulate", str(SPECS / "tiny-mixed.yaml"), str(plan), "--json"])
    assert res.exit_code == 0, res.output
    data = _json.loads(res.output)
    assert data["schedule"] == "1f1b" and data["num_stages"] == 2
    assert abs(data["relative_difference"]) < 0.25  # two near-equal stages: close to the formula
    assert len(data["timeline"]) == 2 * 2 * 8


def test_cli_simulate_bad_plan_is_exit_2(tmp_path, capsys):
    from planner.cli.main import main

    plan = _plan_file(tmp_path)
    assert main(["simulate", str(SPECS / "tiny-2gpu.yaml"), str(plan)]) == 2
    err = capsys.readouterr().err
    assert "plan.json: stages[1].replicas[0].devices[0]" in err and "traceback" not in err.lower()


def test_timeline_rows_marks_idle_and_micro_batches():
    from planner.simulate import timeline_rows

    res = simulate_pipeline([SimStage(1, 1), SimStage(1, 1)], 2, "gpipe")  # makespan 6
    rows = timeline_rows(res, width=6)
    assert "".join(c for c, _ in rows[0]) == "01..01"
    assert "".join(c for c, _ in rows[1]) == ".0101."
    assert [k for _, k in rows[1]] == ["idle", "fwd", "fwd", "bwd", "bwd", "idle"]


def test_in_flight_counts_match_cost_memory_model():
    memory = pytest.importorskip("planner.cost.memory")
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3)):
        for p in (1, 2, 4):
            for m in (p, 2 * p, 4 * p):
                res = simulate_pipeline([SimStage(1, 2)] * p, m, schedule, v)
                # cost counts whole-stage micro-batches; the simulator counts chunks
                assert [c / v for c in res.max_in_flight] == [
                    memory.in_flight_micro_batches(schedule, p, s, m, v) for s in range(p)]


# -- ZB-H1: the action-list executor behind simulate ---------------------------------------

def test_zb_h1_in_flight_matches_cost_memory_model():
    # activations stay until W: every stage holds min(m, p) micro-batches at its peak
    memory = pytest.importorskip("planner.cost.memory")
    from planner.cost.schedule import StageTiming
    from planner.simulate.plan import simulate_action_schedule

    for p in (1, 2, 4, 6):
        for m in (1, 2, p, 2 * p):
            st = [StageTiming(forward_s=1, backward_s=2, backward_weight_s=1)] * p
            res = simulate_action_schedule(st, m)
            assert res.max_in_flight == [memory.in_flight_micro_batches("zb-h1", p, s, m) for s in range(p)]
            assert res.max_in_flight == [min(m, p)] * p


def _one_stage_plan(tmp_path, m=8):
    inputs = {"cluster": "tiny-mixed", "model": "opt-350m",
              "training": {"global_batch_size": 4 * m, "seq_len": 2048, "precision": "bf16"}}
    stages = [{"index": 0, "blocks": [0, 24], "embedding": True, "head": True, "replicas": [
        {"gpu_type": "A100-SXM4-80GB", "tp": 4, "micro_batch_share": 4,
         "devices": ["a100:0", "a100:1", "a100:2", "a100:3"]}]}]
    return _plan_file(tmp_path, inputs=inputs, num_micro_batches=m, schedule="zb-h1", stages=stages)


def test_simulate_plan_zb_h1(tmp_path):
    pytest.importorskip("planner.cost")
    from planner.plan.check import load_plan
    from planner.simulate import simulate_plan
    from planner.simulate.plan import plan_execution
    from planner.spec import load_cluster

    cluster = load_cluster(SPECS / "tiny-mixed.yaml")
    # one stage: the closed form is exact
    sim = simulate_plan(cluster, load_plan(_one_stage_plan(tmp_path)))
    assert sim.simulated_pipeline_s == pytest.approx(sim.closed_form_pipeline_s, rel=1e-12)
    # two equal A100 stages with sends: close, and the W's are their own events
    sim = simulate_plan(cluster, load_plan(_plan_file(tmp_path, schedule="zb-h1")))
    ev = sim.evaluation
    assert all(0 < s.backward_weight_s < s.backward_s for s in ev.stages)
    assert abs(sim.relative_difference) < 0.02
    out = sim.to_json()
    assert out["schedule"] == "zb-h1"
    assert sorted({e["kind"] for e in out["timeline"]}) == ["bwd", "fwd", "wgt"]
    assert len(out["timeline"]) == 2 * 3 * 8
    assert [s["max_in_flight"] for s in out["stages"]] == [2, 2]
    assert plan_execution(sim).makespan_s == pytest.approx(sim.simulated_pipeline_s)
    # ZB-H1 beats 1F1B under the model and the simulator on the same placement
    one = simulate_plan(cluster, load_plan(_plan_file(tmp_path, schedule="1f1b")))
    assert sim.closed_form_pipeline_s < one.closed_form_pipeline_s
    assert sim.simulated_pipeline_s < one.simulated_pipeline_s


def test_cli_simulate_zb_h1(tmp_path):
    pytest.importorskip("planner.cost")
    import json as _json

    from click.testing import CliRunner

    from planner.cli.main import cli

    plan = _plan_file(tmp_path, schedule="zb-h1")
    runner = CliRunner()
    res = runner.invoke(cli, ["simulate", str(SPECS / "tiny-mixed.yaml"), str(plan), "--width", "40"])
    assert res.exit_code == 0, res.output
    assert "zb-h1" in res.output and "weight gradient" in res.output
    res = runner.invoke(cli, ["simulate", str(SPECS / "tiny-mixed.yaml"), str(plan), "--json"])
    assert res.exit_code == 0, res.output
    assert _json.loads(res.output)["schedule"] == "zb-h1"
    res = runner.invoke(cli, ["evaluate", str(SPECS / "tiny-mixed.yaml"), str(plan), "--json"])
    assert res.exit_code == 0, res.output
