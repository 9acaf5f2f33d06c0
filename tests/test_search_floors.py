"""The cost objectives' floors (floors.py) against brute force, and what they buy the search:
a proved gap where there was none."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from test_oracle import case_pricer, make_case

from planner.search import solve
from planner.search.bound import KnobBound
from planner.search.core.brute import assignments
from planner.search.floors import tuple_floors
from planner.search.knobs import enumerate_knobs, make_context
from planner.search.objectives import ObjectiveSpec
from planner.search.oracle import oracle

COST = ObjectiveSpec("cost")


def _sampled_tuples(seeds, per_case: int, min_classes: int = 1, schedules=None):
    """Knob tuples sampled from the oracle cases, priced: (seed, knob bound, tokens per
    iteration, knobs, context, option keys, CoreProblem); the knob bound is one per case.
    ``schedules``: the cases' training.schedules instead of the default space's."""
    for seed in seeds:
        cluster, model, training = make_case(seed)
        if schedules:
            training = training.model_copy(update={"schedules": schedules})
        classes, pricer = case_pricer(cluster, model, training)
        if len(classes) < min_classes:
            continue
        knob_bound = KnobBound(pricer)
        tokens = training.global_batch_size * training.seq_len
        tuples = enumerate_knobs(model, training, classes)
        for knobs in random.Random(seed).sample(tuples, min(per_case, len(tuples))):
            ctx = make_context(model, training, knobs)
            keys = pricer.option_keys(knobs)
            yield seed, pricer, knob_bound, tokens, knobs, ctx, keys, pricer.price(knobs, ctx, keys)


def _plans_with_classes(prob) -> list[tuple[float, float, tuple[int, ...]]]:
    """Every plan of a priced tuple, by brute force: (price, time, the classes it uses)."""
    return [(prob.price(a), prob.objective(a), tuple(sorted({prob.options[o].resource for o, _ in a})))
            for a in assignments(prob)]


def _tuples_with_plans(seeds, per_case: int):
    """The sampled tuples that have plans: (seed, knob bound, tokens per iteration, knobs,
    plans with their classes, the tuple's floors)."""
    for seed, pricer, knob_bound, tokens, knobs, ctx, keys, prob in _sampled_tuples(seeds, per_case):
        plans = _plans_with_classes(prob)
        if plans:
            yield seed, knob_bound(knobs, ctx, keys), tokens, knobs, plans, tuple_floors(pricer, knobs, ctx, keys)


def test_floors_hold_on_every_plan_of_sampled_tuples():
    """For every plan of a tuple: price >= the price floor, price x time >= the work floor and
    >= the price floor x the tuple's knob bound; under a floor on tokens/s, the cheapest plan
    fast enough costs at least the floor's value.  Not vacuous: the floor the search uses
    must come within 10% of the tuple's best price x time on a third of the tuples (the
    median is 0.95 of it), and the work floor alone, with what each stage's position adds
    (embedding, head, per-micro-batch overhead), within half on half of them (its median 0.53
    of it, 0.40 without the positions; then 18 of 64 tuples came within half, now 37)."""
    checked = close = work_close = 0
    for seed, pricer, knob_bound, tokens, knobs, ctx, keys, prob in _sampled_tuples(range(12), 10):
        plans = [(prob.price(a), prob.objective(a)) for a in assignments(prob)]
        if not plans:
            continue
        floors = tuple_floors(pricer, knobs, ctx, keys)
        kb = knob_bound(knobs, ctx, keys)
        best_cost = min(p * t for p, t in plans)
        assert min(p for p, _ in plans) >= floors.price_usd_per_hour * (1 - 1e-9)
        assert best_cost >= floors.work_usd_s_per_hour * (1 - 1e-9), (seed, knobs)
        work_close += floors.work_usd_s_per_hour >= 0.5 * best_cost
        assert best_cost >= floors.value(COST, kb, tokens) * (1 - 1e-9), (seed, knobs)
        fastest = min(t for _, t in plans)
        floor = ObjectiveSpec("cost-above-floor", min_tokens_per_s=tokens / (1.3 * fastest))
        cap = tokens / floor.min_tokens_per_s
        cheapest = min(p for p, t in plans if t <= cap * (1 + 1e-12))
        assert cheapest >= floors.value(floor, kb, tokens) * (1 - 1e-9), (seed, knobs)
        checked += 1
        close += floors.value(COST, kb, tokens) >= 0.9 * best_cost
    assert checked >= 60
    assert close >= checked // 3, (close, checked)
    assert work_close >= checked // 2, (work_close, checked)


def test_floors_mark_a_tuple_out_of_reach_only_when_it_is():
    """``inf`` (the tuple has no plan under the budget or the floor) must mean exactly that."""
    cluster, model, training = make_case(6)
    classes, pricer = case_pricer(cluster, model, training)
    knob_bound = KnobBound(pricer)
    tokens = training.global_batch_size * training.seq_len
    for knobs in enumerate_knobs(model, training, classes)[:40]:
        ctx = make_context(model, training, knobs)
        keys = pricer.option_keys(knobs)
        prob = pricer.price(knobs, ctx, keys)
        plans = [(prob.price(a), prob.objective(a)) for a in assignments(prob)]
        floors = tuple_floors(pricer, knobs, ctx, keys)
        kb = knob_bound(knobs, ctx, keys)
        for budget in (0.5, 1.0, 2.0, 4.0, 8.0):
            spec = ObjectiveSpec("throughput-under-budget", budget_usd_per_hour=budget)
            if math.isinf(floors.value(spec, kb, tokens)):
                assert all(p > budget for p, _ in plans)
        for floor_tps in (1e3, 1e4, 1e5):
            spec = ObjectiveSpec("cost-above-floor", min_tokens_per_s=floor_tps)
            if math.isinf(floors.value(spec, kb, tokens)):
                assert all(t > tokens / floor_tps for _, t in plans)


def test_cost_objective_stopped_early_reports_a_bound_that_holds():
    """Before the floors, a cost search stopped by its time limit reported no bound and no
    gap.  Given time it proves the optimum (the oracle's, on small cases, which now finish
    in a quarter of a second: too soon to stop early on every machine).  Stopped early on the
    README cluster (a plan found, 4,020 tuples) it gives a finite gap, and its bound stays
    below a plan a longer run finds (so below the optimum)."""
    from planner.spec import Training, load_cluster, load_model
    for seed in (1, 6):
        cluster, model, training = make_case(seed, max_plans=600)
        ref = oracle(cluster, model, training, objective="cost")
        res = solve(cluster, model, training, objective="cost", time_limit_s=60.0)
        assert res.report.status == "optimal"
        assert math.isclose(res.plan.solver.objective, ref.value, rel_tol=1e-9)
    cluster = load_cluster(Path(__file__).resolve().parent.parent / "cluster_specs" / "lab-mixed.yaml")
    job = (cluster, load_model("llama3-8b"), Training(global_batch_size=512, seq_len=4096, precision="fp16"))
    early = solve(*job, objective="cost", time_limit_s=6.0).report
    later = solve(*job, objective="cost", time_limit_s=15.0).report
    assert early.status == "feasible" and early.knob_tuples_unexplored > 0
    assert early.gap is not None and 0 < early.gap < 1
    assert early.bound <= later.objective * (1 + 1e-9)


def test_floors_on_each_set_of_classes_hold_on_every_plan():
    """The plans on a set S of classes rent each class of S and take at least S's time bound:
    for every plan, price >= S's price floor and time >= S's bound, so the least over S
    (``TupleFloors.by_classes``) bounds the tuple under each objective.  Not vacuous: on some
    tuples it is above the one-floor value (the cheap classes are the slow ones)."""
    checked = lifted = 0
    for seed, pricer, knob_bound, tokens, knobs, ctx, keys, prob in _sampled_tuples(range(40), 8, min_classes=2):
        plans = _plans_with_classes(prob)
        if not plans:
            continue
        floors = tuple_floors(pricer, knobs, ctx, keys)
        kb = knob_bound(knobs, ctx, keys, enough_on=lambda classes: math.inf)
        by = knob_bound.by_classes(knobs, keys)
        if not by:
            continue
        for price, time_s, used in plans:
            assert price >= floors.on_classes(used).price_usd_per_hour * (1 - 1e-9), (seed, knobs, used)
            assert time_s >= by.get(used, 0.0) * (1 - 1e-9), (seed, knobs, used)
        best_cost = min(p * t for p, t, _ in plans)
        assert best_cost >= floors.by_classes(COST, by, tokens) * (1 - 1e-9), (seed, knobs)
        fastest = min(t for _, t, _ in plans)
        floor = ObjectiveSpec("cost-above-floor", min_tokens_per_s=tokens / (1.3 * fastest))
        cap = tokens / floor.min_tokens_per_s
        cheapest = min(p for p, t, _ in plans if t <= cap * (1 + 1e-12))
        assert cheapest >= floors.by_classes(floor, by, tokens) * (1 - 1e-9), (seed, knobs)
        checked += 1
        lifted += floors.by_classes(floor, by, tokens) > floors.value(floor, kb, tokens) * (1 + 1e-9)
    assert checked >= 100 and lifted >= 20, (checked, lifted)


def test_capacity_floor_holds_on_every_plan_within_the_cap():
    """Under a cap on the time, every plan within it rents at least the capacity floor, on any
    set of classes it uses; ``inf`` only where no plan is within the cap.  Not vacuous: on some
    tuples and caps it is above both the price floor and the work floor over the cap (29 of
    381 here when written: it counts whole options, the work floor fractions of them)."""
    checked = above = 0
    for seed, _kb, _tokens, knobs, plans, floors in _tuples_with_plans(range(16), 8):
        fastest = min(t for _, t, _ in plans)
        for stretch in (0.9, 1.0, 1.05, 1.3, 2.0):
            cap = fastest * stretch
            within = [(p, used) for p, t, used in plans if t <= cap * (1 + 1e-12)]
            floor = floors.capacity.least_price(cap)
            if math.isinf(floor):
                assert not within, (seed, knobs, stretch)
                continue
            for price, used in within:
                assert price >= floor * (1 - 1e-9), (seed, knobs, stretch)
                on_used = floors.capacity.least_price(cap, used)
                assert price >= on_used * (1 - 1e-9), (seed, knobs, stretch, used)
            checked += 1
            above += bool(within) and floor > max(floors.price_usd_per_hour,
                                                   floors.work_usd_s_per_hour / cap) * (1 + 1e-6)
    assert checked >= 100
    assert above >= checked // 20, (above, checked)


def test_floors_hold_on_the_v_schedules_whose_first_stage_holds_both_ends():
    """ZB-V and DualPipeV put the embedding and the head on their first stage and a middle
    stage last (``role_positions``): the work floor's position term and the capacity floor
    read each stage's role there, and hold on every plan's exact time (the executor's; the
    rows only bound it).  (Read as first / last positions, the last stage would be charged
    for a head it does not hold; on these small cases the intercepts add up alike either way,
    so this guards the floors' validity on the V schedules, not that difference.)"""
    from planner.search.schedules import SCHEDULES
    checked = 0
    for seed, pricer, _kb, _tokens, knobs, ctx, keys, prob in _sampled_tuples(
            (*range(12), 59), 15, schedules=("zb-v", "dualpipev")):
        if knobs.schedule not in ("zb-v", "dualpipev"):
            continue
        entry, m = SCHEDULES[knobs.schedule], knobs.num_micro_batches
        plans = [(prob.price(a), entry.exact_time_s(prob, a, m, prob.objective(a)))
                 for a in assignments(prob)]
        if not plans:
            continue
        floors = tuple_floors(pricer, knobs, ctx, keys)
        assert min(p * t for p, t in plans) >= floors.work_usd_s_per_hour * (1 - 1e-9), (seed, knobs)
        fastest = min(t for _, t in plans)
        for stretch in (1.0, 1.3, 2.0):
            cap = fastest * stretch
            within = [p for p, t in plans if t <= cap * (1 + 1e-12)]
            assert min(within) >= floors.capacity.least_price(cap) * (1 - 1e-9), (seed, knobs, stretch)
        checked += 1
    assert checked >= 20, checked


def test_capacity_knapsack_is_exact_against_brute_force():
    """``Capacity.least_price`` is the least rent of p options, one per stage role, whose held
    units (each at least 1) add up to L: every choice of options enumerated on random small
    cases, where each option's held units per role come from its slope and intercepts."""
    import itertools as it

    import numpy as np

    from planner.search.capacity import Capacity
    from planner.search.slots import Position
    rng = random.Random(7)
    for _ in range(300):
        K, p, L, m = rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 9), rng.randint(1, 4)
        price = np.array([rng.choice((1.0, 2.0, 3.5, 5.0)) for _ in range(K)])
        slope = np.array([rng.uniform(0.05, 1.0) for _ in range(K)])
        icpt = np.array([[rng.uniform(0, 0.5) for _ in range(4)] for _ in range(K)])
        cap = rng.uniform(0.2, 6.0)
        c = Capacity(price, np.zeros(K, int), slope, icpt, m, L, p)
        held = c.held_units(cap)
        roles = [Position.ONLY] if p == 1 else [Position.FIRST, *[Position.MIDDLE] * (p - 2), Position.LAST]
        best = math.inf
        for choice in it.product(range(K), repeat=p):
            units = [held[o, r] for o, r in zip(choice, roles)]
            if min(units) >= 1 and sum(units) >= L and p <= L:
                best = min(best, float(price[list(choice)].sum()))
        assert c.least_price(cap) == pytest.approx(best) if math.isfinite(best) else math.isinf(c.least_price(cap))


