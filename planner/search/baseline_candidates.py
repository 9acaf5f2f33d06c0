"""The baseline rules' candidates (baselines.py) before any memory check, and their floors.

A rule tries its candidates in order and takes the first that fits memory: ``megatron`` per
TP degree and set of classes, the replica counts with equal shares, largest first; ``sailor``
the replica counts, with each class's stages in proportion to how many it holds at its least
TP degree.  What the candidates are depends on the tuple's options, B and p alone, and their
slopes on what Pricer.kind_lines reads: both are cached in the seed call's shared dict, keyed
by the options list's id (kept alive there, baseline_tuple._Options), so the tuples that differ
in the schedule, ZeRO stage or micro-batch count read them once.
"""

from __future__ import annotations

import math
from functools import lru_cache

from planner.search.baseline_floor import Floors, stage_work_s
from planner.search.baseline_tuple import _Tuple
from planner.search.knobs import OptionKey


@lru_cache(maxsize=65536)
def _spread(slots: tuple[int, ...], p: int) -> tuple[int, ...] | None:
    """Stages per class: in proportion to the stages each can hold (largest remainder), at
    most its slots; None when they hold fewer than p (cached: the same slots come back in
    every knob tuple)."""
    total = sum(slots)
    if total < p:
        return None
    raw = [p * s / total for s in slots]
    out = [min(s, math.floor(r)) for s, r in zip(slots, raw)]
    order = sorted(range(len(slots)), key=lambda i: (out[i] - raw[i], i))
    while sum(out) < p:
        for i in order:
            if sum(out) < p and out[i] < slots[i]:
                out[i] += 1
    return tuple(out)


def megatron_candidates(tup: _Tuple, cs: list[int], t: int) -> list[tuple[int, tuple[int, ...]]]:
    """(replicas d, stages per class of ``cs``) at TP ``t``, for each d with equal shares
    whose options all classes have and whose stages they hold, largest first: the order
    ``megatron`` tries them (memory aside, they depend on the tuple's options and p alone:
    shared by the tuples of one seed call)."""
    key = ("megatron", id(tup.key_list), tup.knobs.micro_batch_size, tup.knobs.num_stages, t, tuple(cs))
    hit = tup.shared.get(key)
    if hit is None:
        classes = tup.pricer.classes
        have = [tup.replicas_of(c, t) for c in cs]
        hit = tup.shared[key] = []
        for d in tup.replicas:
            if all(d in h for h in have):
                counts = _spread(tuple(classes[c].capacity_units // classes[c].units(t, d) for c in cs),
                                 tup.knobs.num_stages)
                if counts is not None:
                    hit.append((d, counts))
    return hit


def slopes_of(tup: _Tuple, cls: int, t: int) -> dict[int, float]:
    """Replicas d -> forward + backward slope of class ``cls`` at TP ``t`` on the share of B
    over d, for the tuple's replica counts with equal shares that the class has options for
    (shared by the tuples with the same options and what Pricer.kind_lines reads)."""
    ctx = tup.ctx
    key = ("slopes", id(tup.key_list), tup.knobs.micro_batch_size, tup.unit, ctx.recompute, ctx.context_parallel,
           ctx.expert_parallel, cls, t)
    hit = tup.shared.get(key)
    if hit is None:
        have = tup.replicas_of(cls, t)
        hit = tup.shared[key] = {d: stage_work_s(tup.pricer, tup, cls, t, d) for d in tup.replicas if d in have}
        tup.shared[("least",) + key] = min(hit.values(), default=math.inf)
    return hit


def least_slope(tup: _Tuple, cls: int, t: int) -> float:
    """The least of ``slopes_of`` (inf: none)."""
    ctx = tup.ctx
    key = ("least", "slopes", id(tup.key_list), tup.knobs.micro_batch_size, tup.unit, ctx.recompute,
           ctx.context_parallel, ctx.expert_parallel, cls, t)
    hit = tup.shared.get(key)
    if hit is None:
        slopes_of(tup, cls, t)
        hit = tup.shared[key]
    return hit


def floors_key(tup: _Tuple) -> tuple:
    """What a rule's floors read of the tuple: its options, B, p, and what the slopes read."""
    ctx = tup.ctx
    return (id(tup.key_list), tup.knobs.micro_batch_size, tup.knobs.num_stages, tup.unit, ctx.recompute,
            ctx.context_parallel, ctx.expert_parallel)


def megatron_floors(tup: _Tuple, cs: list[int], t: int, cands) -> Floors:
    key = ("megatron floors", t, tuple(cs)) + floors_key(tup)
    hit = tup.shared.get(key)
    if hit is None:
        slopes = [slopes_of(tup, c, t) for c in cs]
        hit = tup.shared[key] = Floors(tup, [[(k, w[d]) for k, w in zip(counts, slopes)] for d, counts in cands],
                                       exact=True)
    return hit


def sailor_candidates(tup: _Tuple) -> list[tuple[int, list[int], tuple[int, ...]]]:
    """(replicas d, classes used, their stages) for each d with equal shares: the classes'
    shares of the stages at their least TP degree (the most stages fit), largest d first
    (shared as ``megatron_candidates``)."""
    key = ("sailor", id(tup.key_list), tup.knobs.micro_batch_size, tup.knobs.num_stages)
    hit = tup.shared.get(key)
    if hit is None:
        classes, tps = tup.pricer.classes, tup.tps
        hit = tup.shared[key] = []
        for d in tup.replicas:
            least = {c: next((t for t in tps if OptionKey(c, t, d, tup.cp) in tup.keys), None)
                     for c in range(len(classes))}
            use = [c for c, t in least.items() if t is not None]
            if not use:
                continue
            slots = [classes[c].capacity_units // OptionKey(c, least[c], d, tup.cp).units_in(classes) for c in use]
            counts = _spread(tuple(slots), tup.knobs.num_stages)
            if counts is not None:
                hit.append((d, use, counts))
    return hit


def sailor_floors(tup: _Tuple, cands) -> Floors:
    """Each stage's slope bounded by its class's least over the TP degrees it has options
    for (the stage's own TP is chosen by memory)."""
    key = ("sailor floors",) + floors_key(tup)
    hit = tup.shared.get(key)
    if hit is None:
        slopes = [[slopes_of(tup, c, t) for t in tup.tps] for c in range(len(tup.pricer.classes))]
        hit = tup.shared[key] = Floors(tup, [[(k, min(w[d] for w in slopes[c] if d in w)) for c, k in zip(use, counts)]
                                             for d, use, counts in cands], exact=False)
    return hit
