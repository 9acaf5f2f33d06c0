"""The Python API (DESIGN §7).  Everything the CLI does is reachable from here; the CLI is a
thin layer on these functions.

    from planner import api
    cluster = api.load_cluster("cluster_specs/lab-mixed.yaml")
    model = api.load_model("llama3-70b")
    training = api.Training(global_batch_size=1024, seq_len=4096, precision="bf16")
    result = api.plan(cluster, model, training, objective="throughput", time_limit_s=60)
    ev = api.evaluate(cluster, result.plan)
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import InfeasibleError, InputError, PlannerError
from planner.plan import Plan
from planner.spec import Cluster, ModelSpec, Training, load_cluster, load_model, load_training

if TYPE_CHECKING:  # pragma: no cover
    from planner.cost import Evaluation


# The rest of the API: names that live elsewhere, imported when first used so that
# ``import planner.api`` stays light (the search loads pulp, profiling loads torch).
# name -> (module, attribute; None for the module itself).  The CLI imports only from here.
_ELSEWHERE = {
    "PRECISIONS": ("planner.spec.training", "PRECISIONS"),
    "format_bandwidth": ("planner.spec.units", "format_bandwidth"),
    "format_bytes": ("planner.spec.units", "format_bytes"),
    "catalog": ("planner.catalog", None),
    "parse_price_source": ("planner.catalog.price_source", "parse_price_source"),
    "UNVERIFIED_PRICE_PREFIX": ("planner.catalog.price_source", "UNVERIFIED_PREFIX"),
    "total_params": ("planner.cost.flops", "total_params"),
    "trust_line": ("planner.cost.trust", "trust_line"),
    "check_plan": ("planner.plan.check", "check_plan"),
    "check_time_limit": ("planner.search", "check_time_limit"),
    "input_warnings": ("planner.search.answer", "input_warnings"),
    "parse_objective": ("planner.search", "parse_objective"),
    "SEARCH_SCHEDULES": ("planner.search.schedules", "SCHEDULES"),   # name -> the search's entry
    "pareto": ("planner.pareto", "pareto"),
    "check_plot_path": ("planner.pareto", "check_plot_path"),
    "plot_front": ("planner.pareto", "plot_front"),
    "write_files": ("planner.launch.output", "write"),
    "TINY_MODEL": ("planner.launch.runner", "TINY_MODEL"),
    "TINY_SEQ_LEN": ("planner.launch.runner", "TINY_SEQ_LEN"),
    "plan_execution": ("planner.simulate.plan", "plan_execution"),
    "timeline_rows": ("planner.simulate.plan", "timeline_rows"),
    "write_timeline": ("planner.simulate.render", "write_timeline"),
    "write_trace": ("planner.simulate.render", "write_trace"),
    "calibrate_file": ("planner.profile.calibrate", "calibrate_file"),
    "profile_file_name": ("planner.profile.from_run", "file_name"),
    "profiling": ("planner.profile.measure", None),   # the module (imports torch): check_tp, measure_profile
    "run_settings_for": ("planner.launch.dynamic_run", "settings_for"),
}


__all__ = [  # noqa: PLE0604 - the names in _ELSEWHERE are strings too
    "Cluster", "InfeasibleError", "InputError", "ModelSpec", "Plan", "PlannerError", "Training",
    "diff", "evaluate", "launch", "latency_schedule", "load_cluster", "load_model", "load_plan", "load_training", "plan",
    "profile_from_run", "rebalance", "replan", "resolve_profiles", "run", "search_watch", "simulate", "summarize_cluster", "training_from_mapping",
    *sorted(_ELSEWHERE),
]


def __getattr__(name: str):
    try:
        module, attr = _ELSEWHERE[name]
    except KeyError:
        raise AttributeError(f"module 'planner.api' has no attribute {name!r}") from None
    found = importlib.import_module(module)
    return found if attr is None else getattr(found, attr)


def training_from_mapping(data: dict, file: str) -> Training:
    """A ``Training`` from command-line values, its errors naming ``file`` (the flags) and the field."""
    from planner.spec.source import document_from_data, validate_model

    return validate_model(Training, document_from_data(data, file=file))


def resolve_profiles(cluster: Cluster, profiles: Any):
    """The profiles to price with: a ``ProfileSet`` as given; a folder or file path loaded;
    ``None``: the ones the cluster spec names.  Every entry point uses this, so the API and
    the commands price a plan alike."""
    if isinstance(profiles, (str, Path)):
        from planner.profile import load_profiles

        return load_profiles(profiles, cluster=cluster)
    if profiles is not None or not cluster.profiles:
        return profiles
    from planner.profile import load_profiles

    return load_profiles(None, cluster=cluster)


def load_plan(path: str | Path) -> Plan:
    """Read a plan file with errors naming the file and field."""
    from planner.plan.check import load_plan as _load

    return _load(path)


def simulate(cluster: Cluster, plan: Plan, profiles: Any = None, calibration: str | Path | None = None,
             file: str = "<plan>"):
    """Run the plan's pipeline schedule event by event (see ``planner.simulate``), priced with
    the calibration file ``calibration`` (from ``planner profile --calibrate``; None: the
    shipped fit, or PLANNER_CALIBRATION)."""
    from planner.cost.calibration import calibrated
    from planner.simulate import simulate_plan

    with calibrated(calibration):
        return simulate_plan(cluster, plan, profiles=resolve_profiles(cluster, profiles), file=file)


def evaluate(cluster: Cluster, plan: Plan, profiles: Any = None, calibration: str | Path | None = None,
             **options: Any) -> Evaluation:
    """Predict a plan's iteration time, throughput, cost and memory, term by term (options:
    ``check=False`` skips checking the plan against the cluster)."""
    from planner.cost import evaluate as _evaluate
    from planner.cost.calibration import calibrated

    with calibrated(calibration):
        return _evaluate(cluster, plan, profiles=resolve_profiles(cluster, profiles), **options)


def launch(plan: Plan, fmt: str, cluster: Cluster | None = None, **options: Any) -> dict[str, str]:
    """Launcher inputs for ``plan`` (torchrun, megatron, deepspeed, pipelining) by file name."""
    from planner.launch import render

    return render(plan, fmt, cluster=cluster, **options)


def run(plan: Plan, steps: int = 3, backend: str = "gloo", **options: Any):
    """Train the plan's layout for ``steps`` steps on local processes (needs the torch extra)."""
    from planner.launch.runner import run_plan

    return run_plan(plan, steps=steps, backend=backend, **options)


