"""The Python API (DESIGN §7).  Everything the CLI does is reachable from here; the CLI is a
thin layer on these functions.

    from planner import api
    cluster = api.load_cluster("cluster_specs/lab-mixed.yaml")
    model = api.load_model("llama3-70b")
    training = api.training(global_batch_size=1024, seq_len=4096, precision="bf16")
    result = api.plan(cluster, model, training, objective="throughput", time_limit_s=60)
    ev = api.evaluate(cluster, result.plan)

Bad arguments are ``InputError`` (the CLI's exit 2) naming the parameter and what it may be:
each function takes a cluster as a ``Cluster``, a spec path or a mapping; a model as a
``ModelSpec``, a catalog name, a path or a mapping; training as a ``Training`` or a mapping;
a plan as a ``Plan`` or a plan file path (planner.api_inputs).  The classes exported here
(``Cluster``, ``ModelSpec``, ``Training``, ``Plan``) are pydantic models: constructing one
directly, e.g. ``api.Training(global_batch_size=-8, ...)``, raises pydantic's
``ValidationError``; ``api.training(...)`` and the ``load_*`` functions raise ``InputError``.
An unknown keyword argument is Python's ``TypeError``, naming the api function.
"""

from __future__ import annotations

import importlib
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner import api_inputs as args
from planner.errors import InfeasibleError, InputError, PlannerError
from planner.plan import Plan
from planner.spec import Cluster, ModelSpec, Training

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Callable, Mapping

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
    "staged_path": ("planner.output_files", "staged_path"),
    "missing_folders": ("planner.output_files", "missing_folders"),
    "remove_empty": ("planner.output_files", "remove_empty"),
    "plan_chunks": ("planner.launch.common", "chunks"),
    "calibrate_file": ("planner.profile.calibrate", "calibrate_file"),
    "profile_file_name": ("planner.profile.from_run", "file_name"),
    "profiling": ("planner.profile.measure", None),   # the module (imports torch): check_tp, measure_profile
    "run_settings_for": ("planner.launch.dynamic_run", "settings_for"),
}


__all__ = [  # noqa: PLE0604 - the names in _ELSEWHERE are strings too
    "Cluster", "InfeasibleError", "InputError", "ModelSpec", "Plan", "PlannerError", "Training",
    "diff", "evaluate", "launch", "latency_schedule", "load_cluster", "load_model", "load_plan", "load_training", "plan",
    "profile_from_run", "rebalance", "replan", "resolve_profiles", "run", "search_watch", "simulate", "summarize_cluster", "training",
    "training_from_mapping", "timeline_rows", "write_timeline", "write_trace",
    *sorted(_ELSEWHERE),
]


def __getattr__(name: str):
    try:
        module, attr = _ELSEWHERE[name]
    except KeyError:
        raise AttributeError(f"module 'planner.api' has no attribute {name!r}") from None
    found = importlib.import_module(module)
    return found if attr is None else getattr(found, attr)


def training_from_mapping(data: dict, file: str = "<training>") -> Training:
    """A ``Training`` from command-line values, its errors naming ``file`` (the flags) and the field."""
    return args.training_from_fields(data, file)


def training(**fields: Any) -> Training:
    """A ``Training`` (global_batch_size, seq_len, precision, ...): bad values are an
    ``InputError`` naming ``<training>`` and the field, where ``Training(...)`` itself raises
    pydantic's ``ValidationError``."""
    return args.training_from_fields(fields, "<training>")


def load_cluster(spec: str | Path | Mapping[str, Any]) -> Cluster:
    """A cluster spec from a YAML file, or from the spec as a mapping (``cluster_from_dict``);
    every problem names the file (``<cluster>`` for a mapping), line and field."""
    return args.cluster_arg(spec, "spec")


def load_model(name_or_path: str | Path | Mapping[str, Any]) -> ModelSpec:
    """A catalog model name, a YAML file with the model mapping, or the mapping itself."""
    return args.model_arg(name_or_path, "name_or_path")


def load_training(path: str | Path) -> Training:
    """A training spec from a YAML file, errors naming file:line:column and the field."""
    from planner.spec import load_training as _load

    return _load(args.path_arg(path, "path", "training spec (YAML)"))


