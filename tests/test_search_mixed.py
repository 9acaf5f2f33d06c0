"""Mixed stages (planner/search/mixed.py): two node classes of one zone in one stage, each
kind with its own TP and share.  Their pricing must be evaluate's, their stand-ins must keep
every knob bound below the tuple's optimum, and the search must find the oracle's optimum
over the space that holds them."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_oracle import case_pricer, check_case, make_case

from planner.cost import evaluate
from planner.plan.model import Objective
from planner.search.core.brute import assignments, solve_brute
from planner.search.incumbent import layout
from planner.search.knobs import enumerate_knobs, make_context, tp_degrees
from planner.search.mixed import MixedKey, MixedPiece, _splits, mixed_keys
from planner.search.naming import build_plan


def mixed_case(seed: int):
    """The oracle's case of ``seed`` with mixed stages on; None when it has none (no two
    classes share a zone)."""
    cluster, model, training = make_case(seed)
    training = training.model_copy(update={"mixed_stages": True})
    classes, _ = case_pricer(cluster, model, training)
    if not any(mixed_keys(model, training, classes, B, tp_degrees) for B in (2, 4, 8)):
        return None
    return cluster, model, training


MIXED_SEEDS = [s for s in range(40) if mixed_case(s) is not None]


def test_declared_shares_sum_to_the_micro_batch_nearest_the_ratio():
    for B, na, nb in itertools.product(range(2, 33), range(1, 9), range(1, 9)):
        for ratio in (0.3, 1.0, 2.5):
            got = _splits(B, na, nb, ratio)
            sols = [(sa, sb) for sb in range(1, B) for sa in range(1, B) if na * sa + nb * sb == B]
            assert all(s in sols for s in got)
            assert bool(got) == bool(sols)
            below = [s for s in sols if s[0] <= ratio * s[1]]
            if below:       # the nearest from below is there
                assert max(s[0] / s[1] for s in below) in [s[0] / s[1] for s in got]


def test_mixed_keys_pair_classes_of_one_zone_on_whole_nodes():
    seen = 0
    for seed in MIXED_SEEDS:
        cluster, model, training = mixed_case(seed)
        classes, _ = case_pricer(cluster, model, training)
        for B in (2, 4, 8):
            for key in mixed_keys(model, training, classes, B, tp_degrees):
                a, b = (classes[k.cls] for k in key.kinds)
                assert a.zone == b.zone and a.index < b.index
                assert key.a.replicas * key.a.share + key.b.replicas * key.b.share == B
                for k in key.kinds:
                    info = classes[k.cls]
                    if not info.shared_node:     # whole nodes of a class of several
                        assert k.replicas % (info.gpus_per_node // k.tp) == 0
                seen += 1
    assert seen >= 50


def test_mixed_options_price_as_evaluate():
    """Every assignment with a mixed stage: the core objective is evaluate's iteration time of
    the plan naming builds (slowest replica per block range, the ring over both kinds, the
    sends by each side's shares), and the plan fits in memory.  Nineteen seeds: with the first
    twelve, the bf16 training-shape ceiling (benchmarks.yaml) left four cases where a mixed stage
    wins (it moved the A100 / V100 speed ratio), the next two seeds have none, 28 has two."""
    checked = mixed_won = 0
    for seed in MIXED_SEEDS[:19]:
        cluster, model, training = mixed_case(seed)
        classes, pricer = case_pricer(cluster, model, training)
        rng = random.Random(seed)
        tuples = enumerate_knobs(model, training, classes)
        for knobs in rng.sample(tuples, min(10, len(tuples))):
            ctx = make_context(model, training, knobs)
            prob = pricer.price(knobs, ctx, [*pricer.option_keys(knobs), *pricer.stand_ins(knobs)])
            mixed = {i for i, o in enumerate(prob.options) if isinstance(o.label, MixedPiece)}
            with_mixed = [a for a in itertools.islice(assignments(prob), 20000) if any(o in mixed for o, _ in a)]
            for a in rng.sample(with_mixed, min(8, len(with_mixed))):
                plan = build_plan(cluster, model, training, classes, knobs, layout(prob, a, knobs),
                                  Objective(kind="throughput"))
                ev = evaluate(cluster, plan, model=model)
                assert ev.fits, (seed, knobs.label(), a)
                assert math.isclose(prob.objective(a), ev.iteration_time_s, rel_tol=1e-9), (seed, knobs.label(), a)
                assert math.isclose(prob.price(a), ev.nodes_usd_per_hour or 0.0, rel_tol=1e-9, abs_tol=1e-9)
                checked += 1
            best = solve_brute(prob)[0]
            mixed_won += best.ok and any(o in mixed for o, _ in best.assign)
    assert checked >= 150 and mixed_won >= 5, (checked, mixed_won)


def test_knob_bounds_with_stand_ins_hold():
    """Every level of the knob bound over options and mixed stages' stand-ins stays at most
    the tuple's optimum over options and mixed stages (brute force); and over the stand-ins
    alone at most the optimum of the plans whose every stage is mixed, where nothing else
    can hold the bound down."""
    from planner.search.bound import KnobBound
    checked = alone = tight = 0
    for seed in MIXED_SEEDS[:16]:
        cluster, model, training = mixed_case(seed)
        classes, pricer = case_pricer(cluster, model, training)
        knob_bound = KnobBound(pricer)
        tuples = enumerate_knobs(model, training, classes)
        for knobs in random.Random(seed).sample(tuples, min(10, len(tuples))):
            ctx = make_context(model, training, knobs)
            stand_ins = pricer.stand_ins(knobs)
            for keys in ([*pricer.option_keys(knobs), *stand_ins], stand_ins):
                if not keys:
                    continue
                best = solve_brute(pricer.price(knobs, ctx, keys))[0]
                if not best.ok:
                    continue
                bounds = [knob_bound(knobs, ctx, keys, memory=False),
                          *(knob_bound(knobs, ctx, keys, packed=level) for level in range(4)),
                          knob_bound(knobs, ctx, keys, enough=best.objective * 0.98),
                          knob_bound(knobs, ctx, keys, enough=best.objective * 1.02)]
                assert max(bounds) <= best.objective * (1 + 1e-9), (seed, knobs.label(), bounds, best.objective)
                checked += 1
                alone += keys is stand_ins
                tight += keys is stand_ins and max(bounds) >= 0.9 * best.objective
    assert checked >= 100 and alone >= 40 and tight >= alone // 3, (checked, alone, tight)


@pytest.mark.parametrize("seed", MIXED_SEEDS)
def test_solver_equals_oracle_with_mixed_stages(seed):
    check_case(*mixed_case(seed))


@given(st.integers(1000, 10**6))
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_solver_equals_oracle_with_mixed_stages_hypothesis(seed):
    cluster, model, training = make_case(seed, max_plans=800)
    training = training.model_copy(update={"mixed_stages": True})
    check_case(cluster, model, training)


def test_mixed_stages_win_some_oracle_cases():
    """Not vacuous: in some cases the oracle's best plan has a stage of two kinds."""
    from planner.search.oracle import oracle
    won = 0
    for seed in MIXED_SEEDS:
        ref = oracle(*mixed_case(seed))
        won += ref.plan is not None and any(len({(r.gpu_type, r.tp) for r in stage.replicas}) > 1
                                            for stage in ref.plan.stages)
    # One of the 24 cases under the per-GEMM cost model (two of the first 14 under the old
    # curve, which priced a small share's GEMMs no worse than a large one's); none in seeds
    # 40-160 either.  One case where the oracle's best is mixed is what keeps the equality
    # tests above from being vacuous.
    assert won >= 1, won


@pytest.mark.parametrize("seed", MIXED_SEEDS[:6])
def test_cost_objectives_equal_oracle_with_mixed_stages(seed):
    """USD per token, throughput under a budget and USD/hour above a tokens/s floor: the
    cost walk (per_tuple.py) and the floors (floors.py) over stand-ins."""
    from test_search_objectives import check_budget_and_floor
    cluster, model, training = mixed_case(seed)
    check_case(cluster, model, training, objective="cost")
    check_budget_and_floor(cluster, model, training)


def test_mixed_key_is_one_stage_of_two_kinds_in_the_plan():
    cluster, model, training = mixed_case(MIXED_SEEDS[0])
    classes, pricer = case_pricer(cluster, model, training)
    knobs = next(k for k in enumerate_knobs(model, training, classes) if pricer.stand_ins(k) and k.num_stages == 1)
    key: MixedKey = pricer.stand_ins(knobs)[0].key
    plan = build_plan(cluster, model, training, classes, knobs, [(key, model.num_layers)], Objective(kind="throughput"))
    stage = plan.stages[0]
    assert [r.micro_batch_share for r in stage.replicas] == [key.a.share] * key.a.replicas + [key.b.share] * key.b.replicas
    assert {r.gpu_type for r in stage.replicas} == {classes[k.cls].gpu.name for k in key.kinds}


def test_a_gpipe_tuple_reads_its_own_stand_in_lines_after_its_1f1b_twin(monkeypatch):
    """Under 1F1B a stand-in takes one kind's forward and backward (their sum is at most the
    stage's); GPipe reads them apart, so it needs the least of each.  The knob bound caches
    the lines per option list: a GPipe tuple bounded after its 1F1B twin must not read the
    twin's.  Every forward line the GPipe tuple reads stays at most the mixed stage's own."""
    from planner.search.bound import KnobBound
    from planner.search.knobs import Knobs
    from planner.search.term_parts import TermParts
    checked = 0
    for seed in MIXED_SEEDS[:10]:
        cluster, model, training = mixed_case(seed)
        training = training.model_copy(update={"schedules": ("1f1b", "gpipe")})
        classes, pricer = case_pricer(cluster, model, training)
        for k1 in enumerate_knobs(model, training, classes):
            if k1.schedule != "1f1b" or k1.num_stages < 2 or not pricer.stand_ins(k1):
                continue
            kg = Knobs(k1.micro_batch_size, k1.num_micro_batches, "gpipe", 1, k1.recompute, k1.zero_stage,
                       k1.num_stages)
            ctx = make_context(model, training, k1)
            keys = pricer.stand_ins(k1)
            bound = KnobBound(pricer)
            read = {}
            parts = TermParts._build

            def spy(self, knobs, arrays, *args, parts=parts, read=read):
                read[knobs.schedule] = arrays
                return parts(self, knobs, arrays, *args)

            monkeypatch.setattr(TermParts, "_build", spy)
            bound(k1, ctx, keys, memory=False)
            bound(kg, ctx, keys, memory=False)
            monkeypatch.undo()
            arrays = read["gpipe"]
            prob = pricer.price(kg, ctx, keys)
            for i, stand_in in enumerate(keys):
                for o in prob.options:
                    if o.label.key != stand_in.key:
                        continue
                    for s in range(kg.num_stages):
                        if o.fixed[s] is None:
                            continue
                        pos = 1 if s == 0 else 2 if s == kg.num_stages - 1 else 0
                        for nb in range(o.least_blocks(s), o.max_blocks[s] + 1):
                            line = arrays.slopes[i, 0] * nb + arrays.icpt[i, pos, 0]
                            assert line <= (o.slope[0] * nb + o.fixed[s][0]) * (1 + 1e-9), (seed, kg.label())
                            checked += 1
            break       # one tuple per case
    assert checked >= 50, checked


FEW_FAST = {"name": "few-fast", "zones": [{"name": "lab", "region": "onprem"}], "nodes": [
    {"name": "hbox", "zone": "lab", "gpu": "H100-PCIE-80GB", "gpus_per_node": 2, "network_bandwidth": "100 Gbit/s"},
    {"name": "t4", "count": 6, "zone": "lab", "gpu": "T4-16GB", "gpus_per_node": 4, "network_bandwidth": "25 Gbit/s"},
    {"name": "v100", "count": 2, "zone": "lab", "gpu": "V100-SXM2-16GB", "gpus_per_node": 8,
     "network_bandwidth": "100 Gbit/s"}]}


def test_mixed_stages_start_from_the_space_without_them():
    """A sweep's two H100 beside 24 T4 and 16 V100: with mixed stages the search returned a plan
    17% slower than without them in the same 20 s (their stand-ins bound loosely and their LPs
    cost ~6x).  The space without them now goes first (solve._pure_first), so the answer is
    never worse than that search's at its share of the time.  Under a work budget the two
    compare exactly: the pure search at that share of the limit and budget is the first phase
    (a budget small enough that the wall clock does not stop either run)."""
    from planner.search import solve
    from planner.search.solve import MIXED_PURE_SHARE
    from planner.spec import Training, cluster_from_dict, load_model
    cluster, model = cluster_from_dict(FEW_FAST), load_model("llama2-7b")
    pure = Training(global_batch_size=128, seq_len=2048, precision="fp16")
    limit_s, budget = 60.0, 100_000
    alone = solve(cluster, model, pure, time_limit_s=MIXED_PURE_SHARE * limit_s,
                  work_budget=round(MIXED_PURE_SHARE * budget))
    mixed = solve(cluster, model, pure.model_copy(update={"mixed_stages": True}), time_limit_s=limit_s,
                  work_budget=budget)
    assert not alone.report.wall_clock_bound and not mixed.report.wall_clock_bound
    assert mixed.report.objective <= alone.report.objective * (1 + 1e-12)
    assert mixed.report.pure_phase_s > 0 and isinstance(mixed.report.answer_from_pure_phase, bool)
    assert mixed.plan.inputs.training["mixed_stages"] is True


def test_a_ctrl_c_before_the_whole_spaces_phase_keeps_the_plan_but_claims_no_bound(monkeypatch):
    """Between the two phases the state still held the first phase's bounds, which cover only
    the space without mixed stages: a Ctrl-C there reported its optimum, 0.0300 s, as proved
    (gap 0) where mixed stages reach 0.0179 s (a review's reproduction, oracle case 28)."""
    import importlib
    solve_module = importlib.import_module("planner.search.solve")
    cluster, model, training = mixed_case(28)
    real = solve_module.given_candidates

    def interrupted(cluster, model, training, *args, **kwargs):
        if training.mixed_stages:       # the second phase's first step
            raise KeyboardInterrupt
        return real(cluster, model, training, *args, **kwargs)

    monkeypatch.setattr(solve_module, "given_candidates", interrupted)
    result = solve_module.solve(cluster, model, training, time_limit_s=10)
    assert result.report.interrupted and result.report.bound is None and result.report.gap is None
    assert result.plan.inputs.training["mixed_stages"] is True


def test_a_launcher_with_mixed_stages_is_refused_before_any_search(monkeypatch):
    import importlib

    from planner.errors import InputError
    solve_module = importlib.import_module("planner.search.solve")
    cluster, model, training = mixed_case(28)
    monkeypatch.setattr(solve_module, "_search", lambda *a, **k: pytest.fail("searched before refusing"))
    with pytest.raises(InputError, match="contradict --launcher megatron"):
        solve_module.solve(cluster, model, training, time_limit_s=10, launcher="megatron")


def test_a_live_display_shows_no_bound_while_the_first_phase_runs():
    """The watch read the first phase's bound (its subspace's) as the search's proved one."""
    import time

    from planner.search.incumbent import Best, Candidate
    from planner.search.objectives import ObjectiveSpec
    from planner.search.stats import SearchStats
    from planner.search.watch import SearchWatch
    from planner.spec import Training
    best = Best(1)
    from planner.search.knobs import Knobs
    best.add(Candidate((2.0,), 2.0, 1.0, Knobs(8, 1, "1f1b", 1, "none", 0, 1), []))
    stats = SearchStats(knobs=1)
    stats.frontier = 1.5
    watch = SearchWatch({"best": best, "spec": ObjectiveSpec(), "training": Training(global_batch_size=8, seq_len=8),
                         "bounds": [1.8], "stats": stats, "t0": time.monotonic()})
    assert watch.snapshot().bound == 1.5
    watch.state["subspace"] = True
    snap = watch.snapshot()
    assert snap.bound is None and snap.gap is None and snap.best_value == 2.0
