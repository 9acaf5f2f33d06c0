"""The baselines made fast (issue 18: memory limits from the memory model alone and shared,
a lower bound that skips classes and TP degrees that cannot hold a stage, one CoreProblem per
knob tuple) give the answers of their first implementation: kept here as the oracle, each
stage's memory limit read off the option as the search prices it (Pricer._option) and each
layout priced on a CoreProblem of its own options."""

from __future__ import annotations

import math

import pytest
from test_search_baselines import LAB, MIXED, SPECS, THROUGHPUT, TWO_ZONES, all_baselines

from planner.search.baselines import (
    Layout,
    _stage_classes,
    _Tuple,
    _where,
    admits,
    compute_floor_s,
    metis,
    priced_layouts,
    seed,
)
from planner.search.incumbent import Best, Candidate, prepare
from planner.search.knobs import OptionKey
from planner.search.objectives import ObjectiveSpec
from planner.spec import Training, cluster_from_dict, load_cluster, load_model


class _Reference(_Tuple):
    """Memory limits read off the fully priced option, stage by stage."""

    def fits(self, key, s, units):
        if key not in self.keys:
            return False
        opt = self.pricer._option(self.ctx, self.knobs, key, self.unit, self.L_units)
        return opt is not None and 1 <= units <= opt.max_blocks[s]