def resolve_profiles(cluster: Cluster, profiles: Any):
    """The profiles to price with: a ``ProfileSet`` as given; a folder or file path (or a list
    of files) loaded; ``None``: the ones the cluster spec names.  Every entry point uses this,
    so the API and the commands price a plan alike.  Anything else is an ``InputError``."""
    cluster = args.cluster_arg(cluster)
    profiles = args.profiles_arg(profiles)
    if isinstance(profiles, (str, Path, list)):
        from planner.profile import load_profiles

        return load_profiles(profiles, cluster=cluster)
    if profiles is not None or not cluster.profiles:
        return profiles
    from planner.profile import load_profiles

    return load_profiles(None, cluster=cluster)


def load_plan(path: str | Path) -> Plan:
    """Read a plan file with errors naming the file and field."""
    from planner.plan.check import load_plan as _load

    return _load(args.path_arg(path, "path", "plan file"))


def simulate(cluster: Cluster, plan: Plan, profiles: Any = None, calibration: str | Path | None = None,
             file: str = "<plan>"):
    """Run the plan's pipeline schedule event by event (see ``planner.simulate``), priced with
    the calibration file ``calibration`` (from ``planner profile --calibrate``; None: the
    shipped fit, or PLANNER_CALIBRATION)."""
    from planner.simulate import simulate_plan

    cluster = args.cluster_arg(cluster)
    plan, file = args.plan_arg(plan, file=file)
    with _calibrated(calibration):
        return simulate_plan(cluster, plan, profiles=resolve_profiles(cluster, profiles), file=file)


def _calibrated(calibration: Any):
    """``planner.cost.calibration.calibrated`` for a calibration file path (or None)."""
    from planner.cost.calibration import calibrated

    return calibrated(args.optional_path_arg(calibration, "calibration", "calibration file"))


def evaluate(cluster: Cluster, plan: Plan, profiles: Any = None, calibration: str | Path | None = None,
             *, check: bool = True, model: Any = None, precision: str | None = None,
             grad_reduce_overlap: bool | None = None, tp_comm_overlap: bool | None = None,
             flash_attention: bool | None = None, cross_entropy: str | None = None,
             elementwise: str | None = None) -> Evaluation:
    """Predict a plan's iteration time, throughput, cost and memory, term by term.  ``check=False``
    skips checking the plan against the cluster; ``model`` prices another model than the plan's
    ``inputs.model``; the other keywords, when given, override the plan's (or the cost model's)
    setting of that name (``planner.cost.context.CostContext``), e.g. ``grad_reduce_overlap=False``
    for a run without Megatron's ``--overlap-grad-reduce``."""
    from planner.cost import evaluate as _evaluate

    given = {"precision": precision, "grad_reduce_overlap": grad_reduce_overlap,
             "tp_comm_overlap": tp_comm_overlap, "flash_attention": flash_attention,
             "cross_entropy": cross_entropy, "elementwise": elementwise}
    cluster = args.cluster_arg(cluster)
    plan, _ = args.plan_arg(plan)
    args.flag(check, "check")
    if model is not None:
        model = args.model_arg(model)
    overrides = _cost_overrides(given)
    with _calibrated(calibration):
        return _evaluate(cluster, plan, profiles=resolve_profiles(cluster, profiles), check=check,
                         model=model, **overrides)


# evaluate's overrides that a training spec also holds: checked by its field, so that the
# API and a plan file's inputs.training accept the same values; the others are switches
_TRAINING_OVERRIDES = ("precision", "cross_entropy", "elementwise")


def _cost_overrides(given: dict[str, Any]) -> dict[str, Any]:
    """The overrides given (not None), each checked: the cost model would take a bad one
    silently (elementwise=1) or fail deep inside (precision='fp8')."""
    return {name: args.training_choice(value, name) if name in _TRAINING_OVERRIDES else args.flag(value, name)
            for name, value in given.items() if value is not None}


