"""Search benchmarks: ``python -m planner.bench`` (``make bench``), ``--smoke`` for a quick run.

Each scenario is solved in a fresh process (so its peak memory is its own: ``ru_maxrss``),
three times; the table shows the median wall time.  ``--only d,e`` runs some of them.
Targets (DESIGN / brief, issue 18; scenarios in bench_scenarios.py): a, 1,024 homogeneous
A100 < 1 s; b, 2,048 mixed GPUs in three zones < 5 s; c, 16,384 GPUs of three types in three
zones with GPT-3 175B < 30 s (e the same with L40S for V100, in bf16); each with a proved gap
< 1% and peak memory < 2 GB; d, 1,200 A100 + V100 in three zones with OPT-350M, gap < 2% in 15 s.
The search stops at half the scenario's gap target.
The ``x`` columns (issue 18) are the answer's speed over the best baseline layout's and over
each rule's best (planner/search/baselines.py: uniform Megatron, Sailor-like, Metis-like),
medians of the runs; ``-`` where a rule had no layout priced, ``*`` where the baselines' time
share (baselines.BASELINE_SHARE) ran out before all were priced: then a ratio is over the
layouts priced only and may overstate the answer's lead.
Anchors: Sailor's planner 0.6 s for 1,024 A100s and 101 s for 1,200 A100+V100 in three zones;
Metis 26-265 s at 64 GPUs.  The time limit of each run is its target, so a missed target shows
as a run stopped at its limit with the gap it had proved by then.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import sys
import time

# the scenarios live in bench_scenarios.py; Scenario and scenarios are used from here too
from planner.bench_scenarios import Scenario, by_key, scenarios, select

PEAK_TARGET_MB = 2048


def _solve(sc: Scenario, limit_factor: float = 1.0, profiler=None):
    """(search result, cluster, wall seconds of the search alone); ``profiler`` (a
    cProfile.Profile) runs around the search alone, not the imports and input loading."""
    from planner.search import solve
    from planner.spec import Training, cluster_from_dict, load_model
    cluster = cluster_from_dict(sc.cluster)
    model = load_model(sc.model)
    extra = {"schedules": sc.schedules} if sc.schedules else {}
    training = Training(global_batch_size=sc.global_batch_size, seq_len=sc.seq_len, precision=sc.precision, **extra)
    if profiler:
        profiler.enable()
    t0 = time.perf_counter()
    res = solve(cluster, model, training, time_limit_s=sc.target_s * limit_factor, gap_rel=sc.gap_target / 2)
    wall = time.perf_counter() - t0
    if profiler:
        profiler.disable()
    return res, cluster, wall


def _run(sc: Scenario, queue, limit_factor: float = 1.0) -> None:
    """One solve in a fresh process; reports wall time, peak RSS and the answer."""
    try:
        res, cluster, wall = _solve(sc, limit_factor)
        rep = res.report
        queue.put({"wall_s": wall, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   "tokens_per_s": res.evaluation.tokens_per_s, "gap": rep.gap, "status": rep.status,
                   "gpus": cluster.num_gpus, "classes": rep.node_classes,
                   "tuples": f"{rep.knob_tuples_solved}/{rep.knob_tuples}", "schedule": res.plan.schedule,
                   "answer_found_s": (rep.model_extra or {}).get("answer_found_s"),
                   **baseline_columns(rep)})
    except Exception as exc:  # noqa: BLE001 - a bench row reports its failure instead of dying
        queue.put({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})


RULES = ("megatron", "sailor", "metis")     # planner.search.baselines.RULES and its Metis re-split


def baseline_columns(rep) -> dict:
    """The answer's ratio to the best baseline (solver report ``baseline_ratio``: the
    baseline's iteration time over the answer's, >= 1) and to each rule's best."""
    extra = rep.model_extra or {}
    by_rule = extra.get("baseline_ratio_by_rule") or {}
    return {"baseline": extra.get("baseline"), "vs_best_baseline": extra.get("baseline_ratio"),
            "baselines_wall_s": extra.get("baselines_wall_s"), "baselines_priced": extra.get("baselines_priced"),
            "baselines_complete": extra.get("baselines_complete"),
            **{f"vs_{r}": by_rule.get(r) for r in RULES}}


