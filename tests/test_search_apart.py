"""The knob bound with the max terms apart (planner/search/apart.py): a bound on the oracle
cases' optima, at least the bound with them together, and above it where a stage's exposed
DP sync or optimizer step sits apart from the pipeline's bottleneck."""

from __future__ import annotations

import random

import pytest
from test_oracle import case_pricer, make_case

from planner.search import apart as apart_level
from planner.search.bound import KnobBound
from planner.search.core.brute import solve_brute
from planner.search.knobs import enumerate_knobs, make_context


def _solved_tuples(seeds, per_case: int, keep, schedules=lambda seed: None):
    """(seed, pricer, knobs, ctx, keys, optimum) for up to ``per_case`` tuples of each oracle
    case that ``keep`` takes and that have a plan (``schedules(seed)``: the case's own, or
    these)."""
    for seed in seeds:
        cluster, model, training = make_case(seed)
        if schedules(seed):
            training = training.model_copy(update={"schedules": schedules(seed)})
        classes, pricer = case_pricer(cluster, model, training)
        tuples = [k for k in enumerate_knobs(model, training, classes) if keep(k)]
        for knobs in random.Random(seed).sample(tuples, min(per_case, len(tuples))):
            ctx = make_context(model, training, knobs)
            keys = pricer.option_keys(knobs)
            best = solve_brute(pricer.price(knobs, ctx, keys))[0]
            if best.ok:
                yield seed, pricer, knobs, ctx, keys, best.objective


def test_apart_bound_holds_on_the_oracle_cases_and_lifts_some():
    checked = lifted = 0
    for seed, pricer, knobs, ctx, keys, best in _solved_tuples(range(16, 48), 6, lambda k: k.num_stages > 1):
        # over all classes (``whole``: the same joint bound under both), then per set of
        # classes (the search's call), whose early exits at ``enough`` differ
        together = KnobBound(pricer).whole(knobs, ctx, keys, True, packed=2)
        apart = KnobBound(pricer).whole(knobs, ctx, keys, True, packed=3)
        per_set = [KnobBound(pricer)(knobs, ctx, keys, packed=3, enough=best * x) for x in (0.99, 1.02, float("inf"))]
        assert together <= apart <= best * (1 + 1e-9), (seed, knobs.label(), together, apart, best)
        assert max(per_set) <= best * (1 + 1e-9), (seed, knobs.label(), per_set, best)
        checked += 1
        lifted += apart_level.applies(knobs, keys) and apart > together * (1 + 1e-6)
    print(f"{checked} tuples, {lifted} lifted by taking the max terms apart")
    assert checked >= 100 and lifted >= 20, (checked, lifted)


@pytest.mark.parametrize("step, points, refine", [(0.5, 2, 0), (0.001, 3, 1), (0.0, 1, 2)])
def test_apart_bound_holds_when_its_grid_stops_early(monkeypatch, step, points, refine):
    """The grid's other exits (the point cap, a step too small to reach hi, none at all)
    end in a tail that must still bound the plans past it: cases with zb-h1 and GPipe, whose
    rows split differently, beside the cases' own schedules."""
    monkeypatch.setattr(apart_level, "APART_STEP", step)
    monkeypatch.setattr(apart_level, "APART_POINTS", points)
    monkeypatch.setattr(apart_level, "APART_REFINE", refine)
    checked = 0
    for seed, pricer, knobs, ctx, keys, best in _solved_tuples(
            range(16, 40), 4, lambda k: apart_level.applies(k, []),
            schedules=lambda seed: (None, ("zb-h1",), ("gpipe", "1f1b"))[seed % 3]):
        bound = KnobBound(pricer).whole(knobs, ctx, keys, True, packed=3)
        assert bound <= best * (1 + 1e-9), (seed, knobs.label(), bound, best)
        checked += 1
    assert checked >= 50, checked
