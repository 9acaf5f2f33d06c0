"""Why no plan exists, in numbers: the binding memory term per GPU type, the model's states
against all the GPUs' memory, or the budget / floor that no plan meets; and what would make
it feasible, each change checked by a search that allows it (hint_checks.py)."""

from __future__ import annotations

import math

from planner.cost.flops import total_params
from planner.cost.memory import WORKSPACE_BYTES, bytes_per_param, in_flight_micro_batches, replica_memory
from planner.search.hint_checks import checked_hints, record
from planner.search.knobs import Knobs, context_degrees, make_context, tp_degrees


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def _friendliest(model, training, info):
    """The smallest memory one replica of this class can need within the training's freedoms:
    one block, one sequence, the largest TP, as many replicas as the class holds, the most
    saving recompute and ZeRO allowed, the last stage of a long pipeline (one micro-batch in
    flight).  Returns (the memory breakdown, its settings)."""
    tps = tp_degrees(model, info, training.max_tp)
    if not tps:
        return None
    t = tps[-1]
    # the least activation memory the training allows
    rc = next((m for m in ("full", "op", "selective") if m in training.recompute_modes), "none")
    z = max(training.zero_stages)
    # the largest context-parallel degree whose replica still fits a node beside that tp
    cp = max((d for d in context_degrees(training) if t * d <= info.gpus_per_node), default=1)
    n = max(1, min(info.max_replicas(t * cp), training.global_batch_size))
    # ZeRO-3 without resharding holds the whole stage gathered: the friendliest reshards if allowed
    knobs = Knobs(1, training.global_batch_size, "1f1b", 1, rc, z, max(1, model.num_layers),
                  reshard_after_forward=any(training.reshard_after_forward), context_parallel=cp)
    ctx = make_context(model, training, knobs)
    inflight = in_flight_micro_batches("1f1b", knobs.num_stages, knobs.num_stages - 1, 1, 1)
    mem = replica_memory(ctx, info.gpu, t, 1, 1, False, False, n, inflight)
    return mem, (t, rc, z, n, cp)


def _room_bytes(classes) -> float:
    """What all GPUs hold after the workspace each; a GPU the workspace alone fills holds
    nothing (not less, which would take room from the others)."""
    return sum(c.node_class.num_gpus * max(0.0, c.gpu.memory_bytes - WORKSPACE_BYTES) for c in classes)


def _state_bytes(model, training) -> float:
    """Weights, gradients and optimizer state of the whole model, held once."""
    return total_params(model) * sum(bytes_per_param(training.precision))


def _total_state_line(model, training, classes) -> str | None:
    """The line for weights, gradients and optimizer state that no sharding fits: over what all
    the GPUs hold even split without any replication; None where they fit."""
    total = sum(c.node_class.num_gpus for c in classes)
    static, room = _state_bytes(model, training), _room_bytes(classes)
    if static <= room:
        return None
    per_param = sum(bytes_per_param(training.precision))
    if room > 0:
        more = f"at least {math.ceil(static / room * total)} GPUs of these types, or GPUs with more memory"
    else:
        more = f"GPUs with more memory than the {_gib(WORKSPACE_BYTES)} workspace"
    return (f"weights, gradients and optimizer state of {model.name} ({total_params(model) / 1e9:.2f} B "
            f"parameters x {per_param:g} bytes) need {_gib(static)} even split without any "
            f"replication, but the {total} GPUs hold {_gib(room)} after the "
            f"{_gib(WORKSPACE_BYTES)} workspace each: over by {_gib(static - room)}; would fit: {more}")


