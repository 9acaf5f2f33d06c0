"""Time the baselines step (planner.search.baselines.seed) of a bench scenario alone.

``python scripts/time_baselines.py c`` runs scenario c's search the way planner/bench.py does
(the same cluster, model, training and time limit), stops it right after the baselines, and
prints the seconds that step took, median of ``--runs`` fresh processes (each process builds
its own pricer, so no run reuses another's cached lines).  ``--profile`` prints cProfile's
top entries of that step alone; ``--answer`` prints what it found (to compare two versions).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import subprocess
import sys
import time


class _Stop(Exception):
    """Raised after the baselines: the rest of the search is not timed."""


def baselines_once(key: str, profile: bool = False, no_cap: bool = False) -> dict:
    import importlib

    from planner.bench_scenarios import by_key, full_scenarios, smoke_scenarios
    from planner.spec import Training, cluster_from_dict, load_model

    # planner.search.solve is also the function the package exports: the module by its path
    solve_mod = importlib.import_module("planner.search.solve")
    scs = full_scenarios() + smoke_scenarios()
    sc = by_key(scs, key)
    real_seed = solve_mod.seed
    out: dict = {}
    prof = cProfile.Profile() if profile else None

    def timed_seed(*args, **kwargs):
        if prof:
            prof.enable()
        t0, c0 = time.perf_counter(), time.process_time()
        res = real_seed(*args, **kwargs)
        out["wall_s"], out["cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
        if prof:
            prof.disable()
        best = res.best
        out.update(priced=res.priced, complete=res.complete, name=res.name,
                   best_time_s=None if best is None else best.time_s,
                   by_rule={r: (c.time_s, c.knobs.label(), [list(x) for x in c.layout])
                            for r, c in sorted(res.by_rule.items())},
                   skipped_from_s=res.skipped_from_s,
                   incumbents=[(c.time_s, c.knobs.label(), [list(x) for x in c.layout]) for c in args[4].items])
        raise _Stop

    solve_mod.seed = timed_seed
    if profile or no_cap:   # cProfile slows it ~3x: the time share must not cut the run short
        solve_mod.BASELINE_SHARE = 1.0
    cluster = cluster_from_dict(sc.cluster)
    model = load_model(sc.model)
    extra = {"schedules": sc.schedules} if sc.schedules else {}
    training = Training(global_batch_size=sc.global_batch_size, seq_len=sc.seq_len, precision=sc.precision, **extra)
    try:
        solve_mod.solve(cluster, model, training, time_limit_s=sc.target_s, gap_rel=sc.gap_target / 2)
    except _Stop:
        pass
    if prof:
        s = io.StringIO()
        for order in ("tottime", "cumulative"):
            pstats.Stats(prof, stream=s).sort_stats(order).print_stats(25)
        out["profile"] = s.getvalue()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("keys", nargs="+", help="scenario keys (a, b, c, d, e, or a smoke scenario's name)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--answer", action="store_true", help="print what the baselines found")
    ap.add_argument("--no-cap", action="store_true",
                    help="no time share (baselines.BASELINE_SHARE): every ranked tuple is priced, so that "
                         "the answers of two versions compare on a loaded machine")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(baselines_once(args.keys[0], args.profile, args.no_cap), default=str))
        return 0
    for key in args.keys:
        rows = []
        for _ in range(args.runs):
            cmd = ([sys.executable, __file__, key, "--child"] + (["--profile"] if args.profile else [])
                   + (["--no-cap"] if args.no_cap else []))
            rows.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
        times, cpu = [r["wall_s"] for r in rows], [r["cpu_s"] for r in rows]
        # CPU seconds beside the wall: on a shared machine the wall counts other processes' turns
        print(f"{key}: baselines {statistics.median(times):.3f} s wall, {statistics.median(cpu):.3f} s CPU, "
              f"median of {len(times)} (wall {', '.join(f'{t:.3f}' for t in times)}), "
              f"priced {rows[0]['priced']}, complete {rows[0]['complete']}")
        if args.answer:
            print(json.dumps({k: rows[0][k] for k in ("name", "best_time_s", "by_rule", "skipped_from_s", "incumbents")},
                             default=str))
        if args.profile:
            print(rows[0]["profile"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