def launch(plan: Plan, fmt: str, cluster: Cluster | None = None, *, master_addr: str | None = None,
           master_port: int | None = None, script: str | None = None, schedule_csv: bool = False,
           file: str | None = None) -> dict[str, str]:
    """Launcher inputs for ``plan`` (torchrun, megatron, deepspeed, pipelining, torchtitan) by
    file name (``planner.launch.render``).  With ``cluster`` the plan is first checked against
    it as ``evaluate`` checks it (devices, GPU types); ``file`` names the plan in errors."""
    from planner.launch import DEFAULT_MASTER_PORT, render

    plan, named = args.plan_arg(plan, file=file or "<plan>")
    if file is None and named != "<plan>":
        file = named        # a plan given by its path: errors name the file
    if cluster is not None:
        cluster = args.cluster_arg(cluster)
    args.text_arg(fmt, "fmt", "a launcher format name")
    args.text_arg(master_addr, "master_addr", "the host name or IP address of node rank 0", optional=True)
    args.text_arg(script, "script", "the training script's path", optional=True)
    args.flag(schedule_csv, "schedule_csv")
    port = DEFAULT_MASTER_PORT if master_port is None else args.whole_number(master_port, "master_port")
    return render(plan, fmt, master_addr=master_addr, master_port=port, script=script, cluster=cluster,
                  schedule_csv=schedule_csv, file=file)


def run(plan: Plan, steps: int = 3, backend: str = "gloo", **options: Any):
    """Train the plan's layout for ``steps`` steps on local processes (needs the torch extra);
    ``options``: those of ``planner.launch.runner.run_plan`` (seed, seq_len, dtype, ...)."""
    from planner.launch.runner import run_plan

    args.check_options("run", options, args.parameters(run_plan, skip=3))
    plan, _ = args.plan_arg(plan)
    return run_plan(plan, steps=args.whole_number(steps, "steps"), backend=backend, **options)


def plan(cluster: Cluster | str | Path | Mapping[str, Any], model: ModelSpec | str | Path | Mapping[str, Any],
         training: Training | Mapping[str, Any], objective: str = "throughput", time_limit_s: float = 60.0,
         top_k: int = 1, *, launcher: str | None = None, profiles: Any = None,
         budget_usd_per_hour: float | None = None, min_tokens_per_s: float | None = None, gap_rel: float = 0.0,
         progress: Callable[[str], None] | None = None, watch: Any = None, calibration: str | Path | None = None,
         deterministic: bool = False, work_budget: int | None = None, incumbents: Any = ()):
    """Search the plan space (DESIGN §6) and return the best plan(s) with a solver report.

    ``result.plan``, ``result.evaluation`` and ``result.solver`` are the best plan, its
    prediction and how it was proved; ``result.plans`` holds the ``top_k`` best.  Options:
    ``launcher``, ``profiles``, ``budget_usd_per_hour``, ``min_tokens_per_s``, ``gap_rel``,
    ``progress`` (called with each message), ``watch`` (``search_watch()``),
    ``calibration`` (a file from ``planner profile --calibrate``, for this call only),
    ``deterministic`` / ``work_budget`` (count work, not seconds: ``planner.search.solve``) and
    ``incumbents`` (plans the search starts from, as ``replan`` passes the old plan).
    """
    from planner.launcher_space import narrow
    from planner.search import solve

    cluster, model = args.cluster_arg(cluster), args.model_arg(model)
    training = args.training_arg(training)
    args.real_number(time_limit_s, "time_limit_s", "positive number of seconds")
    if args.whole_number(top_k, "top_k") < 1:
        # checked here too: the search's own message names the CLI's --top
        raise InputError(f"top_k must be at least 1 (the number of best plans to return), got {top_k}")
    args.whole_number(work_budget, "work_budget", optional=True)
    args.real_number(budget_usd_per_hour, "budget_usd_per_hour", "positive number of USD/hour", optional=True)
    args.real_number(min_tokens_per_s, "min_tokens_per_s", "positive number of tokens/s", optional=True)
    if not (isinstance(gap_rel, (int, float)) and not isinstance(gap_rel, bool) and 0 <= gap_rel < 1):
        raise InputError(f"gap_rel must be a number from 0 (prove optimal) up to, not including, 1, "
                         f"got {args.shown(gap_rel)}")
    args.callable_arg(progress, "progress", "a function called with each progress message (a str)")
    _check_watch(watch)
    incumbents = args.plans_arg(incumbents, "incumbents")
    training = narrow(training, launcher)     # only what the launcher can run
    profiles = resolve_profiles(cluster, profiles)
    with _calibrated(calibration):
        result = solve(cluster, model, training, objective=objective, time_limit_s=time_limit_s,
                       top_k=top_k, launcher=launcher, deterministic=deterministic, work_budget=work_budget,
                       profiles=profiles, budget_usd_per_hour=budget_usd_per_hour,
                       min_tokens_per_s=min_tokens_per_s, gap_rel=gap_rel, progress=progress, watch=watch,
                       incumbents=incumbents)
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


