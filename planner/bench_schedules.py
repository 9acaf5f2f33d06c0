"""Schedule benchmarks (issue 17), the second table of ``python -m planner.bench``.

- **Simulate**: one iteration of a 1,024-GPU plan (128 nodes of 8 A100, GPT-Neo-2.7B, 16
  stages x 16 replicas x TP 4 (its 20 heads rule out TP 8), 64 micro-batches) priced by ``planner.cost.evaluate`` and run as
  generated action lists (``planner.simulate.actions.generate``) through the executor
  (``execute``), per schedule; target under 1 s.
- **Schedule choice**: the 16,384-GPU search scenario (bench.py's c) with and without zb-h1 in
  ``training.schedules``; target: with it at most 20% slower (wall median), beside the knob
  tuples, the objective and the proved gap of each.  The 1,024-GPU scenario (a) also with
  zb-v and with dualpipev (``V_CHOICE``; their incumbents are priced by the executor).
"""

from __future__ import annotations

import statistics
import time

from planner.bench_scenarios import Scenario

SIM_TARGET_S = 1.0
CHOICE_RATIO_TARGET = 1.2
SIM_SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-h1")
V_CHOICE = ("zb-v", "dualpipev")     # searched on the first scenario only (each adds its own row)


def _plan_1024(schedule: str, num_stages: int = 16):
    """(cluster, model, plan): 128 x 8 A100, GPT-Neo-2.7B; ``num_stages`` stages of 16
    replicas at TP 4 (1,024 GPUs for 16 stages), 32 blocks split evenly, 64 micro-batches of 16."""
    from planner.cost import topology_for
    from planner.plan.model import Objective
    from planner.search.classes import class_infos
    from planner.search.knobs import Knobs, OptionKey
    from planner.search.naming import build_plan
    from planner.search.schedules import SCHEDULES
    from planner.spec import Training, cluster_from_dict, load_model
    cluster = cluster_from_dict({"name": "a100-1024", "nodes": [
        {"name": "a100", "count": 128, "gpu": "A100-SXM4-80GB", "gpus_per_node": 8}]})
    model = load_model("gpt-neo-2.7b")
    training = Training(global_batch_size=1024, seq_len=2048, schedules=(schedule,))
    classes = class_infos(topology_for(cluster), training.precision)
    v = SCHEDULES[schedule].virtual_stages
    knobs = Knobs(16, 64, schedule, v, "selective", 1, num_stages)
    per = model.num_layers // num_stages
    layout = [(OptionKey(0, 4, 16), per)] * num_stages
    return cluster, model, build_plan(cluster, model, training, classes, knobs, layout, Objective(kind="throughput"))


def simulate_once(cluster, model, plan) -> tuple[float, float, float, int]:
    """(wall s, simulated pipeline s, closed-form pipeline s, actions) of one iteration: evaluate, then
    the schedule's generated action lists through the executor (as ``planner simulate`` does)."""
    from planner.cost import evaluate
    from planner.simulate.actions import execute, generate, stage_times_from_ranks
    from planner.simulate.plan import zb_stage_times
    t0 = time.perf_counter()
    ev = evaluate(cluster, plan, model=model)
    sched = generate(plan.schedule, plan.num_stages, plan.num_micro_batches, plan.virtual_stages)
    times = (zb_stage_times(ev.stages) if plan.schedule == "zb-h1"
             else stage_times_from_ranks(ev.stages, plan.virtual_stages))
    run = execute(sched, times)
    return time.perf_counter() - t0, run.makespan_s, ev.pipeline_time_s, sum(len(r) for r in sched.ranks)


def simulate_rows(runs: int = 3) -> list[dict]:
    rows = []
    for schedule in SIM_SCHEDULES:
        cluster, model, plan = _plan_1024(schedule)
        simulate_once(cluster, model, plan)         # warm the imports, not the caches (fresh evaluate)
        results = [simulate_once(cluster, model, plan) for _ in range(runs)]
        wall = statistics.median(r[0] for r in results)
        rows.append({"schedule": schedule, "gpus": len(plan.devices()),
                     "stages": plan.num_stages, "micro_batches": plan.num_micro_batches, "actions": results[0][3],
                     "wall_median_s": wall, "simulated_s": results[0][1], "closed_form_s": results[0][2],
                     "met": wall < SIM_TARGET_S})
    return rows


