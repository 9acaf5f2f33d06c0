"""The rules' test ahead of memory (baseline_floor.Unpriced, issue 18): told the thresholds
seed would filter by, the rules propose exactly the layouts seed would price out of all
they propose (none is lost, whatever the thresholds: at, just under and above each layout's
own floor, and none), and the compute floor bounds every priced layout's time."""

from __future__ import annotations

import math

import pytest
from test_search_baselines import THROUGHPUT, all_baselines
from test_search_baselines_same import CASES

from planner.search.baseline_floor import Unpriced, compute_floor_s, kept
from planner.search.baselines import _Tuple, layouts_of
from planner.spec import Training, load_cluster, load_model

RULES = ("megatron", "sailor", "metis")


def _signature(layouts):
    return [(lay.rule, lay.where, tuple(lay.keys), None if lay.units is None else tuple(lay.units))
            for lay in layouts]


def _thresholds(floors: dict[str, list[float]]):
    """Per rule, levels at and around its layouts' floors (and 0 and inf: all filtered,
    none), each met with the other rules open and at the same level."""
    combos = []
    for rule in RULES:
        fs = sorted(set(floors.get(rule, [])))
        picks = [fs[0], fs[len(fs) // 2], fs[-1]] if fs else []
        mid = fs[len(fs) // 2] if fs else 1.0
        for level in {0.0, math.inf, *picks, mid * (1 - 1e-12), mid * (1 + 1e-6)}:
            for other in (math.inf, level):
                combos.append({r: (level if r == rule else other) for r in RULES})
    return combos


def _check(pricer, ranked) -> int:
    shared: dict = {}
    compared = 0
    for _, _, knobs, ctx, keys in ranked:
        every = layouts_of(_Tuple(pricer, knobs, ctx, keys, shared))
        tup = _Tuple(pricer, knobs, ctx, keys, shared)
        floors: dict[str, list[float]] = {}
        for lay in every:
            floors.setdefault(lay.rule, []).append(compute_floor_s(pricer, tup, lay))
        for thr in _thresholds(floors):
            def keep(layouts, thr=thr, tup=tup):
                return [lay for lay in layouts if kept(compute_floor_s(pricer, tup, lay), thr[lay.rule])]
            fresh = _Tuple(pricer, knobs, ctx, keys, shared)
            got = layouts_of(fresh, Unpriced(fresh, thr.__getitem__))
            assert _signature(keep(got)) == _signature(keep(every)), (knobs.label(), thr)
            compared += len(keep(every))
    return compared


@pytest.mark.parametrize("name", sorted(CASES))
def test_rules_propose_every_layout_seed_would_price(name):
    make, model_name, training = CASES[name]
    _, _, _, pricer, ranked = all_baselines(make(), load_model(model_name), training, THROUGHPUT)
    assert _check(pricer, ranked) > 0


@pytest.mark.slow
def test_rules_propose_every_layout_seed_would_price_three_classes():
    """Three node classes in three zones and a model whose small TP degrees do not fit (the
    shape of bench c, smaller)."""
    training = Training(global_batch_size=64, seq_len=2048, precision="fp16", zero_stages=(0, 1))
    _, _, _, pricer, ranked = all_baselines(load_cluster("cluster_specs/three-zone.yaml"),
                                            load_model("gpt-neo-2.7b"), training, THROUGHPUT)
    assert _check(pricer, ranked) > 0
