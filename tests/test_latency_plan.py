"""The latency-aware schedule in plans: pipeline_actions checked with field-named errors,
`planner schedule --latency-aware` rewriting a 1f1b plan across two datacenters, the cost
model and `planner simulate` pricing the plan's own lists, and launchers refusing it by name."""

from __future__ import annotations

import json

import pytest
from test_launch_formats import make_plan
from test_launch_refusals import refusal

from planner.cli.main import main
from planner.plan.check import load_plan
from planner.simulate.latency import peak_in_flight, peak_waiting_w
from planner.simulate.latency_plan import plan_schedule

TWO_DC = """
name: two-dc
zones:
  - {name: dc-a, region: r1}
  - {name: dc-b, region: r2}
nodes:
  - {name: a, count: 2, zone: dc-a, gpu: A100-SXM4-80GB, gpus_per_node: 2, network_bandwidth: 100 Gbit/s}
  - {name: b, count: 2, zone: dc-b, gpu: A100-SXM4-80GB, gpus_per_node: 2, network_bandwidth: 100 Gbit/s}
links:
  - between: [dc-a, dc-b]
    bandwidth: 25 Gbit/s
    latency: 50 ms
"""


def _write(tmp_path, **changes):
    """Four one-GPU stages of opt-350m, two per datacenter: boundary 1 -> 2 crosses the link."""
    cluster = tmp_path / "two-dc.yaml"
    cluster.write_text(TWO_DC)
    devices = ["a-0:0", "a-1:0", "b-0:0", "b-1:0"]
    m = changes.get("num_micro_batches", 8)
    data = {
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "two-dc", "model": "opt-350m",
                   "training": {"global_batch_size": 2 * m, "seq_len": 2048, "precision": "bf16"}},
        "micro_batch_size": 2, "num_micro_batches": m, "schedule": "1f1b",
        "stages": [{"index": i, "blocks": [6 * i, 6 * i + 6], "embedding": i == 0, "head": i == 3,
                    "replicas": [{"gpu_type": "A100-SXM4-80GB", "tp": 1, "micro_batch_share": 2,
                                  "devices": [d]}]} for i, d in enumerate(devices)],
        **changes}
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    return cluster, plan


def _schedule(tmp_path, *extra):
    cluster, plan = _write(tmp_path)
    out = tmp_path / "la.json"
    assert main(["schedule", str(cluster), str(plan), "--latency-aware", "-o", str(out), "--json", *extra]) == 0
    return cluster, plan, out


def test_schedule_rewrites_a_1f1b_plan_and_hides_the_slow_link(tmp_path, capsys):
    _, _, out = _schedule(tmp_path)
    report = json.loads(capsys.readouterr().out)
    new = load_plan(out)
    assert new.schedule == "latency-aware" and len(new.pipeline_actions) == 4
    # like for like (both with non-blocking sends): the new order is no slower than 1F1B's
    assert report["after"]["pipeline_time_s"] <= report["before"]["pipeline_time_latency_model_s"] + 1e-12
    # and the 50 ms link makes 1F1B's blocking-send closed form clearly slower
    assert report["after"]["pipeline_time_s"] < 0.95 * report["before"]["pipeline_time_s"]
    # the default cap: per rank 1F1B's own peak (p - s), so the rewrite needs no more memory
    assert report["after"]["memory_cap"] == [4, 3, 2, 1]
    assert new.predicted.iteration_time_s == pytest.approx(report["after"]["iteration_time_s"])