def test_budget_time_floor_holds_on_every_plan_within_the_budget():
    """Under a budget, every plan that rents at most it takes at least the floors' time (the
    work floor over the budget, and the least cap whose capacity floor fits it), on any set
    of classes it uses; ``inf`` only where no plan is within the budget.  Not vacuous: on
    some tuples and budgets it is above the tuple's knob bound."""
    checked = above = 0
    for seed, kb, tokens, knobs, plans, floors in _tuples_with_plans(range(16), 8):
        for budget in sorted({p for p, _, _ in plans})[:6] + [0.999 * min(p for p, _, _ in plans)]:
            spec = ObjectiveSpec("throughput-under-budget", budget_usd_per_hour=budget)
            within = [(t, used) for p, t, used in plans if p <= budget * (1 + 1e-12)]
            floor = floors.value(spec, kb, tokens)
            if math.isinf(floor):
                assert not within, (seed, knobs, budget)
                continue
            for time_s, used in within:
                assert time_s >= floor * (1 - 1e-9), (seed, knobs, budget)
                assert time_s >= floors.capacity.least_time(budget, used) * (1 - 1e-9), (seed, knobs, used)
            checked += 1
            above += floor > kb * (1 + 1e-6)
    assert checked >= 100
    assert above >= checked // 20, (above, checked)


