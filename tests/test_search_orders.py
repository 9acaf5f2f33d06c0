"""The knob bound's ordered level (position_lp.orders): one position LP per order of a plan's
classes and one for the plans crossing more often.  Each LP must bound every integer plan it
stands for, so the least of them bounds every plan; each restricts the LP without orders, so
it is never below it, and on links that differ by partner it lifts it."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
from test_oracle import case_pricer, make_case

from planner.search.bound import KnobBound
from planner.search.core.brute import solve_brute
from planner.search.knobs import enumerate_knobs, make_context
from planner.search.position_lp import Cross, PositionLP, orders
from planner.search.schedules import SCHEDULES


def _tables(cross: Cross, base, icpt0, send_out, send_in, cls):
    """([V, K, p] most, [V, K, p] intercepts) of ``cross``'s variants: a crossing side holds
    one block less and pays its send to the class across it (the order's next or previous
    class, the partner named, or without either the least to any other class)."""
    K, p = base.shape
    C = send_out.shape[1]

    def send(table, o, value, step):
        if value == 0:
            return 0.0
        if cross.order:
            r = cross.order.index(int(cls[o])) + step
            return table[o, cross.order[r]] if 0 <= r < len(cross.order) else math.inf
        if cross.partners:
            return table[o, cross.partners[value - 1]]
        return min(table[o, c] for c in range(C))

    V = len(cross.variants)
    most, icpt = np.zeros((V, K, p)), np.zeros((V, K, p))
    for i, (co, ci) in enumerate(cross.variants):
        for o in range(K):
            extra = send(send_out, o, co, 1) + send(send_in, o, ci, -1)
            for s in range(p):
                missing = (co and s == p - 1) or (ci and s == 0) or not math.isfinite(extra)
                most[i, o, s] = 0.0 if missing else max(0.0, base[o, s] - bool(co) - bool(ci))
                icpt[i, o, s] = icpt0[o, s] + (0.0 if missing else extra)
    return most, icpt


def test_each_order_bounds_its_plans_and_the_least_lifts_the_crossing_lp():
    """Random position problems of 2-3 classes whose crossing sends depend on the class
    across (inf to a class's own): brute force over every option per position against the
    least of the ordered LPs' fills."""
    lp = PositionLP()
    checked = lifted = 0
    for seed in range(120):
        rng = random.Random(seed)
        C = rng.randint(2, 3)
        K, p = rng.randint(C, 5), rng.randint(C, 5)
        L = rng.randint(p, 10)
        cls = np.array([k % C for k in range(K)])
        units = np.array([rng.randint(1, 2) for _ in range(K)], dtype=float)
        cap = [rng.randint(1, 4) for _ in range(C)]
        slope = np.array([rng.uniform(0.1, 2) for _ in range(K)])
        base = np.array([[rng.choice([1, 2, 3, 4]) for _ in range(p)] for _ in range(K)], dtype=float)
        icpt0 = np.array([[rng.uniform(0, 1) for _ in range(p)] for _ in range(K)])
        # a slow link between classes 0 and 1, fast ones to class 2
        speed = {frozenset((0, 1)): 3.0}
        send_out = np.array([[math.inf if c == cls[o] else rng.uniform(0.2, 0.5) * speed.get(frozenset((int(cls[o]), c)), 1.0)
                              for c in range(C)] for o in range(K)])
        send_in = np.array([[math.inf if c == cls[o] else rng.uniform(0.2, 0.5) * speed.get(frozenset((int(cls[o]), c)), 1.0)
                             for c in range(C)] for o in range(K)])
        best = math.inf
        for combo in itertools.product(range(K), repeat=p):
            if len({int(cls[o]) for o in combo}) != C:
                continue
            if any(sum(units[o] for o in combo if cls[o] == c) > cap[c] for c in range(C)):
                continue
            lim, cost = [], []
            for s, o in enumerate(combo):
                nxt = int(cls[combo[s + 1]]) if s < p - 1 and cls[combo[s + 1]] != cls[o] else None
                prv = int(cls[combo[s - 1]]) if s > 0 and cls[combo[s - 1]] != cls[o] else None
                lim.append(base[o, s] - (nxt is not None) - (prv is not None))
                cost.append(icpt0[o, s] + (send_out[o, nxt] if nxt is not None else 0.0)
                            + (send_in[o, prv] if prv is not None else 0.0))
            if min(lim) < 1:
                continue
            for nbs in itertools.product(*[range(1, int(x) + 1) for x in lim]):
                if sum(nbs) == L:
                    best = min(best, sum(slope[o] * nb + c for o, nb, c in zip(combo, nbs, cost)))
        plain_cross = Cross(C, False)
        plain = lp.least_fill(*_args(plain_cross, base, icpt0, send_out, send_in, cls, slope, units, cap, L))
        ordered = min(lp.least_fill(*_args(c, base, icpt0, send_out, send_in, cls, slope, units, cap, L))
                      for c in orders(plain_cross, tuple(range(C))))
        assert ordered <= best + 1e-9, (seed, ordered, best)
        assert ordered >= plain - 1e-9, (seed, ordered, plain)
        if math.isfinite(best):
            checked += 1
            lifted += ordered > plain + 1e-6
    assert checked >= 40 and lifted >= checked // 4, (checked, lifted)


def _args(cross, base, icpt0, send_out, send_in, cls, slope, units, cap, L):
    most, icpt = _tables(cross, base, icpt0, send_out, send_in, cls)
    return most, slope, icpt, units, cls, cap, L, cross


def test_orders_leave_wrapping_pipelines_and_many_classes_alone():
    assert orders(Cross(3, True), (0, 1, 2)) == [Cross(3, True)]
    assert orders(Cross(4, False), (0, 1, 2, 3)) == [Cross(4, False)]
    got = orders(Cross(3, False), (0, 1, 2))
    assert len(got) == 7 and {c.order for c in got[:6]} == set(itertools.permutations((0, 1, 2)))
    assert got[6].fewest == 3 and got[6].partners == (0, 1, 2)      # C crossings, partners named
    assert orders(Cross(2, False), (0, 1))[2].partners == ()         # two classes: one partner each


def test_ordered_bound_holds_on_the_oracle_cases_and_lifts_some():
    """The search's call (per set of classes, with early exits at ``enough``) on the oracle
    cases' tuples of several classes: at most the brute-force optimum, and above the bound
    without orders on some.  (Each ordered LP restricts the LP without orders, as the test
    above checks on exact LPs; the bounds built on them come from a bisection and a grid, which
    may stop a hair apart, so the search keeps the larger of a tuple's levels.)"""
    checked = lifted = 0
    for seed in range(60):
        cluster, model, training = make_case(seed)
        classes, pricer = case_pricer(cluster, model, training)
        if len(classes) < 2:
            continue
        tuples = [k for k in enumerate_knobs(model, training, classes)
                  if k.num_stages > 1 and not SCHEDULES[k.schedule].wraps]
        for knobs in random.Random(seed).sample(tuples, min(5, len(tuples))):
            ctx = make_context(model, training, knobs)
            keys = pricer.option_keys(knobs)
            bound = KnobBound(pricer)
            if not bound.orders_apply(knobs, keys):
                continue
            best = solve_brute(pricer.price(knobs, ctx, keys))[0]
            if not best.ok:
                continue
            plain = KnobBound(pricer)(knobs, ctx, keys, packed=2)
            for x in (0.99, 1.02, math.inf):
                got = KnobBound(pricer)(knobs, ctx, keys, packed=2, ordered=True, enough=best.objective * x)
                assert got <= best.objective * (1 + 1e-9), (seed, knobs.label(), got, best.objective)
            full = bound(knobs, ctx, keys, packed=2, ordered=True)
            checked += 1
            lifted += full > plain * (1 + 1e-6)
    print(f"{checked} tuples, {lifted} lifted by the class orders")
    assert checked >= 30 and lifted >= 3, (checked, lifted)
