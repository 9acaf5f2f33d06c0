"""The V schedules (zb-v, dualpipev) in the search (planner/search/v_rows.py): their rows are a
lower bound on the action-list executor's makespan, rank 0 is priced with the embedding and
the head as evaluate prices a V, every incumbent is priced by the executor, and the reported
gap holds against the brute-force oracle; the search picks zb-v where it is faster, and not
where memory rules it out."""

from __future__ import annotations

import math
import random

import pytest
from test_oracle import make_case
from test_search_zbh1 import _two_gpus

from planner.cost import evaluate
from planner.cost.schedule import StageTiming, pipeline_time_s
from planner.search.knobs import Knobs, enumerate_knobs
from planner.search.oracle import oracle
from planner.search.schedules import SCHEDULES, schedules_for
from planner.search.solve import solve


def _rows_value_s(name: str, stages: list[StageTiming], m: int) -> float:
    """The registry's rows and terms evaluated on per-rank timings (quantities forward,
    backward, 0, 0, 0, input = backward - W; ``out`` prices the send to the next rank,
    ``inn`` the one to the previous; no DP sync or optimizer step)."""
    rows, terms = SCHEDULES[name].rows(len(stages), m, 2)
    total = 0.0
    for t in terms:
        row = rows[t.row]
        vals = []
        for st in stages:
            q = (st.forward_s, st.backward_s, 0.0, 0.0, 0.0, st.backward_s - st.backward_weight_s)
            v = sum(c * x for c, x in zip(row.stage, q))
            v += sum(row.out) * st.send_forward_s + sum(row.inn) * st.send_backward_s
            vals.append(v)
        total += t.weight * (max(0.0, max(vals)) if t.kind == "max" else sum(vals))
    return total


def _random_stages(rng: random.Random, p: int) -> list[StageTiming]:
    """Unequal ranks, W from 0 to the whole backward, sends on some boundaries (a boundary's
    time is the sender's send_forward_s and the receiver's send_backward_s, as evaluate sets)."""
    times = []
    for s in range(p):
        f, b = rng.uniform(0.05, 2.0), rng.uniform(0.05, 4.0)
        w = rng.choice([0.0, b, rng.uniform(0.0, b)])
        times.append((f, b, w, rng.choice([0.0, rng.uniform(0.0, 1.0)]) if s < p - 1 else 0.0))
    return [StageTiming(forward_s=f, backward_s=b, backward_weight_s=w, send_forward_s=sf,
                        send_backward_s=times[s - 1][3] if s else 0.0)
            for s, (f, b, w, sf) in enumerate(times)]


@pytest.mark.parametrize("name", ["zb-v", "dualpipev"])
def test_rows_never_exceed_the_executor_makespan(name):
    """docs/search-space.md's proof, checked on 800 random pipelines (p 2-6, m from the least
    admitted to 3p, both row forms): the rows never exceed the executor's makespan and meet it
    on some.  Not vacuous: the work floor and the path added together (each alone is valid,
    their sum is not) exceed it on most."""
    rng = random.Random(1)
    entry = SCHEDULES[name]
    worst, over = 0.0, 0
    for _ in range(800):
        p = rng.randint(2, 6)
        m = rng.randint(max(1, entry.min_m_per_stage * p), 3 * p)
        stages = _random_stages(rng, p)
        exact = pipeline_time_s(stages, m, name)
        bound = _rows_value_s(name, stages, m)
        assert bound <= exact * (1 + 1e-12), (p, m, stages)
        worst = max(worst, bound / exact)
        work = max(m * s.busy_s + (2 * m - 1) * (s.send_forward_s + s.send_backward_s) for s in stages)
        path = sum(s.busy_s - s.backward_weight_s + 2 * (s.send_forward_s + s.send_backward_s) for s in stages)
        over += work + path > exact * (1 + 1e-9)
    assert worst > 0.999
    assert over > 400


def test_rows_on_equal_stages():
    """Unit chunk times (F = I = W = 1 per chunk): the executor's ZB-V time is
    6m + max(p - 1, 4p - 2m - 2); the work floor gives 6m, the path 4p."""
    for p, m, want in ((4, 8, 48), (4, 2, 16), (8, 64, 6 * 64)):
        stages = [StageTiming(forward_s=2.0, backward_s=4.0, backward_weight_s=2.0)] * p
        assert pipeline_time_s(stages, m, "zb-v") == 6 * m + max(p - 1, 4 * p - 2 * m - 2)
        assert _rows_value_s("zb-v", stages, m) == pytest.approx(want)


def test_registry_entries():
    for name in ("zb-v", "dualpipev"):
        e = SCHEDULES[name]
        assert e.block_unit() == 2 and e.launchers == () and not e.exact and not e.wraps
        assert e.stage_ends(4, 0) == (True, True) and e.stage_ends(4, 3) == (False, False)
        assert e.stage_ends(1, 0) == (True, True)
        assert not e.admits(1, 8, 8)                      # a V needs two ranks
        assert not e.admits(4, 8, 6)                      # 3 pairs of blocks for 4 ranks
    assert SCHEDULES["zb-v"].admits(4, 3, 8)
    assert not SCHEDULES["dualpipev"].admits(4, 7, 8) and SCHEDULES["dualpipev"].admits(4, 8, 8)
    assert SCHEDULES["1f1b"].stage_ends(4, 3) == (False, True)


def test_launchers_leave_the_v_schedules_out():
    training = make_case(28)[2].model_copy(update={"schedules": ("1f1b", "zb-v", "dualpipev")})
    for launcher in ("megatron", "deepspeed"):
        assert [s.name for s in schedules_for(training, launcher)] == ["1f1b"]


