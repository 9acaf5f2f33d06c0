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


def random_problem(rng: random.Random, with_boundary=True, one_max=False) -> CoreProblem:
    p = rng.randint(1, 3)
    L = rng.randint(p, 7)
    R = rng.randint(1, 3)
    capacity = [rng.randint(1, 4) for _ in range(R)]
    K = rng.randint(1, 5)
    options = []
    for k in range(K):
        slope = (rng.uniform(0.1, 2), rng.uniform(0.1, 3), rng.uniform(-1, 1), rng.uniform(0, .5))
        fixed = []
        for s in range(p):
            end = (s == 0) + (s == p - 1)
            fixed.append(None if rng.random() < 0.1 else
                         (rng.uniform(0, 1) * end, rng.uniform(0, 1) * end, rng.uniform(-2, 1), rng.uniform(0, .3)))
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
