"""Pieces of the declared space: replica counts, shares, the boundary's busiest points."""

from __future__ import annotations

import itertools
import math

from planner.cost.comm import boundary_bytes
from planner.search.space import _busiest_points, replica_counts, shares


def test_replica_counts_are_the_fewest_for_each_largest_share():
    assert replica_counts(8) == (1, 2, 3, 4, 8)
    for B in range(1, 60):
        counts = replica_counts(B)
        largest = {-(-B // n) for n in range(1, B + 1)}
        assert {-(-B // n) for n in counts} == largest
        for n in counts:   # no smaller n gives the same largest share
            assert all(-(-B // k) != -(-B // n) for k in range(1, n))


def test_shares_sum_and_differ_by_at_most_one():
    for B, n in itertools.product(range(1, 30), range(1, 30)):
        if n <= B:
            s = shares(B, n)
            assert sum(s) == B and max(s) - min(s) <= 1 and s == sorted(s, reverse=True)


def test_busiest_points_give_the_boundary_bottleneck():
    """max over senders/receivers of (transfers x L0 + sequences x X), as comm.boundary_time_s."""
    for B in range(1, 25):
        for na, nb in itertools.product(range(1, B + 1), repeat=2):
            per = {}
            for i, j, seq in boundary_bytes(shares(B, na), shares(B, nb), 1.0):
                for key in (("s", i), ("r", j)):
                    c, k = per.get(key, (0, 0))
                    per[key] = (c + 1, k + seq)
            for L0, X in ((1.0, 0.0), (0.0, 1.0), (0.3, 2.0), (5.0, 0.1)):
                want = max(c * L0 + k * X for c, k in per.values())
                got = max(c * L0 + k * X for c, k in _busiest_points(B, na, nb))
                assert abs(want - got) < 1e-9


def test_knob_bounds_hold_on_every_tuple_of_the_oracle_cases():
    """The branch and bound prunes a knob tuple on its knob bound, so the bound (memory-free
    and memory-aware: intercepts, least sends) must never exceed the tuple's own optimum, which
    brute force over its priced problem gives."""
    import math
    import random

    from test_oracle import case_pricer, make_case

    from planner.search.bound import KnobBound
    from planner.search.core.brute import solve_brute
    from planner.search.knobs import enumerate_knobs, make_context

    checked = tight = 0
    for seed in range(16):
        cluster, model, training = make_case(seed)
        classes, pricer = case_pricer(cluster, model, training)
        knob_bound = KnobBound(pricer)
        tuples = enumerate_knobs(model, training, classes)
        for knobs in random.Random(seed).sample(tuples, min(12, len(tuples))):
            ctx = make_context(model, training, knobs)
            keys = pricer.option_keys(knobs)
            best = solve_brute(pricer.price(knobs, ctx, keys))[0]
            for memory in (False, True):
                kb = knob_bound(knobs, ctx, keys, memory=memory)
                if best.ok:
                    assert kb <= best.objective * (1 + 1e-9), (seed, knobs, memory, kb, best.objective)
                    tight += kb >= 0.9 * best.objective
                else:
                    assert kb >= 0 or math.isinf(kb)
            checked += best.ok
    print(f'{checked} tuples, {tight} bounds within 10%')
    assert checked >= 40
    assert tight >= checked           # not vacuous: half the bounds (2 per tuple) within 10%


def test_packed_bottleneck_lifts_and_still_holds(monkeypatch):
    """The max terms bounded together with the exposed DP sync, then with the fill
    (packed.py, packing.py): never above a tuple's brute-force optimum, with or without a pruning
    threshold (``enough``, which takes the short path: one knapsack at the threshold), above
    the bound without the packing on many tuples, and the fill above the bottleneck alone on
    some.  Seed 67's single-stage tuples have an exposed sync that binds: counting it more
    than once puts the bound above their optimum."""
    import random

    from test_oracle import case_pricer, make_case

    from planner.search import packing
    from planner.search.bound import KnobBound
    from planner.search.core.brute import solve_brute
    from planner.search.knobs import enumerate_knobs, make_context

    with_fill = packing.Packing.with_fill
    checked = lifted = filled = 0
    for seed in [*range(16, 48), 67]:
        cluster, model, training = make_case(seed)
        classes, pricer = case_pricer(cluster, model, training)
        knob_bound = KnobBound(pricer)
        tuples = enumerate_knobs(model, training, classes)
        sample = ([k for k in tuples if k.num_stages == 1] if seed == 67
                  else random.Random(seed).sample(tuples, min(8, len(tuples))))
        for knobs in sample:
            ctx = make_context(model, training, knobs)
            keys = pricer.option_keys(knobs)
            best = solve_brute(pricer.price(knobs, ctx, keys))[0]
            if not best.ok:
                continue
            plain = knob_bound(knobs, ctx, keys, packed=False)
            full = knob_bound(knobs, ctx, keys)
            near = knob_bound(knobs, ctx, keys, enough=best.objective * 0.98)
            far = knob_bound(knobs, ctx, keys, enough=best.objective * 1.02)
            assert plain * (1 - 1e-12) <= full <= best.objective * (1 + 1e-9), (seed, knobs, plain, full, best)
            assert max(near, far) <= best.objective * (1 + 1e-9), (seed, knobs, near, far, best)
            monkeypatch.setattr(packing.Packing, "with_fill", lambda self, M0, sums, enough: -math.inf)
            bottleneck_only = KnobBound(pricer)(knobs, ctx, keys)
            monkeypatch.setattr(packing.Packing, "with_fill", with_fill)
            checked += 1
            lifted += full > plain * (1 + 1e-6)
            filled += full > bottleneck_only * (1 + 1e-6)
    print(f"{checked} tuples, {lifted} lifted by the packed bottleneck, {filled} by the fill")
    assert checked >= 100 and lifted >= checked // 10 and filled >= checked // 20


def test_knapsack_level_with_positions_holds_and_lifts_some(monkeypatch):
    """The knapsack level (``packed=1``) also tests each position's own memory limit
    (``Packing.positions_hold``): still at most the brute-force optimum, and above the level
    without that test on some tuples (the first stages of 1F1B and zb-h1 hold more
    micro-batches in flight)."""
    import random

    from test_oracle import case_pricer, make_case

    from planner.search import packing
    from planner.search.bound import KnobBound
    from planner.search.core.brute import solve_brute
    from planner.search.knobs import enumerate_knobs, make_context

    checked = lifted = 0
    for seed in range(16, 48):
        cluster, model, training = make_case(seed)
        training = training.model_copy(update={"schedules": ("1f1b", "zb-h1", "interleaved-1f1b")})
        classes, pricer = case_pricer(cluster, model, training)
        tuples = [k for k in enumerate_knobs(model, training, classes) if k.num_stages > 1]
        for knobs in random.Random(seed).sample(tuples, min(8, len(tuples))):
            ctx = make_context(model, training, knobs)
            keys = pricer.option_keys(knobs)
            best = solve_brute(pricer.price(knobs, ctx, keys))[0]
            if not best.ok:
                continue
            # over all classes (``whole``: no early exits, so the two compare), then per set
            # of classes (the search's call)
            with_positions = KnobBound(pricer).whole(knobs, ctx, keys, True, packed=1)
            per_set = KnobBound(pricer)(knobs, ctx, keys, packed=1)
            monkeypatch.setattr(packing.Packing, "positions_hold", lambda self, M: True)
            without = KnobBound(pricer).whole(knobs, ctx, keys, True, packed=1)
            monkeypatch.undo()
            assert without * (1 - 1e-12) <= with_positions <= best.objective * (1 + 1e-9), \
                (seed, knobs.label(), without, with_positions, best.objective)
            assert per_set <= best.objective * (1 + 1e-9), (seed, knobs.label(), per_set, best.objective)
            checked += 1
            lifted += with_positions > without * (1 + 1e-6)
    print(f"{checked} tuples, {lifted} lifted by the positions' own limits")
    assert checked >= 100 and lifted >= 5, (checked, lifted)


def test_exposed_sync_lines_match_the_cost_model():
    """The bound's lines of the gradient sync, through ``exposed_sync_parts``, give
    ``comm.dp_exposed_s`` at every block count and position (ZeRO 0 to 3): the hinge form is
    one definition, the lines must be affine in the block count for it to hold between them."""
    from test_oracle import case_pricer, make_case

    from planner.cost import dp_exposed_s, dp_sync_time_s, replica_compute, stage_params
    from planner.cost.comm import exposed_sync_parts
    from planner.search.knobs import Knobs, make_context
    from planner.search.slots import POSITIONS

    cluster, model, training = make_case(3)
    classes, pricer = case_pricer(cluster, model, training)
    checked = 0
    for zero in (0, 1, 2, 3):
        knobs = Knobs(micro_batch_size=4, num_micro_batches=2, schedule="1f1b", virtual_stages=1,
                      recompute="none", zero_stage=zero, num_stages=2)
        ctx = make_context(model, training, knobs)
        for key in pricer.option_keys(knobs):
            if key.replicas < 2:
                continue
            info, ring = classes[key.cls], pricer.ring(key)
            slope, icpt = pricer.sync_lines(ctx, key, 1)
            (sf, sb, fb), _ = pricer.lines(ctx, knobs, key, 1)
            for pos, (emb, head) in enumerate(POSITIONS):
                for nb in (1, 3):
                    want_dp = dp_sync_time_s(ctx, stage_params(ctx, nb, emb, head), key.replicas, key.tp,
                                             ring.bandwidth_Bps, ring.latency_s, ring.kind, info.gpu)
                    rt = replica_compute(ctx, info.gpu, info.node_class.intra_Bps, key.tp,
                                         -(-4 // key.replicas), nb, emb, head)
                    want = dp_exposed_s(ctx, want_dp, rt.total_backward_s, rt.total_forward_s)
                    rs, ag = exposed_sync_parts(ctx, slope * nb + icpt[pos], sf * nb + fb[pos, 0], sb * nb + fb[pos, 1])
                    assert abs(slope * nb + icpt[pos] - want_dp) <= 1e-9 * max(want_dp, 1e-12)
                    assert abs(max(0.0, rs) + max(0.0, ag) - want) <= 1e-9 * max(want, 1e-12)
                    checked += 1
    assert checked >= 32


def _best_multiset(values, units, classes, capacity, most: int, options, exact: bool = False) -> float:
    """By enumeration: the largest total value of a multiset of at most (``exact``: exactly)
    ``most`` of ``options`` whose units fit every class's capacity (classes 0 and 1)."""
    best = -math.inf if exact else 0.0
    for n in range(most if exact else 0, most + 1):
        for combo in itertools.combinations_with_replacement(options, n):
            used = [sum(units[o] for o in combo if classes[o] == c) for c in (0, 1)]
            if all(u <= cap for u, cap in zip(used, capacity)):
                best = max(best, sum(values[o] for o in combo))
    return best


def _random_options(rng, most_options: int, units: tuple, cap0: tuple, cap1: tuple) -> tuple:
    """(rates, units, classes, capacity) of 1..most_options random options of two classes."""
    import numpy as np

    K = rng.randint(1, most_options)
    return (np.array([rng.uniform(0.1, 5) for _ in range(K)]), np.array([rng.randint(*units) for _ in range(K)]),
            np.array([rng.randrange(2) for _ in range(K)]), [rng.randint(*cap0), rng.randint(*cap1)])


def test_most_speed_equals_enumerating_option_multisets():
    """most_speed's knapsack against every multiset of at most (and of exactly) k options
    that fits."""
    import random

    from planner.search.pieces import most_speed

    for seed in range(30):
        rates, units, classes, capacity = _random_options(random.Random(seed), 6, (1, 4), (1, 6), (1, 6))
        K = len(rates)
        got = most_speed(rates, units, classes, capacity, 4)
        exact = most_speed(rates, units, classes, capacity, 4, exact=True)
        for k in range(1, 5):
            best = _best_multiset(rates, units, classes, capacity, k, range(K))
            assert abs(got[k - 1] - best) <= 1e-9 * max(1.0, best), (seed, k, got, best)
            best = _best_multiset(rates, units, classes, capacity, k, range(K), exact=True)
            assert exact[k - 1] == best or abs(exact[k - 1] - best) <= 1e-9 * max(1.0, best), (seed, k, exact, best)


def test_most_speed_on_a_coarse_grid_still_bounds_every_multiset(monkeypatch):
    """Past KNAPSACK_CELLS capacity units the knapsack counts whole cells of g units (each
    option floor(u / g) cells): never below the best multiset that fits, and not far above
    it on options of many units (c's classes have 512-768 nodes)."""
    import random

    import numpy as np

    from planner.search import pieces

    monkeypatch.setattr(pieces, "KNAPSACK_CELLS", 8)
    close = 0
    for seed in range(40):
        rates, units, classes, capacity = _random_options(random.Random(seed), 5, (2, 12), (9, 40), (1, 40))
        K = len(rates)
        for exact in (False, True):
            got = pieces.most_speed(rates, units, classes, capacity, 4, exact=exact)
            for k in range(1, 5):
                best = _best_multiset(rates, units, classes, capacity, k, range(K), exact=exact)
                assert got[k - 1] >= best - 1e-9 * max(1.0, abs(best)), (seed, k, exact, got, best)
                close += bool(np.isfinite(best) and got[k - 1] <= best * 1.25)
    assert close >= 250, close


def test_joint_row_bound_under_every_allocation():
    """joint_row_bound with the stages' own rates (prefix sums as R) never exceeds
    w_max max t + w_sum sum t over any split of L blocks (t_s = nb_s / r_s), and is tight
    for one stage."""
    import math
    import random

    import numpy as np

    from planner.search.fill import joint_row_bound

    for seed in range(200):
        rng = random.Random(seed)
        p, L = rng.randint(1, 4), rng.randint(1, 9)
        r = sorted((rng.uniform(0.2, 5) for _ in range(p)), reverse=True)
        w_max, w_sum = rng.choice([0.5, 1.0, 3.0, 31.0]), rng.choice([0.5, 1.0])
        best = math.inf
        for split in itertools.product(range(L + 1), repeat=p):
            if sum(split) == L:
                t = [n / x for n, x in zip(split, r)]
                best = min(best, w_max * max(t) + w_sum * sum(t))
        got = joint_row_bound(L, np.cumsum(r), 0.0, 0.0, w_max, w_sum)
        assert got <= best * (1 + 1e-9), (seed, got, best)
        if p == 1:
            assert math.isclose(got, best, rel_tol=1e-9)


def _joint_row_bound_scalar(L, rates, m_lb, fill_lb, w_max, w_sum):
    """fill.joint_row_bound one candidate at a time (its first form): the reference the
    vectorised one is held to."""
    import math

    import numpy as np
    d = np.sort(np.diff(np.concatenate([[0.0], np.asarray(rates, dtype=float)])))[::-1]
    d = d[d > 0]
    if not len(d):
        return 0.0
    P = np.cumsum(d)

    def fill(M):
        j = int(np.searchsorted(M * P * (1 + 1e-12), L, side="left"))
        if j >= len(d):
            return math.inf
        done = min(L, M * P[j - 1]) if j else 0.0
        return j * M + (L - done) / d[j]

    candidates = {max(m_lb, L / P[-1])}
    for j in range(len(d)):
        lo, hi = L / P[j], (L / P[j - 1] if j else math.inf)
        for M in (lo, hi):
            if math.isfinite(M) and M >= m_lb:
                candidates.add(M)
        slope = j - (P[j - 1] if j else 0.0) / d[j]
        if slope:
            M = (fill_lb - L / d[j]) / slope
            if lo <= M <= hi and M >= m_lb:
                candidates.add(M)
    return min(w_max * M + w_sum * max(fill_lb, fill(M)) for M in candidates)


def test_joint_row_bound_matches_its_scalar_form():
    """The vectorised joint_row_bound equals the candidate-by-candidate form on random rate
    caps (ties, zero increments, bottleneck and fill floors that bind or not)."""
    import math
    import random

    import numpy as np

    from planner.search.fill import joint_row_bound
    for seed in range(400):
        rng = random.Random(seed)
        k = rng.randint(1, 40)
        inc = [rng.choice([0.0, rng.uniform(0.01, 3.0), 1.0]) for _ in range(k)]
        rates = np.cumsum(sorted(inc, reverse=rng.random() < 0.8))
        L = rng.randint(1, 120)
        m_lb = rng.choice([0.0, rng.uniform(0, 5 * L / max(rates[-1], 1e-9))])
        fill_lb = rng.choice([0.0, rng.uniform(0, 3 * L / max(rates[-1], 1e-9))])
        args = (L, rates, m_lb, fill_lb, rng.choice([1.0, 7.0, 63.0]), rng.choice([0.5, 1.0]))
        want, got = _joint_row_bound_scalar(*args), joint_row_bound(*args)
        assert got == want or abs(got - want) <= 1e-12 * abs(want), (seed, got, want)
    # a bottleneck floor at infinity: no plan (not NaN from 0 x inf)
    assert joint_row_bound(8, np.cumsum([1.0, 0.5]), math.inf, 0.0, 7.0, 1.0) == math.inf


def _subset_bounds(cluster, model, training):
    """(bound over class subsets, bound over all options at once, brute-force optimum) per
    knob tuple with a feasible plan."""
    from test_oracle import case_pricer

    from planner.search.bound import KnobBound
    from planner.search.core.brute import solve_brute
    from planner.search.knobs import enumerate_knobs, make_context

    classes, pricer = case_pricer(cluster, model, training)
    knob_bound = KnobBound(pricer)
    for knobs in enumerate_knobs(model, training, classes):
        ctx = make_context(model, training, knobs)
        keys = pricer.option_keys(knobs)
        best = solve_brute(pricer.price(knobs, ctx, keys))[0]
        if best.ok:
            yield knobs, knob_bound(knobs, ctx, keys), knob_bound.whole(knobs, ctx, keys, True), best.objective


def test_class_subset_bound_lifts_and_still_holds():
    """knob_bound's least over the sets of classes a plan can use (with their sends between
    classes) against the same bound over all options at once: never lower, strictly higher on
    many multi-class tuples, and never above a tuple's brute-force optimum."""
    from test_oracle import make_case

    checked = lifted = 0
    for seed in range(0, 40, 2):
        cluster, model, training = make_case(seed)
        for knobs, kb, whole, best in _subset_bounds(cluster, model, training):
            assert whole * (1 - 1e-12) <= kb <= best * (1 + 1e-9), (seed, knobs, kb, whole, best)
            checked += 1
            lifted += kb > whole * (1 + 1e-6)
    print(f"{checked} tuples, {lifted} lifted")
    assert checked >= 100 and lifted >= checked // 5


def test_class_subset_bound_counts_each_crossing_once():
    """Two zones behind a thin link, where the best two-stage plans cross it once: the bound
    with one crossing send is the optimum itself there (counting one crossing too many would
    put it above), and holds on every tuple with up to three stages and all schedules (eight
    blocks: the brute force stays at a few seconds)."""
    from test_shared_link import MODEL, two_zones

    from planner.spec import Training, cluster_from_dict, load_model

    training = Training(global_batch_size=8, seq_len=2048, schedules=("1f1b", "interleaved-1f1b", "gpipe"),
                        recompute_modes=("none",), zero_stages=(1,), max_tp=1, max_stages=3)
    model = load_model(dict(MODEL, num_layers=8))
    exact = 0
    for aggregate in (None, "20 Gbit/s"):
        for knobs, kb, whole, best in _subset_bounds(cluster_from_dict(two_zones(aggregate)), model, training):
            assert whole * (1 - 1e-12) <= kb <= best * (1 + 1e-9), (aggregate, knobs, kb, whole, best)
            exact += kb >= best * (1 - 1e-6) and whole < 0.95 * best
    assert exact >= 2


def test_class_slots_bound_the_blocks_of_every_feasible_stage_set():
    """Slots.blocks: for each slope prefix, at least the most blocks any set of at most p
    stages (options among the prefix, within the classes' capacities) holds; equal when a
    class's options all take the same units."""
    import random

    import numpy as np

    from planner.search.fill import class_slots

    equal = 0
    for seed in range(60):
        rng = random.Random(seed)
        K = rng.randint(1, 5)
        U = np.array([float(rng.randint(1, 6)) for _ in range(K)])
        same_units = seed % 2 == 0
        units = np.array([2.0 if same_units else float(rng.randint(1, 4)) for _ in range(K)])
        cls = np.array([rng.randrange(2) for _ in range(K)])
        capacity = [rng.randint(1, 7), rng.randint(1, 7)]
        p = rng.randint(1, 4)
        got = class_slots(U, units, cls, capacity).blocks(p)
        for j in range(1, K + 1):
            best = _best_multiset(U, units, cls, capacity, p, range(j))
            assert got[j - 1] >= best - 1e-9, (seed, j, got, best)
            if same_units:
                assert got[j - 1] == best, (seed, j, got, best)
                equal += 1
    assert equal >= 60


def test_relaxed_plan_orders_group_each_class():
    """A send-free relaxation's stages, before they are priced with their sends: the found
    order, then each class's stages side by side (classes in order of first appearance, and
    reversed), block counts and options kept per stage."""
    from types import SimpleNamespace

    from planner.search.incumbent import grouped_orders

    classes = [0, 1, 0, 2, 1]
    prob = SimpleNamespace(options=[SimpleNamespace(label=SimpleNamespace(cls=c)) for c in classes])
    found = [(o, 10 + o) for o in range(len(classes))]
    orders = grouped_orders(prob, found)
    assert orders[0] == found
    assert orders[1] == [(0, 10), (2, 12), (1, 11), (4, 14), (3, 13)]
    assert orders[2] == [(3, 13), (1, 11), (4, 14), (0, 10), (2, 12)]
    assert grouped_orders(prob, [(0, 5), (2, 7)]) == [[(0, 5), (2, 7)]]   # one class: nothing to group


def test_position_lp_bounds_every_choice_of_one_option_per_position():
    """position_lp.PositionLP against enumeration: the most blocks is at least that of every choice
    of one option per position within the capacities, and the least fill at most the
    cheapest such choice holding L blocks; both exact on some cases (a relaxation that is
    never tight proves little); the fill's Lagrangian dual bound (no LP) likewise."""
    import random

    import numpy as np

    from planner.search.position_lp import PositionLP

    lp = PositionLP()
    tight_blocks = tight_fill = 0
    for seed in range(200):
        rng = random.Random(seed)
        K, p = rng.randint(1, 4), rng.randint(1, 3)
        L = rng.randint(p, 8)
        most = np.array([[rng.choice([0, 1, 2, 3, 5]) for _ in range(p)] for _ in range(K)], dtype=float)
        units = np.array([rng.randint(1, 3) for _ in range(K)], dtype=float)
        cls = np.array([rng.randrange(2) for _ in range(K)])
        cap = [rng.randint(1, 5), rng.randint(1, 5)]
        slope = np.array([rng.uniform(0.1, 2) for _ in range(K)])
        icpt = np.array([[rng.uniform(0, 1) for _ in range(p)] for _ in range(K)])
        best_blocks, best_fill = -math.inf, math.inf
        for combo in itertools.product(range(K), repeat=p):
            if any(most[o, s] < 1 for s, o in enumerate(combo)):
                continue
            if any(sum(units[o] for o in combo if cls[o] == c) > cap[c] for c in (0, 1)):
                continue
            best_blocks = max(best_blocks, sum(most[o, s] for s, o in enumerate(combo)))
            for nbs in itertools.product(*[range(1, int(most[o, s]) + 1) for s, o in enumerate(combo)]):
                if sum(nbs) == L:
                    best_fill = min(best_fill, sum(slope[o] * nb + icpt[o, s]
                                                   for s, (o, nb) in enumerate(zip(combo, nbs))))
        got_blocks = lp.most_blocks(most, units, cls, cap)
        got_fill = lp.least_fill(most, slope, icpt, units, cls, cap, L)
        assert got_blocks >= best_blocks - 1e-9, (seed, got_blocks, best_blocks)
        assert got_fill <= best_fill + 1e-9, (seed, got_fill, best_fill)
        if math.isfinite(got_fill):
            # the Lagrangian dual at the LP's own prices is the LP's value; at a nearby
            # bottleneck (fewer blocks allowed) it still bounds that LP from below
            dual = lp.fill_dual_bound(most, slope, icpt, units, cls, cap, L)
            assert abs(dual - got_fill) <= 1e-4 * max(1.0, abs(got_fill)), (seed, dual, got_fill)
            fewer = np.maximum(0.0, most - (rng.random() < 0.5))
            dual = lp.fill_dual_bound(fewer, slope, icpt, units, cls, cap, L)
            assert dual <= PositionLP().least_fill(fewer, slope, icpt, units, cls, cap, L) + 1e-9, seed
        tight_blocks += math.isfinite(best_blocks) and abs(got_blocks - best_blocks) < 1e-5
        tight_fill += math.isfinite(best_fill) and abs(got_fill - best_fill) < 1e-5 * max(1.0, best_fill)
    assert tight_blocks >= 50 and tight_fill >= 20, (tight_blocks, tight_fill)


def test_position_lp_with_crossings_bounds_every_plan_of_its_classes():
    """With ``Cross``, each position's option comes in four variants (its out / in side
    crossing to another class or not), each with its own limit and intercept.  Against
    enumeration of every choice of one option per position that uses exactly C classes,
    whose variants follow from its neighbours' classes (wrapping or not): the LP's most
    blocks is at least, its least fill at most, every such plan's; it is exact on some
    cases, and it prunes the variants a plan cannot have (a bound above the one without
    crossings on some cases, else the rows would be idle)."""
    import itertools
    import random

    import numpy as np

    from planner.search.position_lp import VARIANTS, Cross, PositionLP

    lp = PositionLP()
    tight = lifted = checked = 0
    for seed in range(150):
        rng = random.Random(seed)
        K, p, C = rng.randint(2, 4), rng.randint(2, 4), rng.randint(2, 3)
        wrap = rng.random() < 0.5
        L = rng.randint(p, 9)
        cls = np.array([k % C for k in range(K)] if K >= C else [rng.randrange(C) for _ in range(K)])
        units = np.array([rng.randint(1, 2) for _ in range(K)], dtype=float)
        cap = [rng.randint(1, 4) for _ in range(C)]
        slope = np.array([rng.uniform(0.1, 2) for _ in range(K)])
        # crossing sides hold fewer blocks and cost more: what a zone link does
        base = np.array([[rng.choice([1, 2, 3, 4]) for _ in range(p)] for _ in range(K)], dtype=float)
        most = np.stack([np.maximum(0.0, base - rng.choice([0, 1]) * (co + ci)) for co, ci in VARIANTS])
        icpt0 = np.array([[rng.uniform(0, 1) for _ in range(p)] for _ in range(K)])
        icpt = np.stack([icpt0 + 0.5 * (co + ci) for co, ci in VARIANTS])
        cross = Cross(C, wrap)
        best_blocks, best_fill = -math.inf, math.inf
        for combo in itertools.product(range(K), repeat=p):
            if len({int(cls[o]) for o in combo}) != C:
                continue
            if any(sum(units[o] for o in combo if cls[o] == c) > cap[c] for c in range(C)):
                continue
            var = []
            for s, o in enumerate(combo):
                nxt = combo[(s + 1) % p] if (wrap or s < p - 1) else None
                prv = combo[(s - 1) % p] if (wrap or s > 0) else None
                co = int(nxt is not None and cls[nxt] != cls[o])
                ci = int(prv is not None and cls[prv] != cls[o])
                var.append(VARIANTS.index((co, ci)))
            lim = [most[v, o, s] for s, (o, v) in enumerate(zip(combo, var))]
            if min(lim) < 1:
                continue
            best_blocks = max(best_blocks, sum(lim))
            for nbs in itertools.product(*[range(1, int(x) + 1) for x in lim]):
                if sum(nbs) == L:
                    best_fill = min(best_fill, sum(slope[o] * nb + icpt[v, o, s]
                                                   for s, (o, v, nb) in enumerate(zip(combo, var, nbs))))
        got_blocks = lp.most_blocks(most, units, cls, cap, cross)
        got_fill = lp.least_fill(most, slope, icpt, units, cls, cap, L, cross)
        assert got_blocks >= best_blocks - 1e-9, (seed, got_blocks, best_blocks)
        assert got_fill <= best_fill + 1e-9, (seed, got_fill, best_fill)
        if math.isfinite(best_fill):
            checked += 1
            tight += abs(got_fill - best_fill) < 1e-5 * max(1.0, best_fill)
            # without the rows, any variant anywhere: the least of them at each place
            plain = lp.least_fill(most.max(axis=0), slope, icpt.min(axis=0), units, cls, cap, L)
            lifted += got_fill > plain + 1e-6
    assert checked >= 40 and tight >= 5 and lifted >= checked // 2, (checked, tight, lifted)


def test_position_lp_leaves_the_milps_working_in_one_process():
    """HiGHS fixes its thread pool at its first run, process-wide: a PositionLP that ran first
    with more threads than the MILPs' one made every later MILP return no answer (the whole
    suite failed from test_search_core on).  A fresh process, the LP first."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import random, sys
        import numpy as np
        sys.path.insert(0, "tests")
        from test_search_core import random_problem
        from planner.search.core.milp import MilpSettings, solve_milp
        from planner.search.position_lp import PositionLP
        assert PositionLP().most_blocks(np.array([[2.0, 3.0]]), np.array([1.0]), np.array([0]), [4]) >= 5
        print(solve_milp(random_problem(random.Random(0)), MilpSettings(time_limit_s=20))[0].status)
    """)
    out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "optimal", out.stdout


def test_every_gpipe_plan_is_a_no_worse_1f1b_plan():
    """twins.gpipe_dominated prunes a GPipe tuple for its 1F1B twin: every feasible GPipe
    plan must be feasible for the twin (no more memory) and no slower, and the twin's best
    no worse.  Checked on the oracle's cases with the cost model's own pricing."""
    import random

    from test_oracle import case_pricer, make_case

    from planner.search.core.brute import solve_brute
    from planner.search.knobs import Knobs, enumerate_knobs, make_context
    from planner.search.twins import gpipe_dominated

    plans = strict = cases = 0
    for seed in range(30):
        cluster, model, training = make_case(seed)
        classes, pricer = case_pricer(cluster, model, training)
        tuples = enumerate_knobs(model, training, classes)
        pruned = gpipe_dominated(tuples)
        assert all(k.schedule == "gpipe" for k in pruned)
        assert bool(pruned) == ({"gpipe", "1f1b"} <= set(training.schedules)), seed
        cases += bool(pruned)
        for g in random.Random(seed).sample(sorted(pruned, key=Knobs.label), min(4, len(pruned))):
            twin = Knobs(g.micro_batch_size, g.num_micro_batches, "1f1b", 1, g.recompute, g.zero_stage, g.num_stages)
            assert twin in tuples
            ctx = make_context(model, training, g)
            keys = pricer.option_keys(g)
            pg, p1 = pricer.price(g, ctx, keys), pricer.price(twin, make_context(model, training, twin), keys)
            index = {o.label: i for i, o in enumerate(p1.options)}
            rng = random.Random(seed)
            for _ in range(40 if pg.options else 0):
                assign = [(rng.randrange(len(pg.options)), 1) for _ in range(g.num_stages)]
                extra = pg.num_blocks - g.num_stages
                for _ in range(extra):
                    s = rng.randrange(g.num_stages)
                    assign[s] = (assign[s][0], assign[s][1] + 1)
                if not pg.feasible(assign):
                    continue
                mapped = [(index[pg.options[o].label], nb) for o, nb in assign]
                assert p1.feasible(mapped), (seed, g.label())
                assert p1.objective(mapped) <= pg.objective(assign) * (1 + 1e-12), (seed, g.label())
                plans += 1
                strict += p1.objective(mapped) < pg.objective(assign) * (1 - 1e-9)
            best_g, best_1 = solve_brute(pg)[0], solve_brute(p1)[0]
            if best_g.ok:
                assert best_1.ok and best_1.objective <= best_g.objective * (1 + 1e-12)
    # not vacuous: some twins are strictly better (their share follows the cost constants: 7.4%
    # under the old efficiency curve, 4.3% under the per-GEMM one)
    assert cases >= 8 and plans >= 50 and strict >= plans // 40, (cases, plans, strict)


def test_knob_bound_past_the_deadline_skips_its_lps_and_stays_a_bound(monkeypatch):
    """The search sets its deadline on the knob bound: past it, the packed bound's LPs do not
    run (one tuple's LPs took a second on c and overran the time limit), and the bound it
    gives instead is still at most the one with them (both bound the same plans)."""
    from test_oracle import case_pricer, make_case

    from planner.search import position_lp
    from planner.search.bound import KnobBound
    from planner.search.knobs import enumerate_knobs, make_context

    runs = []
    run = position_lp.PositionModel._run
    monkeypatch.setattr(position_lp.PositionModel, "_run", lambda self, *a: runs.append(1) or run(self, *a))
    compared = 0
    for seed in (3, 5, 9, 21):
        cluster, model, training = make_case(seed)
        classes, pricer = case_pricer(cluster, model, training)
        for knobs in [k for k in enumerate_knobs(model, training, classes) if k.num_stages >= 2][:6]:
            ctx = make_context(model, training, knobs)
            keys = pricer.option_keys(knobs)
            late = KnobBound(pricer)
            late.set_deadline(0.0)
            runs.clear()
            cut = late(knobs, ctx, keys)
            assert not runs
            runs.clear()
            full = KnobBound(pricer)(knobs, ctx, keys)
            assert cut <= full * (1 + 1e-12) or cut == full
            compared += bool(runs)
    assert compared >= 5, compared


def test_position_lp_time_limit_counts_from_now_not_from_its_first_run():
    """HiGHS checks its time limit against all the time the instance has run: a deadline
    passed as time left made every LP after that much LP time stop at once, unsure (the
    bound fell back to the knapsacks long before the search's deadline)."""
    import time

    import numpy as np

    from planner.search.position_lp import PositionLP

    rng = np.random.default_rng(0)
    K, p = 40, 8
    args = (rng.integers(0, 8, size=(K, p)).astype(float), rng.uniform(0.1, 2, K), rng.uniform(0, 1, (K, p)),
            rng.integers(1, 4, size=K).astype(float), rng.integers(0, 3, size=K), [30, 30, 30], 24)
    lp = PositionLP()
    free = lp.least_fill(*args)
    assert math.isfinite(free)
    while lp._h.getRunTime() < 0.2:
        lp.least_fill(*args)
    lp.deadline = time.monotonic() + 0.1        # less time left than the instance has run
    assert lp.least_fill(*args) == free


def test_the_reported_space_is_the_one_the_training_lists():
    """The plan's ``solver.space`` states the freedoms searched: a training that lists fewer
    schedules, recompute modes or ZeRO stages, or caps stages and micro-batch sizes, is told so
    (the plan found keeps within them)."""
    from planner import api
    from planner.spec import Training

    cluster = api.load_cluster("cluster_specs/tiny-mixed.yaml")
    narrow = Training(global_batch_size=16, seq_len=512, schedules=("1f1b", "zb-h1"),
                      recompute_modes=("full",),
                      zero_stages=(1,), max_stages=2, micro_batch_sizes=(2, 4), max_tp=2)
    plan = api.plan(cluster, "opt-350m", narrow, time_limit_s=20).plan
    space = plan.solver.space
    assert "stages 1..2;" in space and "per-replica sizes 2/4;" in space and "up to 2 within" in space
    assert "schedules 1f1b, zb-h1 (rows bound its time" in space and "gpipe" not in space
    assert "recompute full;" in space and "ZeRO 1;" in space
    assert len(plan.stages) <= 2 and plan.schedule in ("1f1b", "zb-h1")
    assert (plan.recompute, plan.zero_stage) == ("full", 1)
    assert {r.micro_batch_share for st in plan.stages for r in st.replicas} <= {2, 4}
    default = api.plan(cluster, "opt-350m", Training(global_batch_size=16, seq_len=512), time_limit_s=20).plan
    assert "schedules 1f1b, gpipe, interleaved-1f1b (v=2); recompute none/selective/full; ZeRO 0/1;" \
        in default.solver.space


def test_the_reported_space_leaves_out_what_the_launcher_cannot_run():
    """With --launcher deepspeed the space states the schedules and context-parallel degrees
    searched (schedules_for, context_degrees), not the ones the training lists."""
    from planner.search.answer import _space
    from planner.spec import Training

    listed = Training(global_batch_size=8, seq_len=64, schedules=("1f1b", "interleaved-1f1b", "zb-h1"),
                      context_parallel_degrees=(1, 2))
    assert "schedules 1f1b, interleaved-1f1b (v=2), zb-h1 (rows bound" in _space(listed, None)
    assert "context parallel 2" in _space(listed, None)
    deepspeed = _space(listed, "deepspeed")
    assert "schedules 1f1b;" in deepspeed and "context parallel" not in deepspeed
