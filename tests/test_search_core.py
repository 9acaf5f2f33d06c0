"""The solver core on plain arrays: DP, MILP and brute force agree on random inputs."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.search.core import CoreOption, CoreProblem, Row, Term
from planner.search.core.brute import solve_brute
from planner.search.core.dp import dp_fixed_options, dp_partition
from planner.search.core.milp import MilpSettings, solve_milp
from planner.search.core.problem import quick_bound


def random_quantities(rng: random.Random, p: int) -> tuple:
    """One option's slopes of four quantities (forward, backward, sync less overlap, optimizer)
    and its intercepts per position (the ends add the embedding and head; None: not allowed)."""
    slope = (rng.uniform(0.1, 2), rng.uniform(0.1, 3), rng.uniform(-1, 1), rng.uniform(0, .5))
    fixed = []
    for s in range(p):
        end = (s == 0) + (s == p - 1)
        fixed.append(None if rng.random() < 0.1 else
                     (rng.uniform(0, 1) * end, rng.uniform(0, 1) * end, rng.uniform(-2, 1), rng.uniform(0, .3)))
    return slope, fixed


def random_problem(rng: random.Random, with_boundary=True, one_max=False) -> CoreProblem:
    p = rng.randint(1, 3)
    L = rng.randint(p, 7)
    R = rng.randint(1, 3)
    capacity = [rng.randint(1, 4) for _ in range(R)]
    K = rng.randint(1, 5)
    options = []
    for k in range(K):
        slope, fixed = random_quantities(rng, p)
        options.append(CoreOption(resource=rng.randrange(R), units=rng.randint(1, 2), slope=slope,
                                  fixed=fixed, max_blocks=[rng.randint(0, L) for _ in range(p)],
                                  price_usd_per_hour=rng.choice([1.0, 2.5, 4.0]), group=rng.randint(0, 1)))
    m = rng.randint(1, 8)
    rows = [Row(stage=(1, 1, 0, 0), out=(1, 0), inn=(0, 1)),
            Row(stage=(0, 0, 0, 0), hinges=((0, 0, 1, 0), (-0.1, 0, 0, 1))) if rng.random() < 0.5
            else Row(stage=(0, 0, 1, 0)), Row(stage=(0, 0, 0, 1))]
    if one_max:
        terms = [Term("max", 0, m - 1), Term("sum", 0, 1.0)]
        with_boundary = False
        rows[0] = Row(stage=(1, 1, 0, 0))
    else:
        terms = [Term("max", 0, m - 1), Term("sum", 0, 1.0), Term("max", 1), Term("max", 2)]
    boundary = None
    if with_boundary:
        boundary = np.array([[[rng.choice([0.0, 0.05, 0.3]) for _ in range(K)] for _ in range(K)]
                             for _ in range(2)])
    else:
        rows = [Row(stage=r.stage, hinges=r.hinges) for r in rows]
    return CoreProblem(num_blocks=L, num_stages=p, capacity=capacity, options=options, rows=rows,
                       terms=terms, boundary=boundary, wrap=with_boundary and rng.random() < 0.3,
                       resource_price=[rng.choice([0.0, 3.0]) for _ in range(R)], same_group=rng.random() < 0.3)


def check_agree(prob: CoreProblem):
    brute = solve_brute(prob)[0]
    milp = solve_milp(prob, MilpSettings(time_limit_s=20))[0]
    assert (brute.status == "infeasible") == (milp.status == "infeasible"), (brute, milp)
    if brute.status == "infeasible":
        return
    assert milp.status == "optimal"
    assert prob.feasible(milp.assign)
    assert math.isclose(milp.objective, brute.objective, rel_tol=1e-9, abs_tol=1e-9)
    assert milp.bound <= milp.objective + 1e-9
    qb = quick_bound(prob)
    assert qb is not None and qb <= brute.objective * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("seed", range(40))
def test_milp_equals_brute_force(seed):
    check_agree(random_problem(random.Random(seed)))


@pytest.mark.parametrize("seed", range(15))
def test_dp_equals_milp_and_brute_with_options_fixed(seed):
    rng = random.Random(1000 + seed)
    prob = random_problem(rng, one_max=True)
    for opts in itertools.islice(itertools.product(range(len(prob.options)), repeat=prob.num_stages), 6):
        fixed = CoreProblem(num_blocks=prob.num_blocks, num_stages=prob.num_stages, capacity=prob.capacity,
                            options=[prob.options[o] for o in opts], rows=prob.rows, terms=prob.terms)
        # Each stage may use only "its" option: forbid the others by position.
        for s, opt in enumerate(fixed.options):
            fixed.options[s] = CoreOption(opt.resource, opt.units, opt.slope,
                                          [f if k == s else None for k, f in enumerate(opt.fixed)],
                                          opt.max_blocks, opt.price_usd_per_hour)
        dp = dp_fixed_options(fixed, list(range(prob.num_stages)))
        brute = solve_brute(fixed)[0]
        milp = solve_milp(fixed)[0]
        assert dp.status == brute.status == ("optimal" if milp.ok else "infeasible") or (
            dp.status == "infeasible" and brute.status == "infeasible")
        if brute.ok:
            assert math.isclose(dp.objective, brute.objective, rel_tol=1e-9, abs_tol=1e-12)
            assert math.isclose(milp.objective, brute.objective, rel_tol=1e-9, abs_tol=1e-12)


def brute_partition(cost, alpha, beta):
    p, n1, _ = cost.shape
    L = n1 - 1
    best = math.inf
    for cuts in itertools.combinations(range(1, L), p - 1):
        b = (0, *cuts, L)
        ts = [cost[s, b[s], b[s + 1]] for s in range(p)]
        if not all(map(math.isfinite, ts)):
            continue
        best = min(best, alpha * max(ts) + beta * sum(ts))
    return best


@given(st.integers(1, 4), st.integers(0, 4), st.integers(0, 10**6), st.floats(0, 10), st.floats(0, 2))
@settings(max_examples=60, deadline=None)
def test_dp_partition_equals_brute_force(p, extra, seed, alpha, beta):
    L = p + extra
    rng = np.random.default_rng(seed)
    cost = rng.uniform(0.1, 5, size=(p, L + 1, L + 1))
    cost[rng.uniform(size=cost.shape) < 0.2] = np.inf          # memory does not fit
    val, split, _ = dp_partition(cost, alpha, beta)
    ref = brute_partition(cost, alpha, beta)
    if math.isinf(ref):
        assert math.isinf(val)
    else:
        assert math.isclose(val, ref, rel_tol=1e-9)
        assert next(a for a, _ in split) == 0 and split[-1][1] == L


@given(st.integers(0, 10**6))
@settings(max_examples=25, deadline=None)
def test_milp_equals_brute_force_hypothesis(seed):
    check_agree(random_problem(random.Random(seed)))


def test_top_k_matches_brute_force():
    for seed in range(5):
        prob = random_problem(random.Random(500 + seed))
        b = solve_brute(prob, top_k=3)
        m = solve_milp(prob, top_k=3)
        if not b[0].ok:
            continue
        assert len(b) == len(m)
        for x, y in zip(b, m):
            assert math.isclose(x.objective, y.objective, rel_tol=1e-9, abs_tol=1e-12)


def test_price_mode_matches_brute_force_and_its_cutoff_bounds_the_price():
    """Price mode: the least price among plans within a time cap, as brute force finds it.
    A cutoff there is on the price (the cost walk's "too dear to win"): at the least price
    nothing is left below it; a little above, the least price is found."""
    from planner.search.core.enum import CoreEnum
    from planner.search.core.milp import CoreMilp
    checked = 0
    for seed in range(40):
        prob = random_problem(random.Random(900 + seed))
        t = solve_brute(prob)[0]
        if not t.ok:
            continue
        cap = t.objective * 1.5
        b = solve_brute(prob, mode="price", time_cap=cap)[0]
        m = solve_milp(prob, mode="price", time_cap=cap)[0]
        least = prob.price(b.assign)
        assert math.isclose(least, prob.price(m.assign), rel_tol=1e-9)
        assert prob.objective(m.assign) <= cap * (1 + 1e-9)
        if least <= 0:
            continue
        solvers = [CoreMilp(prob)] + ([CoreEnum(prob)] if prob.num_stages <= 2 else [])
        for solver in solvers:
            at = solver.solve(MilpSettings(time_limit_s=20), mode="price", time_cap=cap, cutoff=least)
            assert at.status == "cutoff", type(solver).__name__
            above = solver.solve(MilpSettings(time_limit_s=20), mode="price", time_cap=cap, cutoff=least * 1.01)
            assert above.ok and math.isclose(above.objective, least, rel_tol=1e-9)
            assert prob.objective(above.assign) <= cap * (1 + 1e-9)
        checked += 1
    assert checked >= 5


def test_memory_aware_bounds_hold_on_random_problems():
    """quick_bound (with its memory-aware max-row bisection and greedy sum fill) never exceeds
    the brute-force optimum, is None only when no assignment exists, and max_row_bound /
    sum_slope_bound bound their own quantities."""
    from planner.search.core.problem import max_row_bound, sum_slope_bound
    checked = 0
    for seed in range(300):
        rng = random.Random(5000 + seed)
        prob = random_problem(rng, with_boundary=rng.random() < 0.5, one_max=rng.random() < 0.5)
        brute = solve_brute(prob)[0]
        qb = quick_bound(prob)
        if brute.status == "infeasible":
            continue
        assert qb is not None and qb <= brute.objective * (1 + 1e-9) + 1e-12, (seed, qb, brute.objective)
        # the pieces on their own: max / sum of row 0's block part over the optimum's stages
        p, L = prob.num_stages, prob.num_blocks
        row = prob.rows[0]
        A = np.array([float(np.dot(row.stage, o.slope)) for o in prob.options])
        U = np.array([[o.max_blocks[s] if o.allowed(s) else 0 for s in range(p)] for o in prob.options])
        F = np.array([[float(np.dot(row.stage, o.fixed[s])) if o.allowed(s) else np.inf for s in range(p)]
                      for o in prob.options])
        a = brute.assign
        got_max = max(A[o] * nb + F[o, s] for s, (o, nb) in enumerate(a))
        got_sum = sum(A[o] * nb for o, nb in a)
        mb = max_row_bound(L, A, U, F, [o.units for o in prob.options], [o.resource for o in prob.options],
                           prob.capacity)
        assert mb <= got_max + 1e-12
        assert sum_slope_bound(L, A, U) <= got_sum + 1e-12
        checked += 1
    assert checked > 100


def _small_problems(first_seed: int, count: int):
    """Random problems of one or two stages (those CoreEnum takes)."""
    seed, out = first_seed, []
    while len(out) < count:
        prob = random_problem(random.Random(seed))
        seed += 1
        if prob.num_stages <= 2:
            if len(out) % 3 == 2:
                prob.budget_usd_per_hour = 7.0      # binds on some: options cost 1-4 plus 0-3 per resource
            out.append(prob)
    return out


@pytest.mark.parametrize("prob", _small_problems(3000, 60), ids=lambda p: f"p{p.num_stages}")
def test_enumeration_equals_brute_force_and_milp(prob):
    from planner.search.core.enum import CoreEnum
    brute = solve_brute(prob)[0]
    enum = CoreEnum(prob).solve()
    assert (brute.status == "infeasible") == (enum.status == "infeasible"), (brute, enum)
    if brute.status == "infeasible":
        return
    assert enum.status == "optimal" and prob.feasible(enum.assign)
    assert math.isclose(enum.objective, brute.objective, rel_tol=1e-9, abs_tol=1e-9)
    milp = solve_milp(prob, MilpSettings(time_limit_s=20))[0]
    assert math.isclose(enum.objective, milp.objective, rel_tol=1e-9, abs_tol=1e-9)
    # a cutoff at the optimum leaves nothing below it, and says what the optimum is
    cut = CoreEnum(prob).solve(cutoff=brute.objective)
    assert cut.status == "cutoff" and math.isclose(cut.bound, brute.objective, rel_tol=1e-9, abs_tol=1e-12)


def test_enumeration_top_k_and_price_mode_match_brute_force():
    from planner.search.core.enum import CoreEnum
    checked = 0
    for prob in _small_problems(4000, 30):
        b = solve_brute(prob, top_k=3)
        if not b[0].ok:
            continue
        enum = CoreEnum(prob)
        got = []
        for _ in range(3):
            sol = enum.solve()
            if not sol.ok:
                break
            got.append(sol)
            enum.exclude(sol.assign)
        assert [round(x.objective, 9) for x in b] == [round(y.objective, 9) for y in got]
        cap = b[0].objective * 1.5
        bp = solve_brute(prob, mode="price", time_cap=cap)[0]
        ep = CoreEnum(prob).solve(mode="price", time_cap=cap)
        assert math.isclose(prob.price(bp.assign), ep.objective, rel_tol=1e-9)
        assert prob.objective(ep.assign) <= cap * (1 + 1e-9)
        checked += 1
    assert checked >= 10


def test_enumeration_edges_empty_and_deadline():
    """No options: infeasible (as the MILP says).  A deadline that passed: ``unknown`` with no
    bound once the first chunk is done (a pass over 4e7 assignments takes seconds)."""
    import time

    import planner.search.core.enum as enum_mod
    from planner.search.core.enum import CoreEnum
    empty = CoreProblem(num_blocks=4, num_stages=1, capacity=[1], options=[], rows=[Row(stage=(1,))],
                        terms=[Term("max", 0)])
    assert CoreEnum(empty).solve().status == "infeasible"
    prob = next(p for p in _small_problems(5000, 50) if p.num_stages == 2 and len(p.options) >= 3)
    chunk = enum_mod._CHUNK_CELLS
    try:
        enum_mod._CHUNK_CELLS = 1          # one first-stage option per chunk
        late = CoreEnum(prob).solve(deadline=time.monotonic() - 1)
        assert late.status == "unknown" and late.bound is None
        assert CoreEnum(prob).solve(deadline=time.monotonic() + 60).status in ("optimal", "infeasible")
    finally:
        enum_mod._CHUNK_CELLS = chunk


# -- mixed stages: options holding several resources, least block counts per position -------

def mixed_problem(rng: random.Random, with_boundary=True, one_max=False, max_stages=3) -> CoreProblem:
    """``random_problem`` with at least two resources, about half the options also holding
    units of one or two other resources (``extra_uses``) and about half needing more than one
    block at some positions (``min_blocks``); capacities of 1-4 units bind often."""
    while True:
        prob = random_problem(rng, with_boundary=with_boundary, one_max=one_max)
        if prob.num_stages <= max_stages and len(prob.options) >= 2:
            break
    p, L = prob.num_stages, prob.num_blocks
    if len(prob.capacity) < 2:
        prob.capacity.append(rng.randint(1, 3))
        prob.resource_price.append(0.0)
    R = len(prob.capacity)
    prob.resource_price[rng.randrange(R)] = rng.choice([2.0, 5.0])    # some resource is charged
    for o in prob.options:
        o.max_blocks = [max(m, rng.randint(0, L)) for m in o.max_blocks]
        if rng.random() < 0.6:
            others = [c for c in range(R) if c != o.resource]
            picks = rng.sample(others, rng.randint(1, min(2, len(others))))
            o.extra_uses = tuple((c, rng.choice([1, 1, 2])) for c in picks)
            # a mixed stage is worth its second class: faster, so the solvers want it
            o.slope = tuple(a * 0.5 for a in o.slope)
        if rng.random() < 0.6:
            o.min_blocks = [rng.choice([0, 2, 3, 3]) for _ in range(p)]
    return prob


def _strip(prob: CoreProblem, extras: bool = False, least: bool = False) -> CoreProblem:
    """A copy without the options' extra uses and / or least block counts."""
    import dataclasses
    opts = [dataclasses.replace(o, extra_uses=() if extras else o.extra_uses,
                                min_blocks=None if least else o.min_blocks) for o in prob.options]
    return dataclasses.replace(prob, options=opts)


def _two_resource_problem(min_blocks=(2, 1)) -> CoreProblem:
    """Option 0 holds one unit of resource 0 and, as a mixed stage, one of resource 1 (charged
    5 USD/h; capacity 1); option 1 holds one unit of resource 0 only.  Option 0 is faster."""
    mixed = CoreOption(resource=0, units=1, slope=(0.5,), fixed=[(0.0,)] * 2, max_blocks=[4, 4],
                       price_usd_per_hour=1.0, extra_uses=((1, 1),), min_blocks=list(min_blocks))
    plain = CoreOption(resource=0, units=1, slope=(0.8,), fixed=[(0.0,)] * 2, max_blocks=[4, 4],
                       price_usd_per_hour=2.0)
    return CoreProblem(num_blocks=4, num_stages=2, capacity=[2, 1], options=[mixed, plain],
                       rows=[Row(stage=(1.0,))], terms=[Term("max", 0)], resource_price=[0.0, 5.0])


def test_an_option_holding_two_resources_counts_and_pays_for_both():
    prob = _two_resource_problem()
    mixed, plain = prob.options
    assert mixed.uses() == ((0, 1), (1, 1)) and plain.uses() == ((0, 1),)
    assert prob.feasible([(0, 2), (1, 2)]) and prob.feasible([(1, 2), (1, 2)])
    # resource 0 holds both stages (2 <= 2); only the extra use overflows resource 1 (2 > 1)
    assert not prob.feasible([(0, 2), (0, 2)])
    assert prob.price([(0, 2), (1, 2)]) == 1.0 + 2.0 + 5.0      # resource 1's price, once
    assert prob.price([(1, 2), (1, 2)]) == 4.0                  # no option holds resource 1
    assert prob.price([(0, 2), (0, 2)]) == 2.0 + 5.0
    # least block counts: 2 at position 0, 1 at position 1
    assert not prob.feasible([(0, 1), (1, 3)])
    assert prob.feasible([(1, 1), (0, 3)]) and prob.feasible([(0, 2), (1, 2)])
    assert mixed.least_blocks(0) == 2 and plain.least_blocks(0) == 1
    gone = CoreOption(resource=0, units=1, slope=(1.0,), fixed=[(0.0,)] * 2, max_blocks=[1, 4], min_blocks=[2, 0])
    assert not gone.allowed(0) and gone.allowed(1) and gone.least_blocks(1) == 1
    prob.budget_usd_per_hour = 7.0
    assert not prob.feasible([(0, 2), (1, 2)]) and prob.feasible([(1, 2), (1, 2)])


@pytest.mark.parametrize("min_blocks,best,budget", [((2, 1), 1.5, None), ((4, 4), 1.6, None),
                                                    ((2, 1), 1.6, 7.0)])
def test_every_solver_respects_extra_uses_least_blocks_and_resource_prices(min_blocks, best, budget):
    """Unconstrained, both stages would take the mixed option; resource 1 admits one.  With it
    at 3 blocks next to the plain option (1.5) the optimum; where it needs 4 blocks (no room
    for the other stage) or its resource's price breaks the budget, the plain pair (1.6)."""
    from planner.search.core.enum import CoreEnum
    from planner.search.polish import polish
    prob = _two_resource_problem(min_blocks)
    prob.budget_usd_per_hour = budget
    for sol in (solve_brute(prob)[0], solve_milp(prob)[0], CoreEnum(prob).solve()):
        assert sol.status == "optimal" and prob.feasible(sol.assign)
        assert sol.objective == pytest.approx(best, rel=1e-12)
    assert quick_bound(prob) <= best * (1 + 1e-12)
    val, got = polish(prob, [(1, 2), (1, 2)])
    assert prob.feasible(got) and val == pytest.approx(best, rel=1e-12)
    assert dp_fixed_options(prob, [1, 1]).objective == pytest.approx(1.6, rel=1e-12)
    assert dp_fixed_options(prob, [0, 0]).status == "infeasible"
    after = dp_fixed_options(prob, [1, 0])      # the mixed option second: its price, its 4 blocks
    if budget or min_blocks[1] > 3:
        assert after.status == "infeasible"
    else:
        assert after.objective == pytest.approx(1.5, rel=1e-12) and after.assign == [(1, 1), (0, 3)]


@pytest.mark.parametrize("capacity,budget,best,cheapest", [([1, 1], None, 2.0, 2.0), ([1, 0], None, 3.2, 2.0),
                                                             ([1, 1], 5.5, 3.2, 2.0), ([1, 1], 1.5, None, None)])
def test_one_stage_solvers_count_extra_uses(capacity, budget, best, cheapest):
    """One stage of 4 blocks: the mixed option (2.0 s, 1 + 5 USD/h for its second resource)
    or the plain one (3.2 s, 2 USD/h).  The mixed one is out when its second resource has no
    room or its price breaks the budget; in price mode the plain one is the cheaper."""
    import dataclasses

    from planner.search.core.enum import CoreEnum
    two = _two_resource_problem((0, 0))
    options = [dataclasses.replace(o, fixed=o.fixed[:1], max_blocks=o.max_blocks[:1], min_blocks=None)
               for o in two.options]
    prob = dataclasses.replace(two, num_stages=1, capacity=capacity, options=options, budget_usd_per_hour=budget)
    solvers = [solve_brute(prob)[0], solve_milp(prob)[0], CoreEnum(prob).solve()]
    if best is None:
        assert all(sol.status == "infeasible" for sol in solvers)
        return
    for sol in solvers:
        assert sol.status == "optimal" and sol.objective == pytest.approx(best, rel=1e-12)
    cheap = [solve_brute(prob, mode="price", time_cap=10.0)[0], solve_milp(prob, mode="price", time_cap=10.0)[0],
             CoreEnum(prob).solve(mode="price", time_cap=10.0)]
    for sol in cheap:
        assert sol.status == "optimal" and sol.assign == [(1, 4)] and prob.price(sol.assign) == cheapest
    assert quick_bound(prob) <= best * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(30))
