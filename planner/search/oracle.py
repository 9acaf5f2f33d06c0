"""Brute-force oracle: every plan of the declared space, each priced by ``planner.cost.evaluate``.

For small cases only (tests).  It shares with the solver the *definition* of the space
(knob tuples, TP degrees, replica counts, mixed stages' kinds and shares, the unit rules of
node classes, device naming) but
none of its pricing or optimisation: every layout is built as a Plan and evaluated whole.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from planner.cost import evaluate, topology_for
from planner.search.classes import class_infos, per_node_view
from planner.search.knobs import OptionKey, enumerate_knobs, tp_degrees
from planner.search.mixed import mixed_keys
from planner.search.naming import build_plan
from planner.search.objectives import ObjectiveSpec, parse_objective
from planner.search.space import replica_counts


@dataclass
class OracleResult:
    value: float | None          # best objective (iteration time, or the cost key's first element)
    plan: object | None
    evaluation: object | None
    plans_evaluated: int
    plans_unfit: int = 0          # evaluated plans that do not fit in memory


def _stage_keys(model, training, classes, B, cp: int = 1, ep: int = 1, shard: int | None = None):
    keys = []
    for info in classes:
        for t in tp_degrees(model, info, training.max_tp):
            w = t * cp      # a replica's GPUs: tp x cp inside one node
            if w > info.gpus_per_node:
                continue
            for n in replica_counts(B):
                if n <= info.max_replicas(w) and info.units(w, n) <= info.capacity_units and n % ep == 0 \
                        and (shard is None or n % shard == 0):
                    if training.micro_batch_sizes and -(-B // n) not in training.micro_batch_sizes:
                        continue
                    keys.append(OptionKey(info.index, t, n, cp))
    return keys


def _compositions(total: int, parts: int, step: int):
    """Block counts per stage, each a positive multiple of ``step``, summing to ``total``."""
    units = total // step
    for cuts in itertools.combinations(range(1, units), parts - 1):
        b = (0, *cuts, units)
        yield [(b[i + 1] - b[i]) * step for i in range(parts)]


def oracle(cluster, model, training, objective: str | ObjectiveSpec = "throughput",
           launcher: str | None = None, max_plans: int = 2_000_000) -> OracleResult:
    spec = parse_objective(objective) if isinstance(objective, str) else objective
    classes = class_infos(topology_for(cluster), training.precision)
    views = [classes]
    if per_node_view(classes, training):
        # the search's second view (solve._per_node_too): every node its own class
        views.append(class_infos(topology_for(cluster), training.precision, per_node=True))
    best_key, best = None, (None, None)
    count = unfit = 0
    for classes, knobs in ((cs, k) for cs in views for k in enumerate_knobs(model, training, cs, launcher)):
        keys = _stage_keys(model, training, classes, knobs.micro_batch_size, knobs.context_parallel,
                           knobs.expert_parallel, knobs.zero_shard_degree)
        if launcher:
            keys = [k for k in keys if knobs.micro_batch_size % k.replicas == 0]
        elif (training.mixed_stages and knobs.context_parallel == 1 and knobs.expert_parallel == 1
              and knobs.zero_shard_degree is None):
            keys += mixed_keys(model, training, classes, knobs.micro_batch_size, tp_degrees)
        p = knobs.num_stages
        for combo in itertools.product(keys, repeat=p):
            if launcher and len({(k.tp, k.replicas) for k in combo}) > 1:
                continue
            used = [0] * len(classes)
            for k in combo:
                for c, u in k.uses(classes):
                    used[c] += u
            if any(u > c.capacity_units for u, c in zip(used, classes)):
                continue
            for blocks in _compositions(model.num_layers, p, knobs.block_unit):
                count += 1
                if count > max_plans:
                    raise RuntimeError("oracle: space too large for brute force")
                plan = build_plan(cluster, model, training, classes, knobs, list(zip(combo, blocks)),
                                  spec.to_plan_objective())
                ev = evaluate(cluster, plan, model=model, check=False)
                if not ev.fits:
                    unfit += 1
                    continue
                price = ev.nodes_usd_per_hour
                if spec.kind == "throughput-under-budget" and price > spec.budget_usd_per_hour * (1 + 1e-12):
                    continue
                if spec.kind == "cost-above-floor" and ev.tokens_per_s < spec.min_tokens_per_s * (1 - 1e-12):
                    continue
                key = spec.key(price or 0.0, ev.iteration_time_s)
                if best_key is None or key < best_key:
                    best_key, best = key, (plan, ev)
    value = None if best_key is None else (best[1].iteration_time_s if spec.kind in (
        "throughput", "throughput-under-budget") else best_key[0])
    return OracleResult(value, best[0], best[1], count, unfit)