def test_budget_time_floor_is_the_least_cap_of_a_choice_within_the_budget():
    """``Capacity.least_time`` is, up to its rounding, the least cap at which some choice of
    p options (one per stage role) within the budget holds all L units: every choice
    enumerated, each at every cap where one of its options' held units changes."""
    import itertools as it

    import numpy as np

    from planner.search.capacity import Capacity
    from planner.search.slots import Position
    rng = random.Random(11)
    finite = 0
    for _ in range(300):
        K, p, L, m = rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 9), rng.randint(1, 4)
        price = np.array([rng.choice((1.0, 2.0, 3.5, 5.0)) for _ in range(K)])
        slope = np.array([rng.uniform(0.05, 1.0) for _ in range(K)])
        icpt = np.array([[rng.uniform(-0.1, 0.5) for _ in range(4)] for _ in range(K)])
        budget = rng.uniform(1.0, 12.0)
        c = Capacity(price, np.zeros(K, int), slope, icpt, m, L, p)
        roles = [Position.ONLY] if p == 1 else [Position.FIRST, *[Position.MIDDLE] * (p - 2), Position.LAST]
        caps = sorted({0.0} | {m * (icpt[o, r] + k * slope[o]) for o in range(K) for r in set(roles)
                               for k in range(1, L + 1) if icpt[o, r] + k * slope[o] > 0})
        best = math.inf
        for choice in it.product(range(K), repeat=p):
            if p > L or price[list(choice)].sum() > budget:
                continue
            for cap in caps:
                held = c.held_units(cap)
                units = [held[o, r] for o, r in zip(choice, roles)]
                if min(units) >= 1 and sum(units) >= L:
                    best = min(best, cap)
                    break
        got = c.least_time(budget)
        if math.isinf(best):
            assert math.isinf(got)
        else:
            finite += 1
            assert got == pytest.approx(best, rel=1e-8, abs=1e-12)
    assert finite >= 100, finite