def test_mixed_milp_equals_brute_force(seed):
    prob = mixed_problem(random.Random(20_000 + seed))
    check_agree(prob)
    brute = solve_brute(prob)[0]
    if brute.ok:
        milp = solve_milp(prob, MilpSettings(time_limit_s=20))[0]
        assert milp.bound <= brute.objective * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize("seed", range(40))
def test_mixed_enumeration_equals_brute_force(seed):
    from planner.search.core.enum import CoreEnum
    rng = random.Random(21_000 + seed)
    prob = mixed_problem(rng, max_stages=2)
    if seed % 3 == 2:
        prob.budget_usd_per_hour = 9.0
    brute = solve_brute(prob)[0]
    enum = CoreEnum(prob).solve()
    assert (brute.status == "infeasible") == (enum.status == "infeasible"), (brute, enum)
    if not brute.ok:
        return
    assert enum.status == "optimal" and prob.feasible(enum.assign)
    assert math.isclose(enum.objective, brute.objective, rel_tol=1e-9, abs_tol=1e-9)
    cap = brute.objective * 1.5
    bp = solve_brute(prob, mode="price", time_cap=cap)[0]
    ep = CoreEnum(prob).solve(mode="price", time_cap=cap)
    assert prob.feasible(ep.assign) and prob.objective(ep.assign) <= cap * (1 + 1e-9)
    assert math.isclose(ep.objective, prob.price(bp.assign), rel_tol=1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_mixed_price_mode_matches_brute_force(seed):
    rng = random.Random(22_000 + seed)
    prob = mixed_problem(rng)
    if seed % 2:
        prob.budget_usd_per_hour = 9.0
    t = solve_brute(prob)[0]
    if not t.ok:
        assert solve_milp(prob, mode="price")[0].status == "infeasible"
        return
    cap = t.objective * 1.3
    b = solve_brute(prob, mode="price", time_cap=cap)[0]
    m = solve_milp(prob, MilpSettings(time_limit_s=20), mode="price", time_cap=cap)[0]
    assert m.status == "optimal" and prob.feasible(m.assign)
    assert math.isclose(prob.price(m.assign), prob.price(b.assign), rel_tol=1e-9)
    assert math.isclose(m.objective, prob.price(b.assign), rel_tol=1e-9)
    assert prob.objective(m.assign) <= cap * (1 + 1e-9)


def _one_option_per_stage(prob: CoreProblem, opts) -> CoreProblem:
    """``prob`` restricted to the option sequence ``opts``: stage s may use only option s."""
    import dataclasses
    options = [dataclasses.replace(prob.options[o], fixed=[f if k == s else None
                                                          for k, f in enumerate(prob.options[o].fixed)])
               for s, o in enumerate(opts)]
    return CoreProblem(num_blocks=prob.num_blocks, num_stages=prob.num_stages, capacity=prob.capacity,
                       options=options, rows=prob.rows, terms=prob.terms, resource_price=prob.resource_price,
                       budget_usd_per_hour=prob.budget_usd_per_hour)


@pytest.mark.parametrize("seed", range(20))
def test_mixed_dp_with_options_fixed_equals_brute_force(seed):
    rng = random.Random(23_000 + seed)
    prob = mixed_problem(rng, one_max=True)
    if seed % 2:
        prob.budget_usd_per_hour = 12.0
    combos = list(itertools.product(range(len(prob.options)), repeat=prob.num_stages))
    for opts in rng.sample(combos, min(10, len(combos))):
        fixed = _one_option_per_stage(prob, opts)
        dp = dp_fixed_options(fixed, list(range(prob.num_stages)))
        brute = solve_brute(fixed)[0]
        assert dp.status == brute.status, (opts, dp, brute)
        if brute.ok:
            assert fixed.feasible(dp.assign)
            assert math.isclose(dp.objective, brute.objective, rel_tol=1e-9, abs_tol=1e-12)


def test_mixed_generator_makes_extra_uses_and_least_blocks_matter():
    """The mixed tests are only worth something if the features change answers: on the seeds
    of the MILP and price-mode tests, dropping the extra uses or the least block counts (a
    relaxation) changes the brute-force optimum or its feasibility on several problems, and
    quick_bound stays below the optimum."""
    changed = {"extras": 0, "least": 0}
    feasible = 0
    for seed in [*range(20_000, 20_030), *range(22_000, 22_020)]:
        prob = mixed_problem(random.Random(seed))
        brute = solve_brute(prob)[0]
        if brute.ok:
            feasible += 1
            qb = quick_bound(prob)
            assert qb is not None and qb <= brute.objective * (1 + 1e-9) + 1e-12
        for what in changed:
            loose = solve_brute(_strip(prob, **{what: True}))[0]
            if brute.ok:
                assert loose.ok and loose.objective <= brute.objective * (1 + 1e-12)
            changed[what] += loose.ok and (not brute.ok or loose.objective < brute.objective * (1 - 1e-9))
    assert feasible >= 15 and changed["extras"] >= 5 and changed["least"] >= 3, (feasible, changed)


def _with_min_term(prob: CoreProblem, rng: random.Random) -> CoreProblem:
    """``prob`` with ZB-H1's kind of min term (schedules.py): minus a weight times the least
    stage's row, a row of the stage quantities alone (no sends)."""
    row = Row(stage=(0, 1, 0, 0) if rng.random() < 0.5 else (0.5, 0.3, 0, 0.2))
    prob.rows = [*prob.rows, row]
    prob.terms = [*prob.terms, Term("min", len(prob.rows) - 1, -rng.uniform(0.5, 3.0))]
    return prob


@pytest.mark.parametrize("seed", range(40))
def test_min_term_milp_and_enumeration_equal_brute_force(seed):
    """A min term (weight <= 0): the MILP (z at most every stage's row, maximised), the
    enumeration and brute force agree; quick_bound stays below the optimum; and on some
    problems the term changes which assignment is best (not a no-op)."""
    from planner.search.core.enum import CoreEnum
    rng = random.Random(7000 + seed)
    prob = _with_min_term(random_problem(rng), rng)
    check_agree(prob)
    if prob.num_stages <= 2:
        brute, enum = solve_brute(prob)[0], CoreEnum(prob).solve()
        assert brute.ok == enum.ok
        if brute.ok:
            assert math.isclose(enum.objective, brute.objective, rel_tol=1e-9, abs_tol=1e-9)


def test_min_term_changes_the_optimum_and_needs_a_non_positive_weight():
    changed = 0
    for seed in range(60):
        rng = random.Random(7000 + seed)
        base = random_problem(rng)
        plain = solve_brute(base)[0]
        with_min = solve_brute(_with_min_term(random_problem(random.Random(7000 + seed)), rng))[0]
        if plain.ok and with_min.ok and with_min.objective < plain.objective - 1e-9:
            changed += 1
    assert changed > 5
    with pytest.raises(ValueError, match="weight <= 0"):
        Term("min", 0, 1.0)


def test_a_milp_past_the_deterministic_searchs_wall_guard_stops_cleanly():
    # found by scripts/fuzz_plans.py: past the guard clock.now() is inf, so a deadline taken from
    # it is inf, and the MILP's node cap was inf // units = NaN: ValueError (exit 3)
    import time

    from planner.search import clock
    from planner.search.core.milp import CoreMilp

    prob = random_problem(random.Random(0))           # a feasible one (brute force)
    with clock.work_clock(time_limit_s=0.01, work_budget=1000) as work:
        time.sleep(0.02)                              # the wall guard trips
        deadline = clock.now() + 1.0
        assert math.isinf(deadline) and work.units_left(deadline) == 0.0
        sol = CoreMilp(prob).solve(MilpSettings(time_limit_s=1), deadline=deadline)
    assert sol.status != "infeasible" and (not sol.ok or prob.feasible(sol.assign)), sol
    with clock.work_clock(time_limit_s=60, work_budget=1000) as work:
        assert work.units_left(math.inf) == math.inf   # no deadline but the wall guard: no node cap
        assert CoreMilp(prob).solve(MilpSettings(time_limit_s=5), deadline=math.inf).status == "optimal"