def _spread(slots, p):
    total = sum(slots)
    if total < p:
        return None
    raw = [p * s / total for s in slots]
    out = [min(s, int(r // 1)) for s, r in zip(slots, raw)]
    order = sorted(range(len(slots)), key=lambda i: (out[i] - raw[i], i))
    while sum(out) < p:
        for i in order:
            if sum(out) < p and out[i] < slots[i]:
                out[i] += 1
    return out


def _megatron(tup):
    pricer, p = tup.pricer, tup.knobs.num_stages
    even = tup.L_units // p
    n_cls = len(pricer.classes)
    sets = [[c] for c in range(n_cls)] + ([list(range(n_cls))] if n_cls > 1 else [])
    out = []
    for t in tup.tps:
        for cs in sets:
            for d in tup.replicas:
                ks = [OptionKey(c, t, d) for c in cs]
                if any(k not in tup.keys for k in ks):
                    continue
                counts = _spread([pricer.classes[k.cls].capacity_units // k.units_in(pricer.classes) for k in ks], p)
                if counts is None:
                    continue
                stage_cls = _stage_classes(counts, cs)
                keys = [OptionKey(c, t, d) for c in stage_cls]
                if all(tup.fits(k, s, even) for s, k in enumerate(keys)):
                    out.append(Layout("megatron", _where(pricer, stage_cls), keys, None))
                    break
    return out


def _sailor(tup):
    pricer, p = tup.pricer, tup.knobs.num_stages
    even = tup.L_units // p
    tps, cs = tup.tps, list(range(len(pricer.classes)))
    for d in tup.replicas:
        least = {c: next((t for t in tps if OptionKey(c, t, d) in tup.keys), None) for c in cs}
        use = [c for c in cs if least[c] is not None]
        if not use:
            continue
        counts = _spread([pricer.classes[c].capacity_units // OptionKey(c, least[c], d).units_in(pricer.classes)
                          for c in use], p)
        if counts is None:
            continue
        stage_cls = _stage_classes(counts, use)
        keys = []
        for s, c in enumerate(stage_cls):
            t = next((t for t in tps if tup.fits(OptionKey(c, t, d), s, even)), None)
            if t is None:
                break
            keys.append(OptionKey(c, t, d))
        if len(keys) < p:
            continue
        used: dict[int, int] = {}
        for k in keys:
            used[k.cls] = used.get(k.cls, 0) + k.units_in(pricer.classes)
        if all(u <= pricer.classes[c].capacity_units for c, u in used.items()):
            return [Layout("sailor", _where(pricer, stage_cls), keys, None)]
    return []


def _reference(pricer, tup, spec, launcher):
    if tup.L_units % tup.knobs.num_stages:
        return []
    layouts = _megatron(tup) + _sailor(tup)
    out = []
    for lay in layouts + metis(tup, layouts):
        prob = pricer.price(tup.knobs, tup.ctx, list(dict.fromkeys(lay.keys)))
        prepare(prob, spec, launcher)
        index = {o.label: i for i, o in enumerate(prob.options)}
        cand = None
        if all(k in index for k in lay.keys):
            units = lay.units or [tup.L_units // tup.knobs.num_stages] * tup.knobs.num_stages
            assign = [(index[k], u) for k, u in zip(lay.keys, units)]
            if prob.feasible(assign):
                cand = Candidate.of(prob, assign, prob.objective(assign), tup.knobs, spec)
                cand = cand if admits(spec, cand, pricer.training) else None
        out.append((lay, cand))
    return out


def _answers(pairs):
    return [(lay.rule, lay.where, tuple(lay.keys), None if lay.units is None else tuple(lay.units),
             None if c is None else (c.key, c.time_s, c.price_usd_per_hour, tuple(c.layout))) for lay, c in pairs]


CASES = {
    "mixed-2x4": (lambda: cluster_from_dict(MIXED), "opt-350m", Training(global_batch_size=8, seq_len=1024, precision="fp16")),
    "two-zone": (lambda: cluster_from_dict(TWO_ZONES), "opt-350m", Training(global_batch_size=4, seq_len=1024)),
    "lab-mixed": (lambda: load_cluster(SPECS / "lab-mixed.yaml"), "opt-350m", LAB),
    # ZeRO 0-3 and every recompute: the memory bound reads the ZeRO shards and the gathers
    "tiny-mixed-zero": (lambda: load_cluster(SPECS / "tiny-mixed.yaml"), "opt-350m",
                        Training(global_batch_size=8, seq_len=512, zero_stages=(0, 1, 2, 3))),
    "big-model": (lambda: cluster_from_dict(MIXED), "gpt-neo-2.7b", Training(global_batch_size=8, seq_len=2048, precision="fp16")),
    "zb-h1": (lambda: cluster_from_dict(MIXED), "opt-350m",
              Training(global_batch_size=8, seq_len=1024, precision="fp16", schedules=("1f1b", "zb-h1", "gpipe"))),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("objective", ["throughput", "cost"])
def test_fast_baselines_equal_the_first_implementation(name, objective):
    make, model_name, training = CASES[name]
    cluster, model = make(), load_model(model_name)
    spec = ObjectiveSpec(objective)
    _, _, _, pricer, ranked = all_baselines(cluster, model, training, spec)
    if spec.needs_prices and any(c.node_price_usd_per_hour is None for c in pricer.classes):
        pytest.skip("the cluster has no prices")
    limits: dict = {}
    compared = 0
    for _, _, knobs, ctx, keys in ranked:
        fast = priced_layouts(pricer, _Tuple(pricer, knobs, ctx, keys, limits), spec, None)
        slow = _reference(pricer, _Reference(pricer, knobs, ctx, keys), spec, None)
        assert _answers(fast) == _answers(slow), knobs.label()
        compared += sum(c is not None for _, c in fast)
        # the compute floor that lets seed leave layouts unpriced is below every layout's time
        tup = _Tuple(pricer, knobs, ctx, keys, limits)
        for lay, cand in fast:
            if cand is not None:
                assert compute_floor_s(pricer, tup, lay) <= cand.time_s * (1 + 1e-12), (knobs.label(), lay)
    assert compared > 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_layouts_left_unpriced_change_nothing(name):
    """seed leaves a layout unpriced when its compute floor reaches its rule's best and the
    incumbents' threshold: the rules' bests and the incumbents are those of pricing them all."""
    make, model_name, training = CASES[name]
    cluster, model = make(), load_model(model_name)
    _, _, _, pricer, ranked = all_baselines(cluster, model, training)
    runs = []
    for skip in (True, False):
        best = Best(2)
        res = seed(pricer, ranked, THROUGHPUT, None, best, stop_at=math.inf, skip=skip)
        runs.append((res, best))
    (fast, fast_best), (every, every_best) = runs
    assert fast.priced < every.priced
    assert {r: (c.time_s, c.knobs, c.layout) for r, c in fast.by_rule.items()} == \
        {r: (c.time_s, c.knobs, c.layout) for r, c in every.by_rule.items()}
    assert fast.name == every.name
    assert [(c.time_s, c.knobs, c.layout) for c in fast_best.items] == \
        [(c.time_s, c.knobs, c.layout) for c in every_best.items]
