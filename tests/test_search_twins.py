"""Twin schedules (planner/search/twin_plans.py): a layout found for one knob tuple is priced
under the tuples that differ only in the schedule, exactly (the cost model's evaluate of the
named plan), where it fits their memory; ZB-H1 twins are never slower than their 1F1B layout;
and the warm start's stage-count firsts leave out a ZB-H1 tuple with an exact twin."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from test_search_baselines import MIXED, all_baselines

from planner.cost import evaluate
from planner.cost.memory import in_flight_micro_batches
from planner.search.incumbent import Best, add_twins
from planner.search.naming import build_plan
from planner.search.objectives import ObjectiveSpec
from planner.search.twin_plans import has_exact_twin, twin_index, twin_key, twins_of
from planner.search.warm import _warm_order
from planner.spec import Training, cluster_from_dict, load_model

SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-h1")


def _case(model_name: str = "opt-350m", **training):
    cluster, model = cluster_from_dict(MIXED), load_model(model_name)
    training = Training(global_batch_size=8, precision="fp16", schedules=SCHEDULES, **{"seq_len": 1024, **training})
    _, best, classes, pricer, ranked = all_baselines(cluster, model, training)
    return cluster, model, training, classes, pricer, ranked, best


def test_twins_share_every_knob_but_the_schedule():
    *_, ranked, _ = _case()
    index = twin_index(ranked)
    pairs = 0
    for item in ranked:
        for tw in twins_of(index, item.knobs):
            pairs += 1
            assert twin_key(tw.knobs) == twin_key(item.knobs) and tw.knobs.schedule != item.knobs.schedule
            assert tw.knobs.num_stages >= 2
    assert pairs > 0
    # one stage has no twins (ZB-H1 is then 1F1B, twins.py)
    assert not any(twins_of(index, it.knobs) for it in ranked if it.knobs.num_stages == 1)


def test_twin_key_reads_every_knob_but_the_schedule():
    from dataclasses import fields, replace

    from planner.search.knobs import Knobs
    base = Knobs(micro_batch_size=8, num_micro_batches=2, schedule="1f1b", virtual_stages=1, recompute="none",
                 zero_stage=1, num_stages=2)
    assert twin_key(replace(base, schedule="interleaved-1f1b", virtual_stages=2)) == twin_key(base)
    other = {"micro_batch_size": 4, "num_micro_batches": 4, "recompute": "full", "zero_stage": 3,
             "num_stages": 4, "reshard_after_forward": False, "context_parallel": 2, "expert_parallel": 2,
             "zero_shard_degree": 2}
    assert set(other) == {f.name for f in fields(Knobs)} - {"schedule", "virtual_stages"}
    for name, value in other.items():
        assert twin_key(replace(base, **{name: value})) != twin_key(base), name


@pytest.mark.parametrize("model_name, memory_bound", [("opt-350m", False), ("llama3-8b", True)])
def test_twin_plans_are_priced_exactly_and_zb_h1_is_never_slower(model_name, memory_bound):
    """Every baseline 1F1B layout of two or more stages under its twins; llama3-8b without
    recompute on 80 + 32 GB GPUs is memory-bound, and some of its layouts do not fit ZB-H1."""
    cluster, model, training, classes, pricer, ranked, baselines = _case(
        model_name, seq_len=2048 if memory_bound else 1024, recompute_modes=("none",) if memory_bound else ("none", "selective", "full"))
    index = twin_index(ranked)
    spec = ObjectiveSpec()
    added = refused_memory = 0
    for cand in [c for c in baselines.items if c.knobs.num_stages >= 2 and c.knobs.schedule == "1f1b"]:
        got = Best(10**6)
        add_twins(pricer, index, cand, spec, None, got)
        schedules = {c.knobs.schedule for c in got.items}
        for tw in got.items:
            added += 1
            assert tw.layout == cand.layout and twin_key(tw.knobs) == twin_key(cand.knobs)
            plan = build_plan(cluster, model, training, classes, tw.knobs, tw.layout, spec.to_plan_objective())
            ev = evaluate(cluster, plan, model=model)
            assert ev.fits
            assert math.isclose(ev.iteration_time_s, tw.time_s, rel_tol=1e-9)
            if tw.knobs.schedule == "zb-h1":
                assert tw.time_s <= cand.time_s * (1 + 1e-12)
        if "zb-h1" not in schedules:
            # refused: the layout must not fit ZB-H1's memory (it holds min(p, m) micro-batches
            # on every stage, 1F1B min(p - s, m)), as evaluate says of the named plan
            zb = next(t for t in twins_of(index, cand.knobs) if t.knobs.schedule == "zb-h1")
            plan = build_plan(cluster, model, training, classes, zb.knobs, cand.layout, spec.to_plan_objective())
            assert not evaluate(cluster, plan, model=model, check=False).fits
            refused_memory += 1
    assert added > 0
    assert (refused_memory > 0) == memory_bound
    p, m = 4, 8
    assert in_flight_micro_batches("zb-h1", p, p - 1, m) > in_flight_micro_batches("1f1b", p, p - 1, m)



def test_twin_plans_polished_on_their_layout_are_exact_and_never_worse():
    """With a deadline each twin is also polished on the layout's own options under its rows
    (c + zb-h1's answer, 1.922 -> 1.866 s, came from the interleaved answer's twin): every
    polished plan is a plan of the twin (evaluate agrees, it fits), and the best plan of each
    twin is never slower than the same layout."""
    from planner.search import clock

    cluster, model, training, classes, pricer, ranked, baselines = _case()
    index = twin_index(ranked)
    spec = ObjectiveSpec()
    moved = 0
    for cand in [c for c in baselines.items if c.knobs.num_stages >= 2 and c.knobs.schedule == "1f1b"]:
        same, polished = Best(10**6), Best(10**6)
        add_twins(pricer, index, cand, spec, None, same)
        add_twins(pricer, index, cand, spec, None, polished, deadline=clock.now() + 5.0)
        for tw in polished.items:
            plan = build_plan(cluster, model, training, classes, tw.knobs, tw.layout, spec.to_plan_objective())
            ev = evaluate(cluster, plan, model=model)
            assert ev.fits and math.isclose(ev.iteration_time_s, tw.time_s, rel_tol=1e-9)
            moved += tw.layout != cand.layout
        for schedule in {c.knobs.schedule for c in same.items}:
            first = min(c.time_s for c in same.items if c.knobs.schedule == schedule)
            assert min(c.time_s for c in polished.items if c.knobs.schedule == schedule) <= first
    assert moved > 0

def test_warm_start_order_leaves_out_long_zb_h1_with_an_exact_twin():
    *_, pricer, ranked, _ = _case()
    # ZB-H1 first, as the memory-free ranking puts it (its rows only bound its time)
    ranked = sorted(ranked, key=lambda x: x.knobs.schedule != "zb-h1")
    index = twin_index(ranked)
    best = Best(1)

    def no_bound(*args, **kw):
        return 0.0

    order = list(_warm_order(ranked, no_bound, best, pricer, index))
    n_enum = len({(x.knobs.num_stages, x.knobs.micro_batch_size, x.knobs.schedule) for x in ranked
                  if x.knobs.num_stages <= 2})
    longer = {x.knobs.num_stages for x in ranked if x.knobs.num_stages > 2}
    enums, firsts = order[:n_enum], order[n_enum:n_enum + len(longer)]
    assert any(x.knobs.schedule == "zb-h1" for x in enums)       # enumerations keep their per-schedule firsts
    assert {x.knobs.num_stages for x in firsts} == longer
    assert not any(x.knobs.schedule == "zb-h1" for x in firsts)
    long_zb = [x for x in ranked if x.knobs.num_stages > 2 and x.knobs.schedule == "zb-h1"]
    assert long_zb and all(has_exact_twin(index, x.knobs) for x in long_zb)
    # every tuple is still in the order once (the rest of ranked follows the firsts)
    assert sorted(x.index for x in order) == sorted(x.index for x in ranked)
    # once a ZB-H1 plan holds the incumbent (its twin won: c + zb-h1, 1.866 s, and then its
    # second pass's ZB-H1 firsts found 1.828 s), ZB-H1 tuples may be firsts again
    zb_top = Best(1)
    zb_top.add(SimpleNamespace(key=(1.0,), time_s=1.0, knobs=long_zb[0].knobs, signature=("zb",)))
    order = list(_warm_order(ranked, no_bound, zb_top, pricer, index))
    assert any(x.knobs.schedule == "zb-h1" for x in order[n_enum:n_enum + len(longer)])
    assert sorted(x.index for x in order) == sorted(x.index for x in ranked)


def test_warm_start_firsts_reach_a_steady_state_where_their_stage_count_can():
    """Per stage count (more than two stages) the first tuple has m >= p where one exists,
    however the ranking put the others: the bounds underrate a pipeline that never fills."""
    *_, pricer, ranked, _ = _case()
    # the pipelines without a steady state first, as the cheap bounds tended to put them
    ranked = sorted(ranked, key=lambda x: x.knobs.num_micro_batches >= x.knobs.num_stages)
    assert any(x.knobs.num_micro_batches < x.knobs.num_stages for x in ranked[:5] if x.knobs.num_stages > 2)
    index = twin_index(ranked)

    def no_bound(*args, **kw):
        return 0.0

    order = list(_warm_order(ranked, no_bound, Best(1), pricer, index))
    n_enum = len({(x.knobs.num_stages, x.knobs.micro_batch_size, x.knobs.schedule) for x in ranked
                  if x.knobs.num_stages <= 2})
    longer = {x.knobs.num_stages for x in ranked if x.knobs.num_stages > 2}
    firsts = order[n_enum:n_enum + len(longer)]
    can = {x.knobs.num_stages for x in ranked if x.knobs.num_stages > 2
           and x.knobs.num_micro_batches >= x.knobs.num_stages}
    assert can, "the case has no steady pipeline of three or more stages: pick another"
    for x in firsts:
        assert x.knobs.num_micro_batches >= x.knobs.num_stages or x.knobs.num_stages not in can, x.knobs.label()
    assert sorted(x.index for x in order) == sorted(x.index for x in ranked)