def _median_of(rows: list[dict], key: str):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def run_scenario(sc: Scenario, runs: int, limit_factor: float = 1.0) -> dict:
    ctx = mp.get_context("spawn")
    results = []
    for _ in range(runs):
        q = ctx.Queue()
        proc = ctx.Process(target=_run, args=(sc, q, limit_factor))
        proc.start()
        out = q.get()
        proc.join()
        results.append(out)
    ok = [r for r in results if "error" not in r]
    if not ok:
        return {"scenario": sc.name, "error": results[0]["error"], "target_s": sc.target_s,
                "gap_target": sc.gap_target}
    med = sorted(ok, key=lambda r: r["wall_s"])[len(ok) // 2]
    row = dict(med)
    row.update(scenario=sc.name, runs=len(ok), target_s=sc.target_s, gap_target=sc.gap_target,
               wall_median_s=statistics.median(r["wall_s"] for r in ok),
               peak_mb=max(r["peak_mb"] for r in ok),
               baselines_complete=all(r.get("baselines_complete") for r in ok),
               **{k: _median_of(ok, k) for k in ("vs_best_baseline", *(f"vs_{r}" for r in RULES))})
    gap = row["gap"]
    row["met"] = (row["wall_median_s"] < sc.target_s and gap is not None and gap < sc.gap_target
                  and row["peak_mb"] < PEAK_TARGET_MB)
    return row


def format_table(rows: list[dict]) -> str:
    head = ("scenario", "GPUs", "classes", "wall median s", "peak MB", "tokens/s", "gap", "status",
            "target s", "gap target", "met?", "x best baseline", *(f"x {r}" for r in RULES))
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        if "error" in r:
            lines.append(" | ".join([r["scenario"], "-", "-", "-", "-", "-", "-", f"error: {r['error']}",
                                     f"{r['target_s']:g}", _pct(r.get("gap_target")), "no",
                                     *("-" for _ in range(1 + len(RULES)))]))
            continue
        gap = "n/a" if r["gap"] is None else f"{100 * r['gap']:.3f}%"
        lines.append(" | ".join([r["scenario"], str(r["gpus"]), str(r["classes"]), f"{r['wall_median_s']:.2f}",
                                 f"{r['peak_mb']:.0f}", f"{r['tokens_per_s']:,.0f}", gap, r["status"],
                                 f"{r['target_s']:g}", _pct(r.get("gap_target")), "yes" if r["met"] else "no",
                                 *(_ratio(r.get(k), r.get("baselines_complete", True))
                                   for k in ("vs_best_baseline", *(f"vs_{x}" for x in RULES)))]))
    return "\n".join(lines)


def _pct(fraction) -> str:
    return "-" if fraction is None else f"{100 * fraction:g}%"


def _ratio(value, complete: bool) -> str:
    """planner / baseline: how many times faster the answer is (``-``: no such baseline; ``*``:
    the baselines' time share ran out, the ratio is over the layouts priced, not all)."""
    return "-" if value is None else f"{value:.3f}" + ("" if complete else "*")


def profile_scenario(sc: Scenario, limit_factor: float = 1.0, top: int = 25) -> str:
    """One more run of ``sc`` in this process under cProfile: the planner functions with the
    most cumulative time (where a missed target's time goes)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    _solve(sc, limit_factor, profiler=prof)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(r"planner[/\\]", top)
    return out.getvalue()


def _slowest(scs: list[Scenario], rows: list[dict]) -> Scenario:
    """A missed target first, then the largest share of its time limit used."""
    def key(pair):
        sc, row = pair
        return (not row.get("met", False), row.get("wall_median_s", sc.target_s) / sc.target_s)
    return max(zip(scs, rows), key=key)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="two tiny scenarios, one run each")
    ap.add_argument("--runs", type=int, default=None, help="runs per scenario (default 3, smoke 1)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--only", action="append", metavar="KEYS",
                    help="run only these scenarios: keys (a, b, c, d, e; smoke: the names) or full names, "
                         "comma-separated or repeated (default: all)")
    ap.add_argument("--limit-factor", type=float, default=1.0,
                    help="time limit = target x this (default 1: a run stops at its target)")
    ap.add_argument("--schedules", action="store_true",
                    help="the schedule benchmarks instead (bench_schedules.py): simulating a 1,024-GPU plan's "
                         "iteration per schedule, and the first and largest scenarios with and without "
                         "zb-h1 (the first also with zb-v, dualpipev)")
    ap.add_argument("--profile", action="store_true",
                    help="then profile one more run of the slowest scenario (a missed target first)")
    args = ap.parse_args(argv)
    runs = args.runs or (1 if args.smoke else 3)
    if args.schedules:
        if args.only:
            ap.error("--only selects search scenarios; --schedules runs its own fixed set")
        return _schedules_main(args, runs)
    try:
        scs = select(scenarios(args.smoke), args.only)
    except ValueError as exc:
        ap.error(str(exc))
    rows = []
    for sc in scs:
        print(f"running {sc.name} ({runs} run(s)) ...", file=sys.stderr, flush=True)
        rows.append(run_scenario(sc, runs, args.limit_factor))
    if args.json:
        print(json.dumps(rows, indent=2, sort_keys=True, default=str))
    else:
        print(format_table(rows))
    if args.profile:
        sc = _slowest(scs, rows)
        print(f"\nprofile of {sc.name} (one run in this process, planner functions by cumulative time):")
        print(profile_scenario(sc, args.limit_factor))
    return 0


def _schedules_main(args, runs: int) -> int:
    """The schedule tables: the simulation rows, then each of scenarios a and c (smoke: the
    first alone) with and without zb-h1 (a proves its optimum within its limit, so its ratio is
    the cost of the larger space; c runs to its limit either way, so its ratio is ~1 and the
    cost shows in its gap); a also with zb-v and with dualpipev."""
    from planner import bench_schedules as bs
    sim = bs.simulate_rows(runs)
    scs = scenarios(args.smoke)
    pairs = []

    def run(s):
        print(f"running {s.name} ({runs} run(s)) ...", file=sys.stderr, flush=True)
        return run_scenario(s, runs, args.limit_factor)

    for sc in ([scs[0]] if args.smoke else [by_key(scs, "a"), by_key(scs, "c")]):
        pairs.append([run(s) for s in (sc, bs.with_zb_h1(sc))])
    v_rows = [run(bs.with_schedule(scs[0], v)) for v in bs.V_CHOICE]     # scs[0]: a, or the first smoke one
    if args.json:
        print(json.dumps({"simulate": sim, "choice": pairs, "v_choice": v_rows}, indent=2, sort_keys=True,
                         default=str))
    else:
        print(bs.format_simulate(sim))
        print()
        print(format_table([r for pair in pairs for r in pair] + v_rows))
        for pair in pairs:
            print()
            print(bs.choice_summary(*pair))
    return 0


if __name__ == "__main__":
    sys.exit(main())
