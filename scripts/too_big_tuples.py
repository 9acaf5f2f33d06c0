"""Which knob tuples of a bench scenario end in ``incumbent.relaxed`` (too big for the exact
MILP), and what each MILP-based bound gives them (docs/search-space.md, "Bounds for the
tuples too big for the exact MILP").

    python scripts/too_big_tuples.py e 240 2.1

runs the scenario's search with a limit of 240 s, records every tuple handed to ``relaxed``
(its knob bound, the threshold then, the bound ``relaxed`` left), then prices each again with
its sends and bounds it three ways, each MILP capped at 2.1 s (the 30-s search's cap): the
send-keeping aggregate (core/aggregate.py, default groups), the exact MILP with sends, and
the send-free MILP ``relaxed`` solves.  Only a measurement: it changes nothing.
"""

from __future__ import annotations

import importlib
import sys
import time

from planner.bench_scenarios import full_scenarios
from planner.cost import topology_for
from planner.search.classes import class_infos
from planner.search.core.aggregate import aggregate
from planner.search.core.milp import MilpSettings
from planner.search.incumbent import exact_solver, prepare
from planner.search.knobs import make_context
from planner.search.objectives import ObjectiveSpec
from planner.search.space import Pricer
from planner.spec import Training, cluster_from_dict, load_model


def record(solve_module, sc, limit_s: float) -> tuple[list[dict], float]:
    """The tuples the search hands to ``relaxed`` (wrapped, not changed) and its answer's time."""
    log = []
    too_big = importlib.import_module("planner.search.support_plans")     # where the search calls it
    original = too_big.relaxed

    def wrapped(pricer, knobs, ctx, keys, lb, spec, launcher, best, bounds, *rest):
        n, threshold = len(bounds), best.threshold()
        original(pricer, knobs, ctx, keys, lb, spec, launcher, best, bounds, *rest)
        log.append({"knobs": knobs, "keys": list(keys), "lb": lb, "threshold": threshold,
                    "left": bounds[-1] if len(bounds) > n else None})

    too_big.relaxed = wrapped
    try:
        cluster, model, training = _inputs(sc)
        res = solve_module.solve(cluster, model, training, time_limit_s=limit_s, gap_rel=sc.gap_target / 2)
    finally:
        too_big.relaxed = original
    return log, res.evaluation.iteration_time_s


def _inputs(sc):
    training = Training(global_batch_size=sc.global_batch_size, seq_len=sc.seq_len, precision=sc.precision,
                        **({"schedules": sc.schedules} if sc.schedules else {}))
    return cluster_from_dict(sc.cluster), load_model(sc.model), training


def _capped(prob, cap_s: float) -> float | None:
    sol = exact_solver(prob).solve(MilpSettings(time_limit_s=cap_s), deadline=time.monotonic() + cap_s)
    return sol.bound


def main(key: str, limit_s: float, cap_s: float) -> None:
    sc = next(s for s in full_scenarios() if s.key == key)
    log, answer_s = record(importlib.import_module("planner.search.solve"), sc, limit_s)
    print(f"{sc.name}: answer {answer_s:.4f} s, {len(log)} tuples too big for the exact MILP")
    cluster, model, training = _inputs(sc)
    topo = topology_for(cluster)
    pricer = Pricer(model, training, class_infos(topo, training.precision), topo)
    print("tuple | keys | options | groups | knob bound | left by relaxed | aggregate | exact | send-free")
    for rec in log:
        knobs = rec["knobs"]
        ctx = make_context(model, training, knobs)
        full = pricer.price(knobs, ctx, rec["keys"])
        free = pricer.price(knobs, ctx, rec["keys"], sends=False)
        for prob in (full, free):
            prepare(prob, ObjectiveSpec(), None)
        agg, groups = aggregate(full)
        got = [_capped(prob, cap_s) for prob in (agg, full, free)]
        print(f"{knobs.label()} | {len(rec['keys'])} | {len(full.options)} | {len(groups)} | {rec['lb']:.4f} | "
              f"{rec['left']:.4f} | " + " | ".join("-" if g is None else f"{g:.4f}" for g in got), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))