def format_simulate(rows: list[dict]) -> str:
    head = ("schedule", "GPUs", "stages", "micro-batches", "actions", "wall median s", "simulated pipeline s",
            "closed form s", "target s", "met?")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        lines.append(" | ".join([r["schedule"], f"{r['gpus']:,}", str(r["stages"]), str(r["micro_batches"]),
                                 f"{r['actions']:,.0f}", f"{r['wall_median_s']:.3f}", f"{r['simulated_s']:.3f}",
                                 f"{r['closed_form_s']:.3f}", f"{SIM_TARGET_S:g}", "yes" if r["met"] else "no"]))
    return "\n".join(lines)


def with_schedule(sc: Scenario, schedule: str = "zb-h1") -> Scenario:
    """``sc`` with ``schedule`` added to the schedules the search may choose."""
    from dataclasses import replace

    from planner.spec import Training
    base = sc.schedules or Training.model_fields["schedules"].default
    return replace(sc, name=f"{sc.name} + {schedule}", schedules=(*base, schedule))


def with_zb_h1(sc: Scenario) -> Scenario:
    return with_schedule(sc, "zb-h1")


def choice_verdict(base: dict, with_zb: dict) -> tuple[bool, str]:
    """(met, how judged) of "choosing the schedule must not make the search slower by more than
    20%".  Where both runs stop at their time limit, their wall times are the limit and say
    nothing: the search was slower if it proved less in that time, so the proved gap is judged
    (at most 1.2x the gap without zb-h1, or within the scenario's gap target)."""
    limit = base["target_s"]
    ratio = with_zb["wall_median_s"] / base["wall_median_s"]
    if base["wall_median_s"] < 0.95 * limit or with_zb["wall_median_s"] < 0.95 * limit:
        return ratio <= CHOICE_RATIO_TARGET, f"wall ratio {ratio:.2f}"
    g0, g1 = base["gap"], with_zb["gap"]
    if g0 is None or g1 is None:
        return False, "both at the time limit, a gap unknown"
    ok = g1 <= max(CHOICE_RATIO_TARGET * g0, base["gap_target"])
    return ok, f"both at the time limit: proved gap {_pct(g0)} -> {_pct(g1)}"


def choice_summary(base: dict, with_zb: dict) -> str:
    """The two rows of the schedule-choice comparison and the verdict (``choice_verdict``)."""
    if "error" in base or "error" in with_zb:
        return f"schedule choice: error ({base.get('error') or with_zb.get('error')})"
    ratio = with_zb["wall_median_s"] / base["wall_median_s"]
    met, how = choice_verdict(base, with_zb)
    return (f"schedule choice on {base['scenario']}: wall median {base['wall_median_s']:.2f} s without zb-h1, "
            f"{with_zb['wall_median_s']:.2f} s with it (ratio {ratio:.2f}); target <= {CHOICE_RATIO_TARGET:g}x, "
            f"judged on {how}: {'met' if met else 'missed'}; knob tuples {base['tuples']} -> "
            f"{with_zb['tuples']}; tokens/s {base['tokens_per_s']:,.0f} -> {with_zb['tokens_per_s']:,.0f}; "
            f"gap {_pct(base['gap'])} -> {_pct(with_zb['gap'])}; answer found at {_secs(base)} -> "
            f"{_secs(with_zb)}; schedule {base.get('schedule')} -> {with_zb.get('schedule')}")


def _secs(row: dict) -> str:
    found = row.get("answer_found_s")
    return "n/a" if found is None else f"{found:.2f} s"


def _pct(gap) -> str:
    return "n/a" if gap is None else f"{100 * gap:.2f}%"