def plan(cluster: Cluster, model: ModelSpec | str, training: Training, objective: str = "throughput",
         time_limit_s: float = 60.0, top_k: int = 1, **options: Any):
    """Search the plan space (DESIGN §6) and return the best plan(s) with a solver report.

    ``result.plan``, ``result.evaluation`` and ``result.solver`` are the best plan, its
    prediction and how it was proved; ``result.plans`` holds the ``top_k`` best.  Options:
    ``launcher``, ``profiles``, ``budget_usd_per_hour``, ``min_tokens_per_s``, ``gap_rel``,
    ``progress`` (called with each message), ``watch`` (``search_watch()``) and
    ``calibration`` (a file from ``planner profile --calibrate``, for this call only).
    """
    from planner.cost.calibration import calibrated
    from planner.launcher_space import narrow
    from planner.search import solve

    if isinstance(model, str):
        model = load_model(model)
    training = narrow(training, options.get("launcher"))     # only what the launcher can run
    profiles = options["profiles"] = resolve_profiles(cluster, options.get("profiles"))
    with calibrated(options.pop("calibration", None)):
        result = solve(cluster, model, training, objective=objective, time_limit_s=time_limit_s,
                       top_k=top_k, **options)
    # The plan file keeps what was proved, not how long it took (PLAN_SOLVER_FIELDS): the
    # same inputs give the same bytes.  ``result.report`` keeps the run's timing and counters.
    result.plans = [_record_cost_sources(p, e, profiles).model_copy(update={"solver": p.solver.for_plan()})
                    for p, e in zip(result.plans, result.evaluations)]
    return result


