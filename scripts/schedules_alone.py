"""A bench scenario searched with the schedules listed *instead of* the default ones, under a
work budget, so that two trees (or two runs on a loaded machine) compare answer for answer
(docs/search-space.md, "The warm start's firsts reach a steady state").  Prints one line: the
answer's iteration time, the proved gap, when the answer was found, the wall time and whether
the wall clock (not the budget) stopped it.  Run from the repository root:
``python scripts/schedules_alone.py c zb-h1 [--budget-s 30] [--limit 150]``; the limit is only the
wall-clock guard, the budget (default: the work of 30 s) is what stops the search."""

from __future__ import annotations

import argparse
import time

from planner.bench_scenarios import by_key, full_scenarios
from planner.search import clock, solve
from planner.spec import Training, cluster_from_dict, load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", help="bench scenario key (a-e)")
    ap.add_argument("schedules", help="comma-separated schedules, e.g. zb-h1 or 1f1b,interleaved-1f1b")
    ap.add_argument("--budget-s", type=float, default=30.0, help="work budget, in seconds of default work")
    ap.add_argument("--limit", type=float, default=150.0, help="wall-clock guard, seconds")
    args = ap.parse_args()
    sc = by_key(full_scenarios(), args.scenario)
    training = Training(global_batch_size=sc.global_batch_size, seq_len=sc.seq_len, precision=sc.precision,
                        schedules=tuple(args.schedules.split(",")))
    t0 = time.perf_counter()
    res = solve(cluster_from_dict(sc.cluster), load_model(sc.model), training, time_limit_s=args.limit,
                gap_rel=sc.gap_target / 2, work_budget=clock.default_budget(args.budget_s))
    rep = res.report
    print(f"{args.scenario} {args.schedules}: {rep.objective:.4f} s, gap {100 * rep.gap:.2f}%, found at "
          f"{rep.answer_found_s:.1f} s, wall {time.perf_counter() - t0:.1f} s, wall clock bound: "
          f"{rep.wall_clock_bound}")


if __name__ == "__main__":
    main()