def test_cost_model_and_simulator_price_the_plans_own_lists(tmp_path, capsys):
    from planner.cost import evaluate
    from planner.simulate import simulate_plan
    from planner.simulate.plan import plan_execution
    from planner.spec import load_cluster

    cluster_path, plan_path, out = _schedule(tmp_path)
    capsys.readouterr()
    cluster, plan = load_cluster(cluster_path), load_plan(out)
    ev = evaluate(cluster, plan)
    sim = simulate_plan(cluster, plan)
    assert sim.simulated_pipeline_s == pytest.approx(ev.pipeline_time_s, rel=1e-12)
    run = plan_execution(sim)
    assert [a.kind for a in run.rank_actions(0)] == [t[0] for t in plan.pipeline_actions[0]]
    assert sum(ev.breakdown_s.values()) == pytest.approx(ev.iteration_time_s)
    assert ev.breakdown_s["pp_comm"] == 0.0 and ev.breakdown_s["bubble"] >= 0.0
    # memory: each stage's activations scale with its lists' peak (1F1B: p - s), and the
    # gradients of its most micro-batches between I and W come on top, also read off its list
    from planner.cost.evaluate import context_for_plan
    from planner.cost.memory import w_input_grad_bytes
    base = evaluate(cluster, load_plan(plan_path))
    peaks = peak_in_flight(sim.execution.schedule)
    waiting = peak_waiting_w(sim.execution.schedule)
    assert max(waiting) >= 1
    grads = w_input_grad_bytes(context_for_plan(plan), 1, 2)    # tp 1, 2 sequences a micro-batch
    for s in range(4):
        got = ev.memory_by_replica[s][0].activations_bytes
        want = base.memory_by_replica[s][0].activations_bytes * peaks[s] / (4 - s)
        assert got == pytest.approx(want + waiting[s] * plan.stages[s].num_blocks * grads, rel=1e-9)