def search_watch():
    """A ``planner.search.watch.SearchWatch`` to pass as ``plan(..., watch=w)``; from another
    thread ``w.snapshot()`` gives the best plan so far, its tokens/s, the proved bound and the
    gap (None before the search has set up)."""
    from planner.search.watch import SearchWatch

    return SearchWatch()


def _record_cost_sources(plan_: Plan, evaluation: Evaluation, profiles: Any) -> Plan:
    """Write into ``inputs.profiles`` which layer costs were measured and which estimated
    (issue: a prediction says what it rests on)."""
    record: dict[str, Any] = {
        kind: sorted(k for k, v in evaluation.sources.items() if v == kind)
        for kind in ("measured", "interpolated", "estimated")
    }
    if profiles is not None and hasattr(profiles, "usage"):
        usage = profiles.usage()
        record["files"] = usage.get("files", [])
        if evaluation.repriced:
            record["repriced"] = dict(sorted(evaluation.repriced.items()))
    inputs = plan_.inputs.model_copy(update={"profiles": record})
    return plan_.model_copy(update={"inputs": inputs})


def replan(cluster: Cluster, old_plan: Plan, time_limit_s: float = 60.0, profiles: Any = None,
           file: str = "<plan>", calibration: str | Path | None = None, **options: Any):
    """Check ``old_plan`` against a changed cluster and search again, keeping the old plan
    (repaired after lost nodes) unless the fresh one wins; ``options``: migration_steps,
    max_moved_fraction and the search's options (see ``planner.replan``)."""
    from planner.cost.calibration import calibrated
    from planner.replan import replan as _replan

    with calibrated(calibration):
        return _replan(cluster, old_plan, time_limit_s=time_limit_s,
                       profiles=resolve_profiles(cluster, profiles), file=file, **options)


def rebalance(cluster: Cluster, plan_: Plan, measurements_file: str | Path, file: str = "<plan>",
              blocks: bool = False, profiles: Any = None, calibration: str | Path | None = None):
    """Shares re-solved from a run's measurements on the plan's own devices: (result, new plan)
    (``planner.rebalance``; bad measurements are input errors naming the field).  With
    ``blocks`` the contiguous block split is re-solved first, on the same stages, devices, tp
    and schedule (``planner.rebalance_blocks``; ``profiles`` and ``calibration`` price the
    layer ratio the measured times are split in, as ``profile_from_run``): the result is a
    ``BlockRebalanced`` (old and new split, predicted step time before and after) and the new
    plan is checked against ``cluster``."""
    from planner.launch.measurements import load
    from planner.plan.check import check_plan
    from planner.rebalance import rebalance as solve
    from planner.rebalance import rebalanced_plan

    check_plan(cluster, plan_, file=file)  # the same devices must still be there
    doc, times = load(measurements_file, plan_)
    min_share = plan_.dynamic_shares.min_share if plan_.dynamic_shares is not None else 1
    if blocks:
        from planner.cost.calibration import calibrated
        from planner.rebalance_blocks import block_rebalanced_plan, rebalance_blocks

        with calibrated(calibration):
            result = rebalance_blocks(cluster, plan_, doc, times, str(measurements_file), min_share,
                                      profiles=resolve_profiles(cluster, profiles))
        new = block_rebalanced_plan(plan_, result)
        check_plan(cluster, new, file=f"{file} rebalanced")
        return result, new
    result = solve(plan_, times, [s["step_time_s"] for s in doc["steps"]], min_share)
    return result, rebalanced_plan(plan_, result)