def explain_infeasible(cluster, model, training, spec, classes, stats, launcher: str | None = None) -> str:
    """Why the search found no plan; with ``launcher``, hints are checked in its space.  Inside
    a hint's check (hint_checks.py) it only records whether that search ran out of time."""
    if record(bool(stats.unexplored or stats.timed_out)):
        return "a hint's check found no plan"     # hint_checks.py reads the record, not this
    if stats.unexplored or stats.timed_out:
        from planner.search import clock

        work = clock.active()
        if work is not None and not work.wall_clock_bound:
            return (f"no plan found within the work budget ({stats.solved} of {stats.knobs} "
                    f"knob tuples solved, none feasible yet, {work.units:,.0f} units of work done); raise "
                    "--work-budget (or --time-limit, which scales the default budget)")
        return (f"no plan found within the time limit ({stats.solved} of {stats.knobs} "
                "knob tuples solved, none feasible yet); raise --time-limit")
    if not stats.knobs:
        return _no_tuple(cluster, model, training, classes, launcher)
    lines = []
    if training.micro_batch_sizes and stats.knobs and \
            stats.no_options >= stats.knobs - stats.pruned:
        gbs = training.global_batch_size
        sizes = ", ".join(map(str, training.micro_batch_sizes or ()))
        return (f"the global batch of {gbs} sequences cannot be split: no micro-batch (a divisor of "
                f"{gbs}) spread over the replicas this cluster can hold gives each replica a share in "
                f"micro_batch_sizes [{sizes}]; allow other sizes, or a global batch that such "
                "shares divide")
    least = stats.least_price_usd_per_hour
    if spec.kind == "throughput-under-budget" and least is not None and least > spec.budget_usd_per_hour:
        return (f"no plan fits the budget of {spec.budget_usd_per_hour:g} USD/hour: the cheapest layout "
                f"rents at least {least:g} USD/hour of nodes ("
                f"{least - spec.budget_usd_per_hour:g} over); raise the budget to at least that or add "
                "cheaper nodes")
    if (stats.solved or stats.out_of_reach) and spec.kind == "throughput-under-budget":
        return (f"no plan fits the budget of {spec.budget_usd_per_hour:g} USD/hour: every layout that "
                "fits in memory rents more nodes than that; raise the budget or add cheaper nodes")
    if stats.over_budget and spec.kind == "throughput-under-budget":
        # what the budget rents does not hold the model: the budget is the binding reason
        dear = ", ".join(f"{name} ({price:g} USD/hour a node)" for name, price in sorted(stats.over_budget.items()))
        return (f"no plan fits the budget of {spec.budget_usd_per_hour:g} USD/hour: it cannot rent "
                f"{dear}, and no layout on what it can rent fits in memory; raise the budget")
    if (stats.solved or stats.out_of_reach) and spec.kind == "cost-above-floor":
        fastest, tokens = stats.least_time_s, stats.tokens_per_iteration
        cap_s = tokens / spec.min_tokens_per_s if tokens else None
        if fastest and cap_s and fastest > cap_s:
            why = (f": no layout takes less than {fastest:.4g} s per iteration (a lower bound), at most "
                   f"{tokens / fastest:,.0f} tokens/s")
        elif cap_s:     # the first bound alone does not show it: say what did
            why = (f": every layout was shown to take more than the floor's {cap_s:.4g} s per iteration "
                   f"({stats.out_of_reach} knob tuples by their bounds, {stats.solved} "
                   "by an exact solve); --objective throughput gives the fastest plan")
        else:
            why = ""
        return (f"no plan reaches {spec.min_tokens_per_s:g} tokens/s on this cluster{why}; lower the "
                "floor or add GPUs")
    state_line = _total_state_line(model, training, classes)
    blocked: dict[str, float] = {}      # GPU type -> what one block needs on it at the least
    fits_somewhere = False
    for info in classes:
        got = _friendliest(model, training, info)
        if got is None:
            lines.append(f"{info.name}: no TP degree <= {min(info.gpus_per_node, training.max_tp)} "
                         f"divides the {model.num_attention_heads} heads")
            continue
        mem, (t, rc, z, n, cp) = got
        cap = info.gpu.memory_bytes
        if mem.total_bytes <= cap:
            fits_somewhere = True
            continue
        blocked[info.gpu.name] = max(blocked.get(info.gpu.name, 0.0), mem.total_bytes)
        terms = {"weights": mem.weights_bytes, "gradients": mem.grads_bytes,
                 "optimizer state": mem.optimizer_bytes, "activations": mem.activations_bytes,
                 "workspace": mem.workspace_bytes}
        worst = max(terms, key=terms.get)
        lines.append(
            f"{info.name} ({cap / 2**30:.0f} GiB): even one block with tp={t}, "
            + (f"context_parallel={cp}, " if cp > 1 else "") + "one sequence, "
            f"recompute={rc}, ZeRO-{z} over {n} replicas needs {_gib(mem.total_bytes)} per GPU, "
            f"over by {_gib(mem.total_bytes - cap)}; largest term {worst} {_gib(terms[worst])} "
            f"(weights {_gib(mem.weights_bytes)}, grads {_gib(mem.grads_bytes)}, optimizer "
            f"{_gib(mem.optimizer_bytes)}, activations {_gib(mem.activations_bytes)})")
    if fits_somewhere:
        total = sum(c.node_class.num_gpus for c in classes)
        lines.append(f"single blocks fit, but no split of {model.num_layers} blocks (plus embedding "
                     f"and head) over the {total} GPUs fits in memory with the allowed knobs "
                     f"(schedules {', '.join(training.schedules)}, recompute "
                     f"{', '.join(training.recompute_modes)}, ZeRO {', '.join(map(str, training.zero_stages))})")
    if state_line:
        # the states alone are over all the GPUs together: no knob or batch makes up for it
        lines.append(state_line)
    else:
        lines += _checked_lines(checked_hints(cluster, model, training, spec, classes, blocked, launcher))
    return f"no feasible plan for {model.name} on {cluster.name}:\n  " + "\n  ".join(lines)


