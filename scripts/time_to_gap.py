"""Time to gap of one search (docs/search-space.md, "Default space"): a bench scenario
(planner/bench_scenarios.py), optionally with more schedules listed, solved as
``python -m planner.bench`` solves it (time limit = the scenario's target unless given, stop
at half its gap target), the proved gap read every 0.25 s through ``planner.search.watch``.
Prints one JSON line: wall, final gap, the plan, and the first time the gap was at most each
of 50% ... 5% (null: never).  Run from the repository root:
``python scripts/time_to_gap.py c [--limit 30] [--schedules zb-h1]``."""

from __future__ import annotations

import argparse
import json
import threading
import time

from planner.bench_scenarios import by_key, full_scenarios
from planner.bench_schedules import with_schedule
from planner.search import solve
from planner.search.watch import SearchWatch
from planner.spec import Training, cluster_from_dict, load_model

LEVELS = (0.5, 0.4, 0.3, 0.2, 0.15, 0.1, 0.08, 0.05)
POLL_S = 0.25


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", help="a bench scenario key: a, b, c, d, e")
    ap.add_argument("--limit", type=float, default=None, help="time limit in s (default: the scenario's target)")
    ap.add_argument("--schedules", nargs="*", default=[], help="schedules added to the scenario's list")
    args = ap.parse_args()
    sc = by_key(full_scenarios(), args.scenario)
    for name in args.schedules:
        sc = with_schedule(sc, name)
    extra = {"schedules": sc.schedules} if sc.schedules else {}
    training = Training(global_batch_size=sc.global_batch_size, seq_len=sc.seq_len, precision=sc.precision, **extra)
    watch, samples, done = SearchWatch(), [], threading.Event()

    def poll() -> None:
        while not done.is_set():
            snap = watch.snapshot()
            if snap is not None and snap.gap is not None:
                samples.append((snap.elapsed_s, snap.gap))
            time.sleep(POLL_S)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    t0 = time.perf_counter()
    res = solve(cluster_from_dict(sc.cluster), load_model(sc.model), training,
                time_limit_s=args.limit or sc.target_s, gap_rel=sc.gap_target / 2, watch=watch)
    wall = time.perf_counter() - t0
    done.set()
    thread.join()
    first = {g: next((round(t, 1) for t, gap in samples if gap <= g), None) for g in LEVELS}
    print(json.dumps({"scenario": sc.name, "wall_s": round(wall, 2), "gap": res.report.gap,
                      "iteration_time_s": res.evaluation.iteration_time_s, "schedule": res.plan.schedule,
                      "stages": res.plan.num_stages, "micro_batch_size": res.plan.micro_batch_size,
                      "time_to_gap_s": first}))


if __name__ == "__main__":
    main()
