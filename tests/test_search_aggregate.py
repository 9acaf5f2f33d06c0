"""The send-keeping aggregate (core/aggregate.py): every plan of a CoreProblem maps to a plan of
its aggregate that is feasible and no slower, so the aggregate's optimum bounds the original's;
on priced knob tuples of the oracle's cases it stays below the tuple's exact optimum (and so
below the oracle's best plan of that tuple), and across a slow zone link it bounds above the
relaxation that drops the sends."""

from __future__ import annotations

import random

import pytest
from test_oracle import case_pricer, make_case
from test_search_core import _with_min_term, mixed_problem, random_problem

from planner.search.core import Row, Term
from planner.search.core.aggregate import aggregate, group_options
from planner.search.core.brute import assignments, solve_brute
from planner.search.incumbent import prepare
from planner.search.knobs import enumerate_knobs, make_context
from planner.search.objectives import ObjectiveSpec
from planner.spec import Training, cluster_from_dict, load_model


def _problem(seed: int):
    """Plain, mixed-stage (extra uses, least blocks) or min-term (ZB-H1's kind) problems; the
    plain ones' hinge ``-0.1 f + optimizer`` and the min term read quantities with a negative
    sign, so the most lines are exercised too."""
    rng = random.Random(9000 + seed)
    kind = seed % 3
    if kind == 0:
        return rng, random_problem(rng)
    if kind == 1:
        return rng, mixed_problem(rng)
    return rng, _with_min_term(random_problem(rng), rng)