def _check_watch(watch: Any) -> None:
    if watch is None:
        return
    from planner.search.watch import SearchWatch

    if not isinstance(watch, SearchWatch):
        raise InputError(f"watch must be what api.search_watch() returns, or None, got {args.shown(watch)}")


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


# the options of ``plan`` that ``replan`` passes on (it sets the others from the old plan)
_REPLAN_SETS = ("objective", "time_limit_s", "budget_usd_per_hour", "min_tokens_per_s", "profiles",
                "calibration", "incumbents")


def replan(cluster: Cluster, old_plan: Plan, time_limit_s: float = 60.0, profiles: Any = None,
           file: str = "<plan>", calibration: str | Path | None = None, *, migration_steps: int | None = None,
           max_moved_fraction: float | None = None, **options: Any):
    """Check ``old_plan`` against a changed cluster and search again, keeping the old plan
    (repaired after lost nodes) unless the fresh one wins (see ``planner.replan``);
    ``options``: the search's, as ``plan`` takes them (launcher, gap_rel, progress, watch,
    deterministic, work_budget, top_k)."""
    from planner.replan import replan as _replan

    search = [n for n in args.parameters(plan, skip=3) if n not in _REPLAN_SETS]
    args.check_options("replan", options, ["migration_steps", "max_moved_fraction", *search])
    cluster = args.cluster_arg(cluster)
    old_plan, file = args.plan_arg(old_plan, "old_plan", file)
    args.real_number(time_limit_s, "time_limit_s", "positive number of seconds")
    args.whole_number(migration_steps, "migration_steps", optional=True)
    args.real_number(max_moved_fraction, "max_moved_fraction", "number from 0 to 1", optional=True)
    with _calibrated(calibration):
        return _replan(cluster, old_plan, time_limit_s=time_limit_s, profiles=resolve_profiles(cluster, profiles),
                       file=file, migration_steps=migration_steps, max_moved_fraction=max_moved_fraction,
                       **options)


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

    cluster = args.cluster_arg(cluster)
    plan_, file = args.plan_arg(plan_, "plan_", file)
    measurements_file = args.path_arg(measurements_file, "measurements_file", "measurements file")
    check_plan(cluster, plan_, file=file)  # the same devices must still be there
    doc, times = load(measurements_file, plan_)
    min_share = plan_.dynamic_shares.min_share if plan_.dynamic_shares is not None else 1
    if blocks:
        from planner.rebalance_blocks import block_rebalanced_plan, rebalance_blocks

        with _calibrated(calibration):
            result = rebalance_blocks(cluster, plan_, doc, times, str(measurements_file), min_share,
                                      profiles=resolve_profiles(cluster, profiles))
        new = block_rebalanced_plan(plan_, result)
        check_plan(cluster, new, file=f"{file} rebalanced")
        return result, new
    result = solve(plan_, times, [s["step_time_s"] for s in doc["steps"]], min_share, path=str(measurements_file))
    return result, rebalanced_plan(plan_, result)


def profile_from_run(cluster: Cluster, plan_: Plan, measurements_file: str | Path, file: str = "<plan>",
                     warmup: int = 1, profiles: Any = None, calibration: str | Path | None = None,
                     note: str | None = None):
    """Profiles (one per GPU type) from a run's measurements of ``plan_``: each replica's
    measured compute split over its layers in the cost model's ratio, median over the steps
    after ``warmup`` (``planner.profile.from_run``).  The cost model's ratio uses ``profiles``
    (None: the cluster's) and ``calibration``.  Bad measurements are input errors naming the
    field.  Returns ``planner.profile.from_run.FromRun``."""
    from planner.plan.check import check_plan
    from planner.profile.from_run import profiles_from_run

    cluster = args.cluster_arg(cluster)
    plan_, file = args.plan_arg(plan_, "plan_", file)
    measurements_file = args.path_arg(measurements_file, "measurements_file", "measurements file")
    args.whole_number(warmup, "warmup")
    check_plan(cluster, plan_, file=file)  # the devices (and their GPU types) must be there
    with _calibrated(calibration):
        return profiles_from_run(cluster, plan_, str(measurements_file), warmup=warmup,
                                 profiles=resolve_profiles(cluster, profiles), note=note)