def profile_from_run(cluster: Cluster, plan_: Plan, measurements_file: str | Path, file: str = "<plan>",
                     warmup: int = 1, profiles: Any = None, calibration: str | Path | None = None,
                     note: str | None = None):
    """Profiles (one per GPU type) from a run's measurements of ``plan_``: each replica's
    measured compute split over its layers in the cost model's ratio, median over the steps
    after ``warmup`` (``planner.profile.from_run``).  The cost model's ratio uses ``profiles``
    (None: the cluster's) and ``calibration``.  Bad measurements are input errors naming the
    field.  Returns ``planner.profile.from_run.FromRun``."""
    from planner.cost.calibration import calibrated
    from planner.plan.check import check_plan
    from planner.profile.from_run import profiles_from_run

    check_plan(cluster, plan_, file=file)  # the devices (and their GPU types) must be there
    with calibrated(calibration):
        return profiles_from_run(cluster, plan_, str(measurements_file), warmup=warmup,
                                 profiles=resolve_profiles(cluster, profiles), note=note)


def diff(a: Plan, b: Plan):
    """What changed from plan ``a`` to plan ``b`` (``planner.diff.PlanDiff``)."""
    from planner.diff import diff_plans

    return diff_plans(a, b)


def summarize_cluster(cluster: Cluster) -> dict:
    """GPUs per type and zone, peak PFLOP/s, memory, links: what ``planner validate`` prints."""
    groups: dict[tuple[str, str, int], dict] = defaultdict(lambda: {
        "nodes": 0, "gpus": 0, "peak_pflops": 0.0, "memory_bytes": 0.0, "network_Bps": 0.0,
        "usd_per_hour": None})
    for node in cluster.node_list:
        key = (node.zone, node.gpu.name, node.gpus_per_node)
        row = groups[key]
        row["nodes"] += 1
        row["gpus"] += node.gpus_per_node
        row["peak_pflops"] += node.gpu.peak_tflops * node.gpus_per_node / 1e3
        row["memory_bytes"] += node.gpu.memory_bytes * node.gpus_per_node
        row["network_Bps"] = node.group.network_Bps
        price = node.group.price_usd_per_hour
        if price is not None:
            row["usd_per_hour"] = (row["usd_per_hour"] or 0.0) + price
    rows = [{"zone": z, "gpu_type": g, "gpus_per_node": n, **v} for (z, g, n), v in sorted(groups.items())]
    return {
        "name": cluster.name,
        "num_nodes": len(cluster.node_list),
        "num_gpus": cluster.num_gpus,
        "zones": cluster.zone_names,
        "groups": rows,
        "peak_pflops": sum(r["peak_pflops"] for r in rows),
        "memory_bytes": sum(r["memory_bytes"] for r in rows),
        "links": [
            {"between": list(link.between), "bandwidth_Bps": link.bandwidth_Bps,
             "aggregate_bandwidth_Bps": link.aggregate_bandwidth_Bps, "latency_s": link.latency_s,
             "egress_price_per_gb_usd": link.egress_price_per_gb_usd}
            for link in cluster.links
        ],
        "sha256": cluster.sha256(),
    }


def latency_schedule(cluster: Cluster, plan_: Plan, exact: bool = False, memory_cap: int | None = None,
                     time_limit_s: float = 30.0, profiles: Any = None, file: str = "<plan>"):
    """Rewrite a one-stage-per-rank plan's schedule as latency-aware (CrossPipe, issue 17):
    per-rank F / I / W orders that hide slow-link sends under ``memory_cap`` micro-batches
    in flight per rank (default min(m, p)); greedy, or the exact MILP with ``exact``.  Returns
    ``planner.simulate.latency_rewrite.Rewrite`` (``.plan``, before / after, the gap)."""
    from planner.simulate.latency_rewrite import rewrite

    return rewrite(cluster, plan_, profiles=resolve_profiles(cluster, profiles), exact=exact,
                   memory_cap=memory_cap, time_limit_s=time_limit_s, file=file)