def _no_tuple(cluster, model, training, classes, launcher) -> str:
    """No knob tuple at all: the schedules' rules on stages and micro-batches (schedules.py,
    ``admits``) leave no (micro-batch size, stage count) of this global batch on this cluster,
    before memory is asked; the global batches nearest it that leave one."""
    from planner.search.knobs import enumerate_knobs
    from planner.search.schedules import schedules_for

    gbs = training.global_batch_size
    rules = [rule for rule in (e.rule() for e in schedules_for(training, launcher)) if rule]
    gpus = sum(c.node_class.num_gpus for c in classes)
    near = []
    for step in (-1, 1):        # the nearest below, then above
        tried = range(gbs + step, gbs + step * (NEAR_BATCH_SEARCH + 1), step)
        fits = (g for g in tried if g >= 1 and enumerate_knobs(
            model, training.model_copy(update={"global_batch_size": g}), classes, launcher))
        g = next(fits, None)
        if g is not None:
            near.append(g)
    return (f"no plan for {model.name} on {cluster.name}: no layout meets the schedules' rules "
            f"with a global batch of {gbs} sequences ({'; '.join(rules) or 'no schedule allowed'}), "
            f"on {gpus} GPUs and {model.num_layers} layers"
            + (f"; global batch sizes near it that meet them: {' and '.join(map(str, near))} "
               "(--global-batch-size)" if near else "")
            + (", or allow 1f1b (--schedule)" if "1f1b" not in training.schedules else ""))


NEAR_BATCH_SEARCH = 64      # sequences either side of the global batch tried for a nearby one


def _checked_lines(checker) -> list[str]:
    """The hints that a search with each alone showed to give a plan, then the changes it
    showed give none, and those it could not decide in its time."""
    out = []
    if checker.fits:
        out.append("would fit (each alone; a search with it finds a plan): " + ", ".join(checker.fits))
    if checker.fails:
        out.append(("no other single change checked gives a plan: " if checker.fits else
                    "no single change checked gives a plan: ") + ", ".join(checker.fails))
    if checker.undecided:
        out.append("not decided in the time the checks had: " + ", ".join(checker.undecided))
    return out
