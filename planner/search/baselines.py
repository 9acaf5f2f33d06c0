"""Baselines: the layouts a person, or a heterogeneity-unaware planner, would write, priced
with the search's own cost model and handed to the search as its first incumbents (issue 18).

Per knob tuple (micro-batch size B, schedule, recompute, ZeRO, stages p) whose block count
splits evenly over p, the rules of ``RULES`` each propose stage layouts:

- ``megatron``: the uniform Megatron-LM layout (Narayanan et al., SC'21): the same TP degree t
  and data-parallel degree d on every stage, an even block split, equal shares (d divides B),
  on each node class alone and on all classes together (stages handed to the classes in
  proportion to how many such stages each holds), d as large as the GPUs allow.
- ``sailor``: Sailor's greedy rule (Strati et al., SOSP'25): an even split, the same d on every
  stage, on each stage the smallest TP degree whose memory fits there.
- ``metis``: the Metis / FlashFlex rule (Um et al., ATC'24; Yan et al., 2024): the stages of the
  layouts above, blocks in proportion to each stage's speed (the inverse of its forward plus
  backward time per block).

Each layout is priced as a CoreProblem on just the options it uses (the tuple's options are
priced again, and the same way, by the search: the lines are cached in the Pricer), so its
time is the cost model's.  Under the time objectives a layout whose compute floor (its
stages' forward + backward slopes under the schedule's closed form, baseline_floor.py) cannot
beat its rule's best is not priced, and a rule stops trying candidates (before their memory
checks) once none left, nor its Metis re-split, could be (baseline_candidates.py).  ``seed`` adds every feasible one to the search's ``Best`` and
returns the best of them, which the plan's solver report names with the answer's ratio to it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from planner.search import clock
from planner.search.baseline_candidates import (  # _spread: the tests read the rules' split here
    _spread,  # noqa: F401
    least_slope,
    megatron_candidates,
    megatron_floors,
    sailor_candidates,
    sailor_floors,
)
from planner.search.baseline_floor import Unpriced, compute_floor_s, kept
from planner.search.baseline_tuple import _Tuple
from planner.search.incumbent import Candidate, prepare
from planner.search.knobs import OptionKey

# Of the time limit, at most, for pricing the baselines once one is found: bench a took 8 ms,
# b 0.11 s, c 0.46 s, d 0.32 s and e 0.68 s uncapped (median of 3, scripts/time_baselines.py;
# b 0.26 s, c 1.74 s, d 0.79 s, e 2.24 s before the rules stopped at candidates that could not
# be priced, baseline_floor.py), and the search needs that time more (b's 5-s limit); the
# report says when the cap cut them short.
BASELINE_SHARE = 0.1


@dataclass
class Layout:
    rule: str
    where: str                  # the classes it runs on, for the report
    keys: list[OptionKey]       # per stage
    units: list[int] | None     # core units per stage; None: an even split


@dataclass
class BaselineResult:
    """The best baseline under the objective, and how many layouts were priced."""
    best: Candidate | None
    name: str | None
    priced: int
    wall_s: float
    complete: bool              # every ranked tuple's layouts priced (not stopped by the time share)
    by_rule: dict               # rule -> its best candidate among the tuples priced
    # the time from which the tuples were skipped (inf: none): each rule's best layout is at
    # least min(its best priced, this) (``rule_floor_s``)
    skipped_from_s: float = math.inf

    def rule_floor_s(self, rule: str) -> float:
        """A lower bound on the time of ``rule`` 's best layout (exact when nothing was
        skipped, or when the best priced is under the skip bound)."""
        found = self.by_rule.get(rule)
        return min(found.time_s if found else math.inf, self.skipped_from_s)


def _stage_classes(counts: list[int], classes: list[int]) -> list[int]:
    return [c for c, k in zip(classes, counts) for _ in range(k)]


def megatron(tup: _Tuple, unpriced: Unpriced | None = None) -> list[Layout]:
    """``unpriced``: candidates are not checked against memory once seed would price none of
    those left (the first replica count that fits is taken)."""
    pricer, p = tup.pricer, tup.knobs.num_stages
    even = tup.L_units // p
    n_cls = len(pricer.classes)
    sets = [[c] for c in range(n_cls)] + ([list(range(n_cls))] if n_cls > 1 else [])
    out = []
    for t in tup.tps:
        for cs in sets:
            if unpriced is not None and len(cs) == 1 and unpriced.one_class_dropped(
                    "megatron", least_slope(tup, cs[0], t)):
                continue        # every replica count's layout is left unpriced
            cands = megatron_candidates(tup, cs, t)
            floors = megatron_floors(tup, cs, t, cands) if unpriced is not None and cands else None
            if floors is not None and unpriced.rest_dropped("megatron", floors, 0):
                continue        # whichever replica count fits, seed would not price it
            if len(cs) == 1 and tup.state_over(cs[0], t, 0, p, even):
                continue        # no replica count holds the stages: none is tried
            for i, (d, counts) in enumerate(cands):
                if i and floors is not None and unpriced.rest_dropped("megatron", floors, i):
                    break
                # each class's stages are one run: its memory limits checked run by run
                first, fits = 0, True
                for c, k in zip(cs, counts):
                    if k and not tup.fits_range(OptionKey(c, t, d, tup.cp), first, first + k, even):
                        fits = False
                        break
                    first += k
                if fits:
                    stage_cls = _stage_classes(counts, cs)
                    out.append(Layout("megatron", _where(pricer, stage_cls), [OptionKey(c, t, d, tup.cp) for c in stage_cls], None))
                    break       # the most replicas that fit
    return out


def sailor(tup: _Tuple, unpriced: Unpriced | None = None) -> list[Layout]:
    """``unpriced`` as for ``megatron``."""
    pricer, p = tup.pricer, tup.knobs.num_stages
    even = tup.L_units // p
    tps = tup.tps
    cands = sailor_candidates(tup)
    floors = sailor_floors(tup, cands) if unpriced is not None and cands else None
    for i, (d, use, counts) in enumerate(cands):
        if floors is not None and unpriced.rest_dropped("sailor", floors, i):
            return []           # whichever fits, seed would not price it
        # each stage at the least TP that fits its memory where it sits
        stage_cls = _stage_classes(counts, use)
        keys = []
        for s, c in enumerate(stage_cls):
            t = next((t for t in tps if tup.fits(OptionKey(c, t, d, tup.cp), s, even)), None)
            if t is None:
                break
            keys.append(OptionKey(c, t, d, tup.cp))
        if len(keys) < p:
            continue
        used: dict[int, int] = {}
        for k in keys:
            used[k.cls] = used.get(k.cls, 0) + k.units_in(pricer.classes)
        if all(u <= pricer.classes[c].capacity_units for c, u in used.items()):
            return [Layout("sailor", _where(pricer, stage_cls), keys, None)]
    return []


def metis(tup: _Tuple, layouts: list[Layout]) -> list[Layout]:
    """The stages of ``layouts`` that span more than one class, blocks by stage speed."""
    out = []
    for lay in layouts:
        if len({k.cls for k in lay.keys}) < 2:
            continue
        B = tup.knobs.micro_batch_size
        lines = [tup.pricer.kind_lines(tup.ctx, k.cls, k.tp, -(-B // k.replicas), tup.unit) for k in lay.keys]
        speed = [1.0 / max(1e-30, f[0] + f[1]) for f in lines]
        units = _proportional(speed, tup.L_units)
        if units is not None and all(tup.fits(k, s, u) for s, (k, u) in enumerate(zip(lay.keys, units))):
            out.append(Layout("metis", lay.where, lay.keys, units))
    return out


def _proportional(weights: list[float], total: int) -> list[int] | None:
    """``total`` split in proportion to ``weights``, each at least 1 (largest remainder)."""
    if total < len(weights):
        return None
    raw = [total * w / sum(weights) for w in weights]
    out = [max(1, math.floor(r)) for r in raw]
    while sum(out) > total:
        i = max(range(len(out)), key=lambda i: (out[i] - raw[i], -i))
        if out[i] <= 1:
            return None
        out[i] -= 1
    order = sorted(range(len(out)), key=lambda i: (out[i] - raw[i], i))
    i = 0
    while sum(out) < total:
        out[order[i % len(order)]] += 1
        i += 1
    return out


def _where(pricer, stage_cls: list[int]) -> str:
    return "+".join(pricer.classes[c].name for c in dict.fromkeys(stage_cls))


# The rules that propose layouts from a tuple's options (a registry: one entry per published
# planner's rule); metis re-splits the layouts the others propose.
RULES: dict[str, Callable[[_Tuple, Unpriced | None], list[Layout]]] = {"megatron": megatron, "sailor": sailor}


def layouts_of(tup: _Tuple, unpriced: Unpriced | None = None) -> list[Layout]:
    """The rules' layouts; with ``unpriced``, less some that seed would not price (those
    whose candidates it rules out before their memory checks)."""
    if tup.L_units % tup.knobs.num_stages:
        return []           # no even split
    out = [lay for rule in RULES.values() for lay in rule(tup, unpriced)]
    return out + metis(tup, out)


def priced_layouts(pricer, tup: _Tuple, spec, launcher, floor_of=None) -> list[tuple[Layout, Candidate | None]]:
    """The tuple's layouts, each with its candidate under the objective ``spec`` (None:
    infeasible, over the budget, or under the tokens/s floor).  One CoreProblem on all the
    options they use prices them all: an option's lines and memory limits, and the send
    between two options, do not depend on the other options of the problem.  ``floor_of``
    (time objectives): rule -> the time a layout of that rule must be under to change
    anything (its rule's best, the incumbents'); a layout whose ``compute_floor_s`` is not
    under it is left out unpriced."""
    if floor_of is None:
        layouts = layouts_of(tup)
    else:
        unpriced = Unpriced(tup, floor_of)
        layouts = [lay for lay in layouts_of(tup, unpriced)
                   if kept(compute_floor_s(pricer, tup, lay), unpriced.threshold[lay.rule])]
    if not layouts:
        return []
    prob = pricer.price(tup.knobs, tup.ctx, list(dict.fromkeys(k for lay in layouts for k in lay.keys)))
    prepare(prob, spec, launcher)
    index = {o.label: i for i, o in enumerate(prob.options)}
    even = [tup.L_units // tup.knobs.num_stages] * tup.knobs.num_stages
    out = []
    for lay in layouts:
        if any(k not in index for k in lay.keys):
            out.append((lay, None))
            continue
        assign = [(index[k], u) for k, u in zip(lay.keys, lay.units or even)]
        if not prob.feasible(assign):
            out.append((lay, None))
            continue
        cand = Candidate.of(prob, assign, prob.objective(assign), tup.knobs, spec)
        out.append((lay, cand if admits(spec, cand, pricer.training) else None))
    return out


def admits(spec, cand: Candidate, training) -> bool:
    """Whether a priced plan meets the objective's constraints (the budget is checked by the
    CoreProblem; the tokens/s floor on the exact time)."""
    if spec.kind == "cost-above-floor":
        cap = training.global_batch_size * training.seq_len / spec.min_tokens_per_s
        return cand.time_s <= cap * (1 + 1e-12)
    if spec.kind == "throughput-under-budget":
        return cand.price_usd_per_hour <= spec.budget_usd_per_hour * (1 + 1e-12)
    return True


def seed(pricer, ranked, spec, launcher, best, stop_at: float, deadline: float = math.inf,
         skip: bool = True) -> BaselineResult:
    """Price every baseline layout of the ranked knob tuples (until ``stop_at``, once one is
    found; until the search's ``deadline`` while none is) and add each to ``best``; the best of them under ``spec``, and each rule's best
    priced.  Under the time objectives the tuples come in the order of their memory-free time
    bound, so the ones from the best baseline's time on are skipped: none of their layouts
    beats it (each rule's best is then only bounded from below: ``rule_floor_s``).  There too
    (``skip``), a layout whose compute alone (``compute_floor_s``) reaches its rule's best and
    the incumbents' threshold is not priced: it would change neither; the rules stop trying
    candidates once none left could be priced (``Unpriced``: c prices 70 layouts, 636 before)."""
    started = time.monotonic()
    by_rule: dict[str, Candidate] = {}
    names: dict[str, str] = {}
    priced = 0
    complete = True
    limits: dict = {}       # memory limits shared by the tuples (_Tuple)
    time_like = spec.kind in ("throughput", "throughput-under-budget")
    floor_s = math.inf

    def floor_of(rule: str) -> float:
        """Under the time objectives a layout at least its rule's best and the incumbents'
        threshold changes neither (``skip``: such layouts are not priced, ``compute_floor_s``)."""
        found = by_rule.get(rule)
        return max(found.time_s if found else math.inf, best.threshold())

    for bound_s, _, knobs, ctx, keys in ranked:
        if time_like and by_rule and bound_s >= min(c.time_s for c in by_rule.values()):
            floor_s = bound_s   # ranked by a lower bound on their time: no later layout is faster
            break
        if clock.now() > (stop_at if by_rule else deadline):
            # the share only once one baseline is found: a tuple's layouts take milliseconds, and
            # a limit spent on ranking (a loaded machine: bench a) must still be measured against
            # one; where none fits yet (a large model) twice that share stops it, so the search
            # keeps most of its limit
            complete = False
            break
        if pricer.model.num_layers // knobs.block_unit % knobs.num_stages:
            continue        # no even split: no baseline (layouts_of)
        for lay, cand in priced_layouts(pricer, _Tuple(pricer, knobs, ctx, keys, limits), spec, launcher,
                                        floor_of if time_like and skip else None):
            priced += 1
            if cand is None:
                continue
            best.add(cand)
            if lay.rule not in by_rule or cand.key < by_rule[lay.rule].key:
                by_rule[lay.rule], names[lay.rule] = cand, describe(lay, cand)
    top = min(by_rule, key=lambda r: by_rule[r].key, default=None)
    return BaselineResult(by_rule.get(top), names.get(top), priced, time.monotonic() - started, complete,
                          by_rule, floor_s)


def describe(lay: Layout, cand: Candidate) -> str:
    k = cand.knobs
    tps = sorted({key.tp for key in lay.keys})
    split = "even split" if lay.units is None else "blocks by stage speed"
    return (f"{lay.rule}: {lay.where}, p={k.num_stages} t={'/'.join(map(str, tps))} d={lay.keys[0].replicas} "
            f"B={k.micro_batch_size} {k.schedule} rc={k.recompute} zero={k.zero_stage}, {split}")