@pytest.mark.parametrize("seed", [6, 24, 28, 0, 13])
def test_oracle_agrees_within_the_reported_gap(seed):
    """With zb-v and dualpipev in the space: the search's bound is at most the oracle's
    optimum, its plan at least it and within the reported gap, and the plan it writes
    evaluates to the time it reports (rank 0 priced with the embedding and the head: with the
    head on the last stage, as for a loop, these plans are 2.6-11% off evaluate).  Seeds 6,
    24, 28: zb-v is the oracle's best; 0, 13: it is not."""
    cluster, model, training = make_case(seed)
    training = training.model_copy(update={"schedules": (*training.schedules, "zb-v", "dualpipev")})
    ref = oracle(cluster, model, training)
    res = solve(cluster, model, training, time_limit_s=60.0)
    rep = res.report
    assert rep.bound <= ref.value * (1 + 1e-9)
    assert rep.objective >= ref.value * (1 - 1e-9)
    assert (rep.objective - ref.value) <= rep.gap * rep.objective * (1 + 1e-9)
    assert rep.priced_vs_evaluated_rel < 1e-9
    ev = evaluate(cluster, res.plan, model=model)
    assert ev.iteration_time_s == pytest.approx(rep.objective, rel=1e-9)
    assert (ref.plan.schedule == "zb-v") == (seed in (6, 24, 28))
    assert (res.plan.schedule == "zb-v") == (seed in (6, 24, 28))


def test_search_picks_zb_v_where_faster_and_not_where_memory_forbids_it():
    """Two GPUs, 1.8 GiB: two ranks of ZB-V are 8% faster than the best 1F1B plan and the
    search picks them.  1.75 GiB: rank 0 holds the embedding, the head and 1.5 micro-batches
    of its two chunks, the same layout no longer fits, and the search (agreeing with the
    oracle) picks 1F1B."""
    cluster, model, training = _two_gpus(1.8)
    training = training.model_copy(update={"schedules": ("1f1b", "zb-v")})
    fast = solve(cluster, model, training, time_limit_s=60.0)
    only_1f1b = oracle(cluster, model, training.model_copy(update={"schedules": ("1f1b",)}))
    assert fast.plan.schedule == "zb-v" and fast.plan.num_stages == 2
    assert fast.report.objective < only_1f1b.value * 0.95
    cluster, model, training = _two_gpus(1.75)
    training = training.model_copy(update={"schedules": ("1f1b", "zb-v")})
    tight = solve(cluster, model, training, time_limit_s=60.0)
    ref = oracle(cluster, model, training)
    assert tight.plan.schedule == "1f1b" and ref.plan.schedule == "1f1b"
    assert math.isclose(tight.report.objective, ref.value, rel_tol=1e-9)
    as_v = tight.plan.model_copy(update={"schedule": "zb-v", "virtual_stages": 2})
    assert not evaluate(cluster, as_v, model=model, check=False).fits


def test_knobs_carry_two_chunks_and_dualpipev_rule():
    cluster, model, training = make_case(28)
    training = training.model_copy(update={"schedules": ("zb-v", "dualpipev")})
    from test_oracle import case_pricer
    classes, _ = case_pricer(cluster, model, training)
    knobs = enumerate_knobs(model, training, classes)
    assert knobs and all(k.virtual_stages == 2 and k.num_stages >= 2 for k in knobs)
    assert all(k.num_micro_batches >= 2 * k.num_stages for k in knobs if k.schedule == "dualpipev")
    assert Knobs(2, 2, "zb-v", 2, "none", 0, 2).block_unit == 2


def test_knob_bounds_hold_on_v_tuples_with_and_without_mixed_stages():
    """Every level of the knob bound of a zb-v / dualpipev tuple (bound.py, packed.py: the
    per-position intercepts re-indexed by ``role_positions``, rank 0 with both ends) stays at
    most the tuple's optimum of its rows (brute force over the priced options, mixed stages'
    included where the case has them), and comes within 10% of it on some."""
    from test_oracle import case_pricer
    from test_search_mixed import MIXED_SEEDS, mixed_case

    from planner.search.bound import KnobBound
    from planner.search.core.brute import solve_brute
    from planner.search.knobs import make_context
    checked = tight = mixed = 0
    cases = [make_case(s) for s in (6, 24, 28, 3)] + [mixed_case(s) for s in MIXED_SEEDS[:8]]
    for seed, (cluster, model, training) in enumerate(cases):
        training = training.model_copy(update={"schedules": ("zb-v", "dualpipev")})
        classes, pricer = case_pricer(cluster, model, training)
        knob_bound = KnobBound(pricer)
        tuples = enumerate_knobs(model, training, classes)
        for knobs in random.Random(seed).sample(tuples, min(16, len(tuples))):
            ctx = make_context(model, training, knobs)
            keys = [*pricer.option_keys(knobs), *pricer.stand_ins(knobs)]
            best = solve_brute(pricer.price(knobs, ctx, keys))[0]
            if not best.ok:
                continue
            bounds = [knob_bound(knobs, ctx, keys, memory=False),
                      *(knob_bound(knobs, ctx, keys, packed=level) for level in range(4)),
                      knob_bound(knobs, ctx, keys, enough=best.objective * 0.98)]
            assert max(bounds) <= best.objective * (1 + 1e-9), (seed, knobs.label(), bounds, best.objective)
            checked += 1
            tight += max(bounds) >= 0.9 * best.objective
            mixed += bool(pricer.stand_ins(knobs))
    assert checked >= 20 and tight >= 3 and mixed >= 1, (checked, tight, mixed)