def diff(a: Plan, b: Plan):
    """What changed from plan ``a`` to plan ``b`` (``planner.diff.PlanDiff``); each a ``Plan``
    or a plan file path."""
    from planner.diff import diff_plans

    return diff_plans(args.plan_arg(a, "a")[0], args.plan_arg(b, "b")[0])


def summarize_cluster(cluster: Cluster) -> dict:
    """GPUs per type and zone, peak PFLOP/s, memory, links: what ``planner validate`` prints."""
    cluster = args.cluster_arg(cluster)
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
    ``planner.simulate.latency_rewrite.Rewrite`` (``.plan``, before / after, the gap).
    ``time_limit_s`` is checked as ``plan``'s is (a positive, finite number of seconds)."""
    from planner.search import check_time_limit
    from planner.simulate.latency_rewrite import rewrite

    check_time_limit(time_limit_s)
    cluster = args.cluster_arg(cluster)
    plan_, file = args.plan_arg(plan_, "plan_", file)
    args.flag(exact, "exact")
    args.whole_number(memory_cap, "memory_cap", optional=True)
    return rewrite(cluster, plan_, profiles=resolve_profiles(cluster, profiles), exact=exact,
                   memory_cap=memory_cap, time_limit_s=time_limit_s, file=file)


# -- drawing a simulation: each takes what ``simulate`` returns, or what the CLI passes --------

def _execution(run: Any, function: str):
    """The action-list run (``planner.simulate.actions.Execution``) of a ``PlanSimulation``
    (``plan_execution``), or ``run`` itself when it is one."""
    from planner.simulate.actions import Execution
    from planner.simulate.plan import PlanSimulation, plan_execution

    if isinstance(run, PlanSimulation):
        return plan_execution(run)
    if isinstance(run, Execution):
        return run
    raise InputError(f"{function}: run must be what api.simulate returns (or api.plan_execution of it), "
                     f"got {args.shown(run)}")


def write_trace(run: Any, path: str | Path) -> Path:
    """The simulated schedule as Chrome trace events at ``path`` (Perfetto opens it);
    ``run``: what ``simulate`` returns (``planner.simulate.render.write_trace``)."""
    from planner.simulate.render import write_trace as _write

    return _write(_execution(run, "write_trace"), args.path_arg(path, "path", "trace file (.json)"))


def write_timeline(run: Any, path: str | Path, title: str | None = None, keep_staged: bool = False) -> Path:
    """The simulated schedule drawn to ``path`` (.png or .svg; needs matplotlib); ``run``:
    what ``simulate`` returns (``planner.simulate.render.write_timeline``); ``keep_staged``:
    leave the drawing in a hidden file beside ``path`` and return that path, for a caller that
    renames it once its other outputs are written."""
    from planner.simulate.render import write_timeline as _write

    return _write(_execution(run, "write_timeline"), args.path_arg(path, "path", "timeline file (.png or .svg)"),
                  title=args.text_arg(title, "title", "the figure's title", optional=True),
                  keep_staged=bool(keep_staged))


def timeline_rows(result: Any, width: int = 80) -> list[list[tuple[str, str]]]:
    """The simulated schedule as a character grid, per stage ``width`` cells of (char, kind)
    (``planner.simulate.plan.timeline_rows``); ``result``: what ``simulate`` returns, or its
    ``.result``."""
    from planner.simulate.engine import SimResult
    from planner.simulate.plan import PlanSimulation
    from planner.simulate.plan import timeline_rows as _rows

    if isinstance(result, PlanSimulation):
        result = result.result
    if not isinstance(result, SimResult):
        raise InputError(f"timeline_rows: result must be what api.simulate returns (or its .result), "
                         f"got {args.shown(result)}")
    return _rows(result, args.whole_number(width, "width"))
