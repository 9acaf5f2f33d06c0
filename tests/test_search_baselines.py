"""Baselines (issue 18): the uniform Megatron layouts and the Sailor- / Metis-like greedy
layouts are priced by the cost model, seed the search, and no answer is worse than them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from planner.cost import evaluate, topology_for
from planner.search import solve
from planner.search.baselines import _proportional, _spread, _Tuple, layouts_of, seed
from planner.search.classes import class_infos
from planner.search.incumbent import Best
from planner.search.knobs import enumerate_knobs, make_context
from planner.search.naming import build_plan
from planner.search.objectives import ObjectiveSpec
from planner.search.queue import Ranked
from planner.search.space import Pricer
from planner.search.tuple_inputs import usable_keys
from planner.spec import Training, cluster_from_dict, load_cluster, load_model

SPECS = Path(__file__).resolve().parent.parent / "cluster_specs"

MIXED = {"name": "mixed-2x4", "nodes": [
    {"name": "a", "gpu": "A100-SXM4-80GB", "gpus_per_node": 4, "price_per_hour": 16.0},
    {"name": "v", "gpu": "V100-SXM2-32GB", "gpus_per_node": 4, "price_per_hour": 9.0}]}
TWO_ZONES = {"name": "two-zone", "zones": [{"name": "za"}, {"name": "zb"}],
             "links": [{"between": ["za", "zb"], "bandwidth": "10 Gbit/s", "latency": "20 ms"}], "nodes": [
    {"name": "a", "count": 2, "zone": "za", "gpu": "A100-SXM4-80GB", "gpus_per_node": 2},
    {"name": "l", "count": 2, "zone": "zb", "gpu": "L4-24GB", "gpus_per_node": 2}]}


# lab-mixed's 96 GPUs with fewer knobs, so that every baseline is priced in seconds
LAB = Training(global_batch_size=16, seq_len=1024, precision="fp16", recompute_modes=("none",), zero_stages=(1,))


def _cases():
    return [
        ("mixed-2x4", cluster_from_dict(MIXED), "opt-350m", Training(global_batch_size=8, seq_len=1024, precision="fp16")),
        ("two-zone", cluster_from_dict(TWO_ZONES), "opt-350m", Training(global_batch_size=4, seq_len=1024)),
        ("lab-mixed", load_cluster(SPECS / "lab-mixed.yaml"), "opt-350m", LAB),
        pytest.param(("three-zone", load_cluster(SPECS / "three-zone.yaml"), "gpt-neo-2.7b",
                      Training(global_batch_size=64, seq_len=2048)), marks=pytest.mark.slow),
        ("tiny-mixed", load_cluster(SPECS / "tiny-mixed.yaml"), "opt-350m", Training(global_batch_size=8, seq_len=512)),
    ]


THROUGHPUT = ObjectiveSpec()


def all_baselines(cluster, model, training, spec=THROUGHPUT, launcher=None):
    """Every baseline of every knob tuple (none skipped by a bound or a time share)."""
    topo = topology_for(cluster)
    classes = class_infos(topo, training.precision)
    pricer = Pricer(model, training, classes, topo)
    ranked = []
    for i, knobs in enumerate(enumerate_knobs(model, training, classes, launcher)):
        ranked.append(Ranked(0.0, i, knobs, make_context(model, training, knobs), usable_keys(pricer, knobs, launcher, spec)))
    best = Best(10**6)
    result = seed(pricer, ranked, spec, launcher, best, stop_at=math.inf)
    return result, best, classes, pricer, ranked


@pytest.mark.parametrize("case", _cases(), ids=["mixed-2x4", "two-zone", "lab-mixed", "three-zone", "tiny-mixed"])
def test_answer_never_worse_than_any_baseline(case):
    _, cluster, model_name, training = case
    model = load_model(model_name)
    result, best, classes, _, _ = all_baselines(cluster, model, training)
    assert result.complete and result.best is not None and best.items
    res = solve(cluster, model, training, time_limit_s=20)
    assert res.evaluation.iteration_time_s <= result.best.time_s * (1 + 1e-9)
    rep = res.report.model_extra
    assert rep["baseline_ratio"] >= 1 - 1e-9
    assert rep["baseline"].split(":")[0] in ("megatron", "sailor", "metis")
    # the plan file keeps which baseline and the ratio
    kept = res.plan.solver.for_plan().model_extra
    assert kept["baseline"] == rep["baseline"] and kept["baseline_ratio"] == rep["baseline_ratio"]
    # the best baseline's price is the cost model's: its plan evaluates to the same time
    top = result.best
    plan = build_plan(cluster, model, training, classes, top.knobs, top.layout, ObjectiveSpec().to_plan_objective())
    assert math.isclose(evaluate(cluster, plan, model=model).iteration_time_s, top.time_s, rel_tol=1e-9)


def test_rules_keep_their_shapes():
    """Megatron: one (t, d) on every stage and an even split; Sailor: one d; Metis: blocks by
    speed over several classes, all blocks placed."""
    cluster, model = cluster_from_dict(MIXED), load_model("opt-350m")
    training = Training(global_batch_size=8, seq_len=1024, precision="fp16")
    _, _, _, pricer, ranked = all_baselines(cluster, model, training)
    rules = set()
    for _, _, knobs, ctx, keys in ranked:
        tup = _Tuple(pricer, knobs, ctx, keys)
        for lay in layouts_of(tup):
            rules.add(lay.rule)
            assert len(lay.keys) == knobs.num_stages
            if lay.rule == "megatron":
                assert len({(k.tp, k.replicas) for k in lay.keys}) == 1 and lay.units is None
                assert knobs.micro_batch_size % lay.keys[0].replicas == 0
            if lay.rule == "sailor":
                assert len({k.replicas for k in lay.keys}) == 1 and lay.units is None
            if lay.rule == "metis":
                assert len({k.cls for k in lay.keys}) > 1 and sum(lay.units) == tup.L_units
    assert rules == {"megatron", "sailor", "metis"}


def test_spread_and_proportional():
    assert _spread((4, 4), 4) == (2, 2)
    assert _spread((6, 2), 4) == (3, 1)
    assert _spread((1, 1), 3) is None
    assert sum(_spread((5, 3, 1), 7)) == 7
    assert _proportional([2.0, 1.0], 6) == [4, 2]
    assert _proportional([1.0, 1.0, 1.0], 2) is None
    assert all(u >= 1 for u in _proportional([100.0, 1.0], 5))


def test_launcher_baselines_are_launchable():
    """With --launcher megatron the baselines the search takes have one (t, d) per stage."""
    cluster, model = load_cluster(SPECS / "lab-mixed.yaml"), load_model("opt-350m")
    training = LAB
    result, best, _, _, _ = all_baselines(cluster, model, training, launcher="megatron")
    assert best.items
    for cand in best.items:
        assert len({(k.tp, k.replicas) for k, _ in cand.layout}) == 1
    res = solve(cluster, model, training, time_limit_s=20, launcher="megatron")
    assert res.evaluation.iteration_time_s <= result.best.time_s * (1 + 1e-9)


def test_cost_objectives_take_the_baselines():
    """Under cost and a tokens/s floor, baselines are keyed by the objective and meet the floor."""
    cluster, model = load_cluster(SPECS / "lab-mixed.yaml"), load_model("opt-350m")
    training = LAB
    cost = ObjectiveSpec("cost")
    result, _, _, _, _ = all_baselines(cluster, model, training, spec=cost)
    res = solve(cluster, model, training, objective="cost", time_limit_s=20)
    assert res.report.objective <= result.best.key[0] * (1 + 1e-9)
    assert res.report.model_extra["baseline_ratio"] >= 1 - 1e-9
    floor = 0.5 * training.global_batch_size * training.seq_len / result.best.time_s
    spec = ObjectiveSpec("cost-above-floor", min_tokens_per_s=floor)
    above, best, _, _, _ = all_baselines(cluster, model, training, spec=spec)
    cap = training.global_batch_size * training.seq_len / floor
    assert best.items and all(c.time_s <= cap * (1 + 1e-12) for c in best.items)
    res = solve(cluster, model, training, objective="cost", min_tokens_per_s=floor, time_limit_s=20)
    assert res.report.objective <= above.best.key[0] * (1 + 1e-9)