def test_schedule_exact_reports_the_gap(tmp_path, capsys):
    cluster, plan = _write(tmp_path, num_micro_batches=4)
    assert main(["schedule", str(cluster), str(plan), "--latency-aware", "--exact", "--time-limit", "20",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    e = report["exact"]
    assert e["status"] in ("optimal", "feasible")
    assert report["greedy"]["pipeline_time_s"] >= e["bound_s"] - 1e-9
    assert report["gap"] == pytest.approx((report["greedy"]["pipeline_time_s"] - e["bound_s"]) / e["bound_s"])


def test_schedule_refuses_exact_on_large_plans_and_interleaved(tmp_path, capsys):
    cluster, plan = _write(tmp_path, num_micro_batches=16)
    assert main(["schedule", str(cluster), str(plan), "--latency-aware", "--exact"]) == 2
    assert "drop --exact for the greedy" in capsys.readouterr().err
    assert main(["schedule", str(cluster), str(plan)]) == 2
    assert "--latency-aware" in capsys.readouterr().err


def _validate(tmp_path, capsys, **changes) -> str:
    cluster, plan = _write(tmp_path, **changes)
    assert main(["evaluate", str(cluster), str(plan)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_pipeline_actions_are_checked_with_field_names(tmp_path, capsys):
    ok = [[f"{k}0.{j}" for j in range(2) for k in "FIW"]] * 4
    err = _validate(tmp_path, capsys, schedule="latency-aware", num_micro_batches=2)
    assert "pipeline_actions" in err and "planner schedule" in err
    bad = [list(r) for r in ok]
    bad[1][2] = "X0.1"
    err = _validate(tmp_path, capsys, schedule="latency-aware", num_micro_batches=2, pipeline_actions=bad)
    assert "pipeline_actions[1][2]" in err and "'X0.1' is not an action" in err
    short = [list(r) for r in ok]
    short[3] = short[3][:-1]
    err = _validate(tmp_path, capsys, schedule="latency-aware", num_micro_batches=2, pipeline_actions=short)
    assert "pipeline_actions" in err and "no W" in err
    err = _validate(tmp_path, capsys, schedule="latency-aware", num_micro_batches=2, pipeline_actions=ok[:3])
    assert "3 action lists for 4 stages" in err
    err = _validate(tmp_path, capsys, num_micro_batches=2, pipeline_actions=ok)
    assert "only schedule \"latency-aware\" reads pipeline_actions" in err
    # a deadlock: stage 0 waits on micro-batch 1's gradient before it sends micro-batch 0 onward
    stuck = [list(r) for r in ok]
    stuck[0] = ["F0.1", "I0.1", "W0.1", "F0.0", "I0.0", "W0.0"]
    stuck[1] = ["F0.0", "I0.0", "W0.0", "F0.1", "I0.1", "W0.1"]
    err = _validate(tmp_path, capsys, schedule="latency-aware", num_micro_batches=2, pipeline_actions=stuck)
    assert "deadlock" in err


def _la_plan():
    acts = [[f"{k}0.{j}" for j in range(16) for k in "FIW"]] * 2
    return make_plan(blocks=((0, 4), (4, 8)), schedule="latency-aware", pipeline_actions=acts)


@pytest.mark.parametrize("fmt,tool", [("megatron", "Megatron-LM"), ("deepspeed", "DeepSpeed")])
def test_launchers_refuse_latency_aware_by_name(fmt, tool):
    msg = refusal(_la_plan(), fmt)
    assert "schedule latency-aware: " in msg and tool in msg


def test_pipelining_runs_the_plans_own_lists_from_a_csv():
    from planner.launch import render

    files = render(_la_plan(), "pipelining", master_addr="h")
    rows = files["pipeline_schedule.csv"].splitlines()
    # one row per rank, global stage = rank on the loop map with one chunk: "<stage><kind><mb>"
    assert rows[0].split(",")[:3] == ["0F0", "0I0", "0W0"] and rows[1].split(",")[:3] == ["1F0", "1I0", "1W0"]
    assert json.loads(files["pipelining.json"])["schedule_csv"] == "pipeline_schedule.csv"


def test_torchrun_rank_map_carries_the_actions():
    from planner.launch import render

    files = render(_la_plan(), "torchrun", master_addr="h")
    rank_map = next(json.loads(text) for name, text in files.items() if name.endswith(".json"))
    assert rank_map["schedule"] == "latency-aware"
    assert rank_map["pipeline_actions"][1][:3] == ["F0.0", "I0.0", "W0.0"]


def test_runner_follows_the_plans_own_lists():
    from planner.launch.run_schedule import plan_schedule

    sched = plan_schedule(_la_plan())   # the runner's source registry reads pipeline_actions first
    assert sched.table()[1][:3] == ["1F0", "1I0", "1W0"] and len(sched.ranks[0]) == 48


def test_simulate_draws_the_plan(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    cluster, _, out = _schedule(tmp_path)
    capsys.readouterr()
    png = tmp_path / "t.png"
    assert main(["simulate", str(cluster), str(out), "--timeline", str(png)]) == 0
    text = capsys.readouterr().out
    assert "latency-aware" in text and "+0.00%" in text
    assert png.stat().st_size > 1000


def test_memory_cap_bounds_the_written_lists(tmp_path, capsys):
    _, _, out = _schedule(tmp_path, "--memory-cap", "1")
    report = json.loads(capsys.readouterr().out)
    assert report["after"]["memory_cap"] == [1, 1, 1, 1]
    assert max(peak_in_flight(plan_schedule(load_plan(out)))) == 1
    # one micro-batch in flight cannot hide the link: slower than with the default cap
    _schedule(tmp_path)
    assert json.loads(capsys.readouterr().out)["after"]["pipeline_time_s"] < report["after"]["pipeline_time_s"]
    cluster, plan = _write(tmp_path)
    assert main(["schedule", str(cluster), str(plan), "--latency-aware", "--memory-cap", "0"]) == 2
    assert "--memory-cap must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "zb-v"])
def test_schedule_refuses_plans_with_chunks(tmp_path, capsys, schedule):
    # found by scripts/fuzz_plans.py: a zb-v plan passed the check that named interleaved-1f1b
    # only, and the retiming crashed with ScheduleError (exit 3)
    cluster, plan = _write(tmp_path, schedule=schedule, virtual_stages=2)
    assert main(["schedule", str(cluster), str(plan), "--latency-aware"]) == 2
    assert f"schedule {schedule} runs 2 chunks per rank" in capsys.readouterr().err


def test_schedule_refuses_bitpipe(tmp_path, capsys):
    # a review's find: a bitpipe plan keeps virtual_stages 1 (its ranks run four chunks, two V
    # pipelines), passed the check above and crashed the retiming (exit 3, internal error)
    cluster, plan = _write(tmp_path, schedule="bitpipe")
    assert main(["evaluate", str(cluster), str(plan)]) == 0
    capsys.readouterr()
    assert main(["schedule", str(cluster), str(plan), "--latency-aware"]) == 2
    assert "schedule bitpipe runs 4 chunks per rank" in capsys.readouterr().err


def test_the_default_rewrite_holds_no_more_in_flight_than_the_plan(tmp_path, capsys):
    # found by scripts/fuzz_plans.py: one cap of min(m, p) for every rank let a 1F1B plan's last
    # stages hold up to p micro-batches, and 18 of 247 rewrites of plans that fit did not
    from planner.simulate.latency_rewrite import _baseline

    _, plan, out = _schedule(tmp_path)
    before = peak_in_flight(_baseline(load_plan(plan)))
    after = peak_in_flight(plan_schedule(load_plan(out)))
    assert before == [4, 3, 2, 1] and all(a <= b for a, b in zip(after, before, strict=True)), (after, before)


ONE_STAGE_CLUSTER = """
name: four-a100-40
nodes:
  - {name: g0, gpu: A100-SXM4-40GB, gpus_per_node: 4, count: 4, network_bandwidth: 12.1 GB/s}
"""


def _long_sequence_plan(tmp_path, stages: int):
    """Llama-2 7B with full recompute at 32,768 tokens on 16 A100-40GB, fp16, in 1 or 2 stages
    of 8 sequences (tp 2, share 2): it fits under 1F1B."""
    cluster = tmp_path / "c.yaml"
    cluster.write_text(ONE_STAGE_CLUSTER)
    per = 16 // stages

    def replicas(first):
        return [{"gpu_type": "A100-SXM4-40GB", "tp": 2, "micro_batch_share": 2,
                 "devices": [f"g0-{(first + r) // 2}:{2 * (r % 2)}", f"g0-{(first + r) // 2}:{2 * (r % 2) + 1}"]}
                for r in range(per // 2)]
    bounds = [(i * 32 // stages, (i + 1) * 32 // stages) for i in range(stages)]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "four-a100-40", "model": "llama2-7b",
                   "training": {"global_batch_size": 16 if stages == 1 else 8, "seq_len": 32768,
                                "precision": "fp16", "attention": "flash"}},
        "micro_batch_size": 16 if stages == 1 else 8, "num_micro_batches": 1, "schedule": "1f1b",
        "recompute": "full", "zero_stage": 1, "sequence_parallel": True,
        "stages": [{"index": i, "blocks": list(b), "embedding": i == 0, "head": i == stages - 1,
                    "replicas": replicas(i * per // 2)} for i, b in enumerate(bounds)]}))
    return cluster, plan


def test_ranks_whose_split_backward_overflows_keep_whole_backwards(tmp_path, capsys):
    # found by scripts/fuzz_plans.py (seed 34, case 16), then on one stage: Llama-2 7B with full
    # recompute at 32,768 tokens fits under 1F1B (each block's backward frees its gradients as
    # it goes); split into I and W, every block's weight-op gradients wait from I to W.  The
    # command wrote that plan, exit 0, and evaluate then rejected it; then it refused it with a
    # hint no flag could follow.  Now both ranks run whole backwards and the rewrite fits.
    cluster, plan = _long_sequence_plan(tmp_path, stages=2)
    assert main(["evaluate", str(cluster), str(plan), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"]
    out = tmp_path / "la.json"
    assert main(["schedule", str(cluster), str(plan), "--latency-aware", "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["after"]["whole_backward_stages"] == [0, 1]
    assert {a[0] for acts in load_plan(out).pipeline_actions for a in acts} == {"F", "B"}
    assert main(["evaluate", str(cluster), str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"]


TIGHT_CLUSTER = """
name: cl4
zones: [{name: za}, {name: zb}]
nodes:
  - {name: n, count: 4, zone: za, gpu: L4-24GB, gpus_per_node: 2, network_bandwidth: 50 Gbit/s}
  - {name: m, count: 2, zone: zb, gpu: A100-SXM4-40GB, gpus_per_node: 2, network_bandwidth: 100 Gbit/s}
links:
  - {between: [za, zb], bandwidth: 10 Gbit/s, latency: 5 ms}
"""


def _tight_plan(tmp_path):
    """Llama-3-8B in six stages, four on L4s and two on A100-40GB behind a 5 ms zone link; the
    last stage (10 blocks and the head) fits under 1F1B with 1.7 GiB to spare, not with a split
    backward's weight-op gradients (a robustness sweep)."""
    cluster = tmp_path / "cl4.yaml"
    cluster.write_text(TIGHT_CLUSTER)
    bounds, nodes = [0, 3, 6, 9, 12, 22, 32], ["n-0", "n-1", "n-2", "n-3", "m-0", "m-1"]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "cl4", "model": "llama3-8b",
                   "training": {"global_batch_size": 64, "seq_len": 2048, "precision": "bf16", "attention": "flash"}},
        "micro_batch_size": 2, "num_micro_batches": 32, "schedule": "1f1b", "zero_stage": 1,
        "sequence_parallel": True,
        "stages": [{"index": i, "blocks": [bounds[i], bounds[i + 1]], "embedding": i == 0, "head": i == 5,
                    "replicas": [{"gpu_type": "L4-24GB" if i < 4 else "A100-SXM4-40GB", "tp": 1,
                                  "micro_batch_share": 1, "devices": [f"{node}:{k}"]} for k in range(2)]}
                   for i, node in enumerate(nodes)]}))
    return cluster, plan


@pytest.mark.parametrize("cap", [[], ["--memory-cap", "1"]])
def test_only_the_rank_the_split_overflows_keeps_whole_backwards(tmp_path, capsys, cap):
    # a robustness sweep: the rewrite of this 1F1B plan, which fits, was refused ("stage 5 needs
    # 37.49 GiB of 37.25 GiB ... try a smaller --memory-cap"), and --memory-cap 1 failed the same
    cluster, plan = _tight_plan(tmp_path)
    out = tmp_path / "la.json"
    assert main(["schedule", str(cluster), str(plan), "--latency-aware", "-o", str(out), *cap]) == 0
    assert "stage(s) 5 run whole backwards" in capsys.readouterr().out
    lists = load_plan(out).pipeline_actions
    assert {a[0] for a in lists[5]} == {"F", "B"}
    assert all({a[0] for a in acts} == {"F", "I", "W"} for acts in lists[:5])
    assert main(["evaluate", str(cluster), str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"]


def test_a_rewrite_that_cannot_fit_says_why_and_offers_only_a_hint_that_helps(tmp_path, capsys):
    # it said "try a smaller --memory-cap" where the overflow was the split's held gradients,
    # which no cap removes.  With whole backwards the overflow left is in-flight activations:
    # a smaller cap helps where an overflowing rank holds more than one micro-batch ...
    cluster, plan = _tight_plan(tmp_path)
    out = tmp_path / "la.json"
    assert main(["schedule", str(cluster), str(plan), "--latency-aware", "-o", str(out), "--memory-cap", "6"]) == 1
    err = capsys.readouterr().err
    assert "does not fit in memory" in err and "nothing written" in err and not out.exists()
    assert "stage(s) 4 already run whole backwards" in err and "try a smaller --memory-cap" in err, err
    # ... and a plan that does not fit itself is named as the problem, with no flag offered
    data = json.loads(plan.read_text())
    data["stages"][4]["blocks"], data["stages"][5]["blocks"] = [12, 21], [21, 32]   # 11 blocks on 5
    plan.write_text(json.dumps(data))
    assert main(["schedule", str(cluster), str(plan), "--latency-aware", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "itself does not fit (1f1b): fix the plan first" in err and not out.exists()
    assert "--memory-cap" not in err and "Traceback" not in err, err


def test_schedule_refuses_a_one_stage_plan(tmp_path, capsys):
    """One rank has no boundary: nothing to hide.  It ended in a memory error that named no
    cause (a robustness sweep)."""
    cluster, plan = _long_sequence_plan(tmp_path, stages=1)
    out = tmp_path / "la.json"
    assert main(["schedule", str(cluster), str(plan), "--latency-aware", "-o", str(out)]) == 2
    assert "a one-stage plan has no pipeline sends to hide" in capsys.readouterr().err and not out.exists()


def test_a_memory_cap_above_the_micro_batches_is_the_micro_batch_count():
    from planner.simulate.latency import StageTimes, make_problem

    st = [StageTimes(1, 1, 1, send_forward_s=0.08), StageTimes(1, 1, 1, send_backward_s=0.07)]
    assert make_problem(st, 4, [0.05], memory_cap=100).memory_cap == (4, 4)
    assert make_problem(st, 4, [0.05], memory_cap=[3, 9]).memory_cap == (3, 4)


@pytest.mark.parametrize("cap", ["2", 2.5, True, 0])
def test_memory_cap_is_checked_where_the_rewrite_reads_it(tmp_path, cap):
    # a robustness sweep: memory_cap='2' reached the rewrite and raised TypeError there
    from planner.errors import InputError
    from planner.simulate.latency_rewrite import rewrite
    from planner.spec import load_cluster

    cluster, plan = _write(tmp_path)
    with pytest.raises(InputError, match="memory[-_]cap"):
        rewrite(load_cluster(cluster), load_plan(plan), memory_cap=cap)
