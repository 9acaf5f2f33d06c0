"""Plans on the options the position LPs weigh most (support_plans.py), for the knob tuples too
big for the exact MILP: honest incumbents, never better than a tuple's optimum, and taken by
the search."""

from __future__ import annotations

import importlib
import math
import random

from test_oracle import case_pricer, make_case

from planner.search import solve
from planner.search.bound import KnobBound
from planner.search.core.brute import assignments
from planner.search.core.milp import MilpSettings
from planner.search.incumbent import Best
from planner.search.knobs import enumerate_knobs, make_context
from planner.search.objectives import ObjectiveSpec
from planner.search.oracle import oracle
from planner.search.support_plans import Planning, support_plan


def _lp_tuples(seeds, per_case: int):
    """Knob tuples of two or more stages from the oracle cases, each bounded at the LP level
    (so its position LPs ran): (pricer, knob bound, knobs, context, keys)."""
    for seed in seeds:
        cluster, model, training = make_case(seed)
        classes, pricer = case_pricer(cluster, model, training)
        knob_bound = KnobBound(pricer)
        tuples = [k for k in enumerate_knobs(model, training, classes) if k.num_stages >= 2]
        for knobs in random.Random(seed).sample(tuples, min(per_case, len(tuples))):
            ctx = make_context(model, training, knobs)
            keys = pricer.option_keys(knobs)
            knob_bound(knobs, ctx, keys, packed=2)
            yield pricer, knob_bound, knobs, ctx, keys


def test_support_plans_are_plans_of_the_tuple_and_no_better_than_its_optimum():
    """The LPs' options are the tuple's own; the plan found on them (polished over all the
    tuple's options) is one of the tuple's plans, priced exactly: its time is at least the
    tuple's brute-force optimum and equals the brute force's price of the same layout.  Not
    vacuous: most tuples whose LPs ran give a plan, and some reach the optimum."""
    spec = ObjectiveSpec()
    found = optimal = with_support = 0
    for pricer, knob_bound, knobs, ctx, keys in _lp_tuples(range(24), 6):
        support = knob_bound.support(knobs, 6)
        if not support:
            continue
        with_support += 1
        assert set(support) <= set(keys) and len(support) <= 6
        prob = pricer.price(knobs, ctx, keys)
        times = [prob.objective(a) for a in assignments(prob)]
        if not times:
            continue
        best = Best(1)
        improved = support_plan(Planning(pricer, knob_bound, spec, None, best, MilpSettings(time_limit_s=10),
                                         math.inf), knobs, ctx, keys)
        assert improved == bool(best.items)
        if not best.items:
            continue
        cand = best.items[0]
        found += 1
        assert cand.knobs == knobs and {k for k, _ in cand.layout} <= set(keys)
        assert cand.time_s >= min(times) * (1 - 1e-9), (knobs, cand.time_s, min(times))
        optimal += cand.time_s <= min(times) * (1 + 1e-9)
    assert with_support >= 30, with_support
    assert found >= with_support // 2, (found, with_support)
    assert optimal >= 5, optimal


def test_search_takes_support_plans_for_tuples_too_big_for_the_milp(monkeypatch):
    """With every tuple of three or more stages made too big for the exact MILP (the pair
    limit at 0) and eight plans asked (so that such tuples are priced, not pruned), the search
    hands them to the support plans before the relaxation and takes the plans they give; each
    plan it returns stays a true plan, priced as ``evaluate`` prices it and no better than the
    oracle's optimum."""
    solve_module = importlib.import_module("planner.search.solve")
    monkeypatch.setattr(solve_module, "MAX_PAIR_TERMS", 0)
    cluster, model, training = make_case(20, max_plans=600)
    res = solve(cluster, model, training, time_limit_s=30.0, top_k=8)
    report = res.report
    assert report.knob_tuples_too_big >= 1 and report.support_plans >= 1, report
    assert report.priced_vs_evaluated_rel < 1e-9
    ref = oracle(cluster, model, training)
    assert res.plan.solver.objective >= ref.value * (1 - 1e-9)


def test_run_layouts_are_plans_no_better_than_the_optimum_and_often_it():
    """runs.run_layouts on the tuples' support options (with the LPs' weights): every plan it
    returns is feasible and priced as CoreProblem prices it, never below the brute-force
    optimum over the same options, and equal to it on many tuples (the layouts it builds are
    the regular ones good plans have)."""
    from planner.search.runs import run_layouts
    built = optimal = 0
    for pricer, knob_bound, knobs, ctx, keys in _lp_tuples(range(24), 6):
        weights = knob_bound.support(knobs, 6)
        if not weights:
            continue
        prob = pricer.price(knobs, ctx, list(weights))
        feasible = [prob.objective(a) for a in assignments(prob) if prob.feasible(a)]
        got = run_layouts(prob, [weights[o.label] for o in prob.options], math.inf)
        if got is None:
            continue
        t, assign = got
        built += 1
        assert prob.feasible(assign) and math.isclose(t, prob.objective(assign), rel_tol=1e-12)
        assert feasible and t >= min(feasible) * (1 - 1e-9), (knobs.label(), t, min(feasible))
        optimal += t <= min(feasible) * (1 + 1e-9)
    print(f"{built} tuples with a run layout, {optimal} at the optimum over their options")
    assert built >= 30 and optimal >= built // 2, (built, optimal)


def test_run_layouts_take_the_mixes_nearest_the_weights_first():
    """With more layouts than the cap (six options, twelve stages), the stage-count mixes
    nearest the LP's weights are laid out first: the weights' own mix is among those kept
    (the first version walked the mixes from the fewest stages up and dropped it), and the
    cap holds."""
    from types import SimpleNamespace

    import numpy as np

    from planner.search.runs import _sequences
    prob = SimpleNamespace(num_stages=12, options=[None] * 6, wrap=False)
    ev = SimpleNamespace(units=np.zeros((6, 1)), capacity=np.array([1.0]))
    seqs = _sequences(prob, ev, [2.0] * 6, 20_000)
    assert 0 < len(seqs) <= 20_000
    counts = {tuple(np.bincount(s, minlength=6)) for s in seqs}
    assert (2,) * 6 in counts
    assert len(_sequences(prob, ev, [2.0] * 6, 10**9)) > 20_000       # the cap did bind
