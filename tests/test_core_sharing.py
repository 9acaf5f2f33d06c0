"""Processor sharing of a node's cores (planner.simulate.sharing, planner.cost.sharing): the
simulator against hand-computed timelines, and evaluate's core_sharing term."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.cost import evaluate
from planner.errors import InputErrors
from planner.simulate import SimStage, simulate_pipeline
from planner.simulate.sharing import CoreShare, processor_sharing_makespan_s
from planner.spec import cluster_from_dict, load_cluster

ROOT = Path(__file__).resolve().parents[1]


def test_four_equal_independent_jobs_on_two_cores_take_twice_as_long():
    assert processor_sharing_makespan_s([3.0] * 4, 2) == pytest.approx(6.0)
    assert processor_sharing_makespan_s([3.0] * 2, 2) == pytest.approx(3.0)
    # 1,1,1 and 10 on 2 cores: four at half speed for 2 s, then the long one alone for 9 s.
    assert processor_sharing_makespan_s([1, 1, 1, 10], 2) == pytest.approx(11.0)
    with pytest.raises(ValueError):
        processor_sharing_makespan_s([1.0], 0)


def test_four_processes_of_one_stage_on_two_cores_run_at_half_speed():
    # One stage whose 4 data-parallel processes compute together: every op at 2/4 speed.
    res = simulate_pipeline([SimStage(1, 2)], 3, "1f1b", core_shares=[CoreShare(2, (4,))])
    assert res.makespan_s == pytest.approx(18.0)
    assert [(e.kind, e.start_s, e.end_s) for e in res.timeline][:2] == [("fwd", 0, 2), ("bwd", 2, 6)]


def test_four_stage_1f1b_on_two_cores_hand_computed():
    # f=1, b=2, 4 stages, 4 micro-batches, one process per stage, 2 cores. While k stages
    # compute each runs at min(1, 2/k):
    #   [0,1]   F0@s0 alone                               -> ends 1
    #   [1,2]   F1@s0, F0@s1: 2 on 2 cores, full speed     -> end 2
    #   [2,3.5] F2@s0, F1@s1, F0@s2 at 2/3: 1 s of work takes 1.5 s
    #   [3.5,5.5] all four at 1/2 (F3@s0 F2@s1 F1@s2 F0@s3)
    #   [5.5,7.5] B0@s3 alone (stages 0-2 wait for gradients)
    #   [7.5,8.5] F1@s3 and B0@s2 at full speed; [8.5,9.5] B1@s3 and the rest of B0@s2
    #   [9.5,11]  B1@s3 (1 s left), B0@s1, F2@s2 at 2/3: B1@s3 and F2@s2 end at 11
    #   [11,12.5] B0@s1 (1 s left), F2@s3, B1@s2 at 2/3: B0@s1 and F2@s3 end at 12.5
    # and so on to 27 s, against (m+p-1)(f+b) = 21 s with a core each.
    stages = [SimStage(1, 2)] * 4
    alone = simulate_pipeline(stages, 4, "1f1b")
    shared = simulate_pipeline(stages, 4, "1f1b", core_shares=[CoreShare(2, (1, 1, 1, 1))])
    assert alone.makespan_s == pytest.approx(21.0)
    assert shared.makespan_s == pytest.approx(27.0)
    got = [(e.stage, e.kind, e.micro_batch, round(e.start_s, 9), round(e.end_s, 9))
           for e in shared.timeline[:17]]
    assert got == [
        (0, "fwd", 0, 0, 1), (0, "fwd", 1, 1, 2), (1, "fwd", 0, 1, 2),
        (0, "fwd", 2, 2, 3.5), (1, "fwd", 1, 2, 3.5), (2, "fwd", 0, 2, 3.5),
        (0, "fwd", 3, 3.5, 5.5), (1, "fwd", 2, 3.5, 5.5), (2, "fwd", 1, 3.5, 5.5),
        (3, "fwd", 0, 3.5, 5.5), (3, "bwd", 0, 5.5, 7.5),
        (2, "bwd", 0, 7.5, 9.5), (3, "fwd", 1, 7.5, 8.5), (3, "bwd", 1, 8.5, 11),
        (1, "bwd", 0, 9.5, 12.5), (2, "fwd", 2, 9.5, 11), (2, "bwd", 1, 11, 14.5)]
    # 48 s of single-core work on 2 cores needs at least 24 s.
    assert shared.makespan_s >= 48 / 2
    assert sum(shared.busy_s) > sum(alone.busy_s)  # busy time is the stretched wall time


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2)])
def test_enough_cores_leave_the_simulation_unchanged(schedule, v):
    stages = [SimStage(1, 2, 0.25, 0.5), SimStage(2, 3, 0.5, 0.25), SimStage(1.5, 1, 0.1, 0.2)]
    base = simulate_pipeline(stages, 6, schedule, v)
    for shares in ([CoreShare(3, (1, 1, 1))], [CoreShare(8, (1, 1, 1))], [CoreShare(1, (1, 0, 0))]):
        same = simulate_pipeline(stages, 6, schedule, v, core_shares=shares)
        assert same.makespan_s == base.makespan_s  # bit for bit: the fixed-end-time path
        assert same.timeline == base.timeline and same.busy_s == base.busy_s


def test_sends_are_not_slowed_and_sharing_only_lengthens():
    stages = [SimStage(1, 2, send_forward_s=0.5), SimStage(2, 4, send_backward_s=0.25)]
    base = simulate_pipeline(stages, 3, "1f1b")
    shared = simulate_pipeline(stages, 3, "1f1b", core_shares=[CoreShare(1, (1, 1))])
    assert shared.makespan_s > base.makespan_s
    assert [t.duration_s for t in shared.transfers] == [t.duration_s for t in base.transfers]
    # One core for both stages: never faster than all the compute back to back.
    assert shared.makespan_s >= 3 * (1 + 2 + 2 + 4) - 1e-9


def test_random_pipelines_sharing_is_bounded_by_work_and_by_full_slowdown():
    import random
    rng = random.Random(7)
    for _ in range(200):
        p = rng.randint(1, 5)
        schedule = rng.choice(["gpipe", "1f1b", "interleaved-1f1b"])
        v = rng.randint(2, 3) if schedule == "interleaved-1f1b" else 1
        m = p * rng.randint(1, 3)
        stages = [SimStage(rng.uniform(0.1, 2), rng.uniform(0.1, 4)) for _ in range(p)]
        procs = tuple(rng.randint(1, 3) for _ in range(p))
        cores = rng.randint(1, sum(procs))
        alone = simulate_pipeline(stages, m, schedule, v)
        shared = simulate_pipeline(stages, m, schedule, v, core_shares=[CoreShare(cores, procs)])
        work = m * sum(n * (s.forward_s + s.backward_s) for n, s in zip(procs, stages))
        slowest = max(1.0, sum(procs) / cores)  # everything at the worst speed
        assert alone.makespan_s - 1e-9 <= shared.makespan_s <= slowest * alone.makespan_s + 1e-9
        assert shared.makespan_s >= work / cores - 1e-9
        assert len(shared.timeline) == len(alone.timeline) == 2 * m * p * v


def test_bad_shares_are_refused():
    with pytest.raises(ValueError, match="cores must be positive"):
        CoreShare(0, (1,))
    with pytest.raises(ValueError, match="stages"):
        simulate_pipeline([SimStage(1, 1)] * 2, 2, core_shares=[CoreShare(1, (1, 1, 1))])


def _cpu_cluster(cores=None, devices=4):
    data = yaml.safe_load((ROOT / "cluster_specs" / "cpu-local-4.yaml").read_text())
    data["nodes"][0]["gpus_per_node"] = devices
    data["nodes"][0].pop("cores", None)
    if cores is not None:
        data["nodes"][0]["cores"] = cores
    data.pop("profiles", None)
    return cluster_from_dict(data, "cpu-test.yaml")


def _plans():
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    from test_profile_e2e import data_parallel_plan, pipeline_plan
    return pipeline_plan, data_parallel_plan


def test_evaluate_unchanged_without_oversubscription():
    pipeline_plan, data_parallel_plan = _plans()
    for plan in (pipeline_plan(4, cluster="cpu-test"), data_parallel_plan(1, 2, cluster="cpu-test"),
                 pipeline_plan(2, cluster="cpu-test")):
        base = evaluate(_cpu_cluster(None), plan)
        for cores in (4, 8):
            same = evaluate(_cpu_cluster(cores), plan)
            assert same.iteration_time_s == base.iteration_time_s
            assert same.breakdown_s == base.breakdown_s and same.details == base.details
    # two devices of four used on 2 cores: no sharing either
    plan = pipeline_plan(2, cluster="cpu-test")
    assert evaluate(_cpu_cluster(2), plan).iteration_time_s == evaluate(_cpu_cluster(None), plan).iteration_time_s


def test_evaluate_prices_a_four_stage_pipeline_on_two_cores():
    pipeline_plan, _ = _plans()
    plan = pipeline_plan(4, cluster="cpu-test")
    base, shared = evaluate(_cpu_cluster(None), plan), evaluate(_cpu_cluster(2), plan)
    term = {k: v for k, v, _ in shared.details}["core_sharing_s"]
    assert term > 0
    assert shared.iteration_time_s == pytest.approx(base.iteration_time_s + term)
    assert sum(shared.breakdown_s.values()) == pytest.approx(shared.iteration_time_s)
    assert shared.breakdown_s["bubble"] == base.breakdown_s["bubble"]
    # Bounds: never faster than the busiest stage's 4 micro-batches each alone, nor than the
    # whole job's compute on 2 cores; never slower than everything on 2 cores at half speed.
    work = sum(s.forward_s + s.backward_s for s in shared.stages) * plan.num_micro_batches
    assert work / 2 <= shared.pipeline_time_s <= 2 * base.pipeline_time_s
    explain = next(f for k, _, f in shared.details if k == "core_sharing_s")
    assert "4 devices on 2 cores" in explain and "search prices without" in explain


def test_evaluate_data_parallel_replicas_share_cores_in_the_closed_form_too():
    # One stage, 4 replicas of share 1 on 2 cores: each op at half speed, optimizer steps too.
    _, data_parallel_plan = _plans()
    plan = data_parallel_plan(1, 4, micro_batch_size=4, cluster="cpu-test")
    base, shared = evaluate(_cpu_cluster(None), plan), evaluate(_cpu_cluster(2), plan)
    assert shared.pipeline_time_s == pytest.approx(2 * base.pipeline_time_s)
    assert shared.breakdown_s["optimizer"] == pytest.approx(2 * base.breakdown_s["optimizer"])


def test_cores_field_is_checked_with_its_location(tmp_path):
    spec = tmp_path / "c.yaml"
    for bad, why in (("0", "greater than 0"), ("1.5", "integer"), ("two", "integer")):
        spec.write_text("name: c\nnodes:\n  - name: cpu\n"
                        "    gpu: {name: cpu, memory: 4 GB, peak_tflops: 0.078, memory_bandwidth: 12.5 GB/s,"
                        " intra_node_bandwidth: 1 GB/s}\n"
                        f"    gpus_per_node: 4\n    network_bandwidth: 8 Gbit/s\n    cores: {bad}\n")
        with pytest.raises(InputErrors) as exc:
            load_cluster(spec)
        assert "c.yaml:7:" in str(exc.value) and "nodes[0].cores" in str(exc.value) and why in str(exc.value)
    spec.write_text(spec.read_text().replace("cores: two", "cores: 2"))
    assert load_cluster(spec).nodes[0].cores == 2


def test_the_baseline_is_compared_with_the_sharing_the_answer_is_evaluated_with():
    """An unseen-cluster sweep's find: on two 4-GPU nodes with 2 cores each the search prices
    without processor sharing (docs/profiles.md) and the answer's evaluation adds it, so the
    best baseline, left at the search's price, read 0.54x of the answer ("as good as").  The
    baseline is now evaluated too: its objective holds the sharing and the ratio is the two
    evaluated times'."""
    from planner.search import solve
    from planner.spec import Training, load_model

    def run(cores):
        node = {"name": "c", "count": 2, "gpu": "A10G-24GB", "gpus_per_node": 4, "network_bandwidth": "50 Gbit/s"}
        cluster = cluster_from_dict({"name": "shared", "nodes": [node | ({"cores": cores} if cores else {})]})
        return solve(cluster, load_model("opt-350m"), Training(global_batch_size=64, seq_len=2048),
                     time_limit_s=4).report

    shared, alone = run(2), run(None)
    theirs = shared.model_extra["baseline_objective"]
    assert theirs > 1.5 * alone.model_extra["baseline_objective"]      # the sharing is in it
    assert shared.model_extra["baseline_ratio"] == pytest.approx(theirs / shared.objective)
    assert alone.model_extra["baseline_ratio"] >= 1.0     # priced alike, the answer is never worse