def _random_groups(prob, rng: random.Random) -> list[list[int]]:
    """Arbitrary groups (any options together, whatever their resources and units), of the
    same group where the problem asks every stage to agree on it."""
    K = len(prob.options)
    out: dict = {}
    for o in range(K):
        out.setdefault((rng.randrange(max(1, K // 2)), prob.options[o].group if prob.same_group else None),
                       []).append(o)
    return list(out.values())


@pytest.mark.parametrize("seed", range(60))
def test_every_plan_maps_to_a_feasible_no_slower_aggregate_plan(seed):
    rng, prob = _problem(seed)
    agg, groups = aggregate(prob, _random_groups(prob, rng))
    of = {o: g for g, members in enumerate(groups) for o in members}
    assert sorted(of) == list(range(len(prob.options)))
    seen = 0
    for a in assignments(prob):
        mapped = [(of[o], nb) for o, nb in a]
        assert agg.feasible(mapped), (a, mapped)
        assert agg.objective(mapped) <= prob.objective(a) + 1e-9 * (1 + abs(prob.objective(a)))
        seen += 1
    best, bound = solve_brute(prob)[0], solve_brute(agg)[0]
    if seen:
        assert bound.ok and bound.objective <= best.objective + 1e-9 * (1 + abs(best.objective))


def test_the_mapping_is_checked_on_enough_plans_and_signs():
    """The property above is not vacuous: most problems have plans, some read a quantity with
    a negative sign (most lines), and the aggregate is often strictly below the original."""
    planned = negative = lower = 0
    for seed in range(60):
        rng, prob = _problem(seed)
        agg, _ = aggregate(prob, _random_groups(prob, rng))
        negative += agg.num_quantities > prob.num_quantities
        best, bound = solve_brute(prob)[0], solve_brute(agg)[0]
        if best.ok:
            planned += 1
            lower += bound.objective < best.objective * (1 - 1e-6)
    assert planned >= 20 and negative >= 15 and lower >= 10, (planned, negative, lower)


def test_default_groups_hold_equal_units_and_merging_meets_the_pair_budget():
    rng = random.Random(4)
    for _ in range(50):
        prob = mixed_problem(rng)
        groups = group_options(prob)
        for g in groups:
            assert len({prob.options[o].uses() for o in g}) == 1
        agg, _ = aggregate(prob, groups)
        # equal units: the aggregate holds exactly what its members hold
        for rep, g in zip(agg.options, groups):
            assert rep.uses() == prob.options[g[0]].uses()
        budget = max(1, prob.num_boundaries)
        merged = group_options(prob, max_pairs=budget * 2 ** 2)
        buckets = {(prob.options[o].resource, prob.options[o].group if prob.same_group else None)
                   for o in range(len(prob.options))}
        assert len(merged) ** 2 * budget <= budget * 4 or len(merged) == len(buckets)
        assert sorted(o for g in merged for o in g) == list(range(len(prob.options)))


def test_terms_it_cannot_bound_are_refused():
    rng = random.Random(1)
    prob = random_problem(rng)
    prob.terms = [*prob.terms, Term("sum", 0, -1.0)]
    with pytest.raises(ValueError):
        aggregate(prob)
    prob = random_problem(random.Random(2))
    while prob.boundary is None:
        prob = random_problem(rng)
    prob.rows = [*prob.rows, Row(stage=(0, 0, 0, 0), out=(-1.0, 0.0))]
    prob.terms = [*prob.terms, Term("max", len(prob.rows) - 1)]
    with pytest.raises(ValueError):
        aggregate(prob)


# -- priced knob tuples of the oracle's cases ------------------------------------------------

def _tuples(cluster, model, training):
    """(knobs, CoreProblem with sends, the same without) of every knob tuple of p >= 2."""
    classes, pricer = case_pricer(cluster, model, training)
    for knobs in enumerate_knobs(model, training, classes):
        if knobs.num_stages < 2:
            continue
        ctx = make_context(model, training, knobs)
        keys = pricer.option_keys(knobs)
        full, free = pricer.price(knobs, ctx, keys), pricer.price(knobs, ctx, keys, sends=False)
        if not full.options:
            continue
        for prob in (full, free):
            prepare(prob, ObjectiveSpec(), None)
        yield knobs, full, free


def _optimum(prob) -> float | None:
    sol = solve_brute(prob)[0]
    return sol.objective if sol.ok else None


@pytest.mark.parametrize("seed", [0, 3, 6, 11, 17])
def test_aggregate_bounds_priced_tuples_of_oracle_cases(seed):
    """On every p >= 2 knob tuple of an oracle case the aggregate (default groups, and merged
    down to a tiny pair budget) is at most the tuple's exact optimum."""
    cluster, model, training = make_case(seed)
    checked = 0
    for _knobs, full, _free in _tuples(cluster, model, training):
        best = _optimum(full)
        if best is None:
            continue
        for budget in (None, max(1, full.num_boundaries)):
            agg, _ = aggregate(full, max_pairs=budget)
            bound = _optimum(agg)
            assert bound is not None and bound <= best * (1 + 1e-9), (bound, best)
        checked += 1
    assert checked >= 1


def _slow_link_case():
    """Two zones of one 2-GPU node each, 1 Gbit/s and 20 ms between them, a model that fits
    one GPU only in pieces: two stages, one a zone, and every boundary crosses the link."""
    spec = {"name": "slow-link", "zones": [{"name": "z0"}, {"name": "z1"}],
            "links": [{"between": ["z0", "z1"], "bandwidth": "1 Gbit/s", "latency": "20 ms"}],
            "nodes": [{"name": "a", "gpu": "A100-SXM4-80GB", "gpus_per_node": 2, "zone": "z0"},
                      {"name": "b", "gpu": "A100-SXM4-80GB", "gpus_per_node": 2, "zone": "z1"}]}
    model = load_model({"name": "tiny", "num_layers": 8, "hidden_size": 512, "num_attention_heads": 8,
                        "vocab_size": 32000, "mlp": "gelu"})
    training = Training(global_batch_size=8, seq_len=1024, schedules=("1f1b",), recompute_modes=("none",),
                        zero_stages=(0,), max_tp=2, max_stages=2)
    return cluster_from_dict(spec), model, training


def test_aggregate_keeps_the_slow_link_the_send_free_relaxation_drops():
    """Across a slow zone link the aggregate (sends at their least between groups) bounds a
    two-stage tuple higher than the send-free relaxation of all its options, and still at
    most the tuple's optimum."""
    cluster, model, training = _slow_link_case()
    above = merged = 0
    for _knobs, full, free in _tuples(cluster, model, training):
        best, loose = _optimum(full), _optimum(free)
        if best is None:
            continue
        agg, groups = aggregate(full)
        merged += len(groups) < len(full.options)       # tp 1 x 2 and tp 2 x 1: the same 2 GPUs
        bound = _optimum(agg)
        assert bound <= best * (1 + 1e-9)
        above += bound > loose * (1 + 1e-3)
    assert merged >= 1 and above >= 1, (merged, above)
