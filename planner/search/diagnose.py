"""Why no plan exists, in numbers: the binding memory term per GPU type, or the budget /
floor that no plan meets, and what would make it feasible."""

from __future__ import annotations

import math

from planner.cost.context import element_bytes
from planner.cost.flops import block_expert_params, block_params, total_params
from planner.cost.memory import (
    WORKSPACE_BYTES,
    block_activation_bytes,
    bytes_per_param,
    in_flight_micro_batches,
    replica_memory,
    zero_state_bytes,
)
from planner.search.knobs import Knobs, context_degrees, make_context, tp_degrees


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def _friendliest(model, training, info, zero_stage: int | None = None):
    """The smallest memory one replica of this class can need within the training's freedoms:
    one block, one sequence, the largest TP, as many replicas as the class holds, the most
    saving recompute and ZeRO allowed (or ``zero_stage``, to price a hint), the last stage of
    a long pipeline (one micro-batch in flight).  Returns (bytes, breakdown, settings)."""
    tps = tp_degrees(model, info, training.max_tp)
    if not tps:
        return None
    t = tps[-1]
    # the least activation memory the training allows
    rc = next((m for m in ("full", "op", "selective") if m in training.recompute_modes), "none")
    z = max(training.zero_stages) if zero_stage is None else zero_stage
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


def _higher_zero_stages(training) -> range:
    """The ZeRO stages a hint may name: those above every stage searched.  A searched stage has
    just failed, and a lower one shards less than it."""
    return range(max(training.zero_stages) + 1, 4)


def _sharded_bytes(mem) -> float:
    """The part of a replica's memory that ZeRO divides: weights, gradients, optimizer state,
    and the weights ZeRO-3 gathers back."""
    return mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes + mem.gathered_bytes


def _block_zero_stage(model, training, info, stages) -> int | None:
    """Of ``stages``, the ZeRO stage to allow so that one block fits on ``info``'s GPUs, each
    priced as ``_friendliest``: the lowest at which the block fits whole, else, of those whose
    states fit beside the workspace, the one left least over (its activations are then the
    other hints' to cut).  None where none gets the states in: one replica shards nothing, and
    a workspace that fills the GPU leaves room for no state at all."""
    cap = info.gpu.memory_bytes
    priced = [(z, _friendliest(model, training, info, z)[0]) for z in stages]
    states_fit = [(z, mem) for z, mem in priced if _sharded_bytes(mem) + mem.workspace_bytes <= cap]
    whole = [z for z, mem in states_fit if mem.total_bytes <= cap]
    if whole:
        return whole[0]
    return min(states_fit, key=lambda zm: zm[1].total_bytes)[0] if states_fit else None


def _room_bytes(classes) -> float:
    """What all GPUs hold after the workspace each; a GPU the workspace alone fills holds
    nothing (not less, which would take room from the others)."""
    return sum(c.node_class.num_gpus * max(0.0, c.gpu.memory_bytes - WORKSPACE_BYTES) for c in classes)


def _state_bytes(model, training) -> float:
    """Weights, gradients and optimizer state of the whole model, held once."""
    return total_params(model) * sum(bytes_per_param(training.precision))


def _split_layout(model, training, classes, cp: int) -> tuple[int, int, float] | None:
    """(tp, stages, replicas) of the split at context-parallel degree ``cp`` whose GPUs hold the
    least each: the largest TP beside cp in a node, the most stages (a block each at most), as
    many replicas as the GPUs hold and the batch's sequences feed.  Wider replicas hold less
    each, and a stage more cuts a GPU's blocks by more than the replicas it costs would shard
    them.  A bound's layout: the count is not rounded.  None where no TP fits beside cp."""
    gpus = sum(c.node_class.num_gpus for c in classes)
    tp = max((t for c in classes for t in tp_degrees(model, c, training.max_tp) if t * cp <= c.gpus_per_node),
             default=None)
    if tp is None:
        return None
    stages = max(1, min(model.num_layers, training.max_stages or model.num_layers, gpus // (tp * cp)))
    replicas = max(1.0, min(gpus / (tp * cp * stages), training.global_batch_size))
    return tp, stages, replicas


def _block_state_bytes(model, training, zero_stage: int, tp: int, ranks: float, replicas: float) -> float:
    """Weights, gradients and optimizer state on each GPU of a block's replica at ``zero_stage``
    sharded over ``ranks`` (replicas x cp), the embedding and head spread over the blocks, the
    routed experts over the largest expert-parallel degree the ``replicas`` allow."""
    ep = max((e for e in training.expert_parallel_degrees
              if model.is_moe and model.num_experts % e == 0 and e <= replicas), default=1)
    per_param = bytes_per_param(training.precision)
    experts = block_expert_params(model)      # 0 for dense models
    dense = total_params(model) / model.num_layers - experts
    return (dense * sum(zero_state_bytes(*per_param, zero_stage, ranks))
            + experts / ep * sum(zero_state_bytes(*per_param, zero_stage, ranks / ep))) / tp


def _split_peak_at(model, training, classes, zero_stage: int, cp: int, activations: bool,
                   one_sequence: bool) -> float:
    """``_split_peak_bytes`` at context-parallel degree ``cp`` (inf where no TP fits beside it)."""
    layout = _split_layout(model, training, classes, cp)
    if layout is None:
        return math.inf
    tp, stages, replicas = layout
    states = _block_state_bytes(model, training, zero_stage, tp, replicas * cp, replicas)
    rc = next((m for m in ("full", "op", "selective") if m in training.recompute_modes), "none")
    ctx = make_context(model, training, Knobs(1, training.global_batch_size, "1f1b", 1, rc, zero_stage, stages,
                                              context_parallel=cp))
    per_sequence = block_activation_bytes(ctx, tp, 1) if activations else 0.0
    sequences = 1.0 if one_sequence else training.global_batch_size / replicas
    blocks_per_byte = sum(1 / (states + min(stages - i, sequences) * per_sequence) for i in range(stages))
    once = 0.0
    if activations and rc in ("full", "op"):
        once += block_activation_bytes(ctx, tp, 1, recompute="none")
    if zero_stage >= 3 and replicas * cp > 1:    # one rank shards nothing, so gathers nothing
        gathered = 2 * block_params(model) if any(training.reshard_after_forward) else total_params(model) / stages
        once += gathered / tp * element_bytes(training.precision)
    return model.num_layers / blocks_per_byte + once


def _split_peak_bytes(model, training, classes, zero_stage: int, activations: bool = True,
                      one_sequence: bool = False) -> float:
    """A lower bound on what the fullest GPU of a whole split holds besides its workspace at
    ``zero_stage``, with or without the activations (the most saving recompute allowed, the
    least over the cp degrees allowed).  On ``_split_layout``'s layout stage i of p (1F1B)
    holds, per block, the block's states and the activations of min(p - i, sequences per
    replica) sequences (``one_sequence``: as if the batch gave each replica one); the blocks
    that level the stages leave each L / sum_i 1 / (stage i's bytes per block).  Then what a
    stage holds once: the block being recomputed, and ZeRO-3's gathered weights."""
    return min(_split_peak_at(model, training, classes, zero_stage, cp, activations, one_sequence)
               for cp in context_degrees(training))


def _split_over(model, training, classes, zero_stage: int, activations: bool = True,
                one_sequence: bool = False) -> bool:
    """Whether ``_split_peak_bytes`` is over the room a GPU has on average."""
    gpus = sum(c.node_class.num_gpus for c in classes)
    peak = _split_peak_bytes(model, training, classes, zero_stage, activations, one_sequence)
    return peak > _room_bytes(classes) / gpus


# From about here a block's activations for one sequence (~34 s h bytes, flash attention)
# rival its weights and optimizer state (18 x 12 h^2 bytes) at h <= 4096: splitting the
# sequence is then a memory saver worth naming.
LONG_SEQUENCE_TOKENS = 8192
# The degrees the context-parallelism hint names (and is priced at)
HINTED_CONTEXT_DEGREES = (2, 4)


def _more_freedom(training, zero_stage: int | None = None, recompute: bool = True,
                  context_parallel: bool = True, smaller_batch: bool = True) -> list[str]:
    """What would give a split that does not fit more room: more GPUs, ``zero_stage`` where
    sharding the states can make them fit, and the memory savers the training does not allow
    yet of those flagged as able to make the activations fit."""
    out = ["more GPUs"]
    if recompute and "full" not in training.recompute_modes:
        out.append("full recompute")
    if zero_stage is not None:
        out.append(f"ZeRO-{zero_stage}")
    if training.max_stages:
        out.append(f"more than {training.max_stages} stages")
    if context_parallel and training.context_parallel_degrees == (1,) and training.seq_len >= LONG_SEQUENCE_TOKENS:
        # activations grow with the sequence and only context parallelism splits one sequence
        degrees = ",".join(map(str, HINTED_CONTEXT_DEGREES))
        out.append(f"context parallelism (--context-parallel {degrees}; seq_len a multiple of 2 x each degree)")
    if smaller_batch:
        out.append("a smaller global batch")
    return out


def _split_freedom(model, training, classes, stages) -> list[str]:
    """``_more_freedom`` for a cluster whose single blocks fit but no split does, from
    ``_split_over``.  Of ``stages`` (those that could fit a split's states) the lowest that
    could fit the whole, else, where the searched stage leaves the states over, the lowest
    that fits those; each activation saver where the bound with it fits: alone where a stage
    named fits the whole or none is named, beside the stage named where it fits only the
    states.  Where even the bound fits, the blocks (whole to a stage) are what does not, so
    only more GPUs and stages are named."""
    searched = max(training.zero_stages)

    def over(z: int, freer=training, **kw) -> bool:
        return _split_over(model, freer, classes, z, **kw)

    if not over(searched):
        return _more_freedom(training, recompute=False, context_parallel=False, smaller_batch=False)
    zero = next((z for z in stages if not over(z)), None)
    if zero is None and over(searched, activations=False) and stages:
        zero = stages[0]
    priced = zero if zero is not None and over(zero) else searched
    full = training.model_copy(update={"recompute_modes": (*training.recompute_modes, "full")})
    split = training.model_copy(update={"context_parallel_degrees": (1, *HINTED_CONTEXT_DEGREES)})
    return _more_freedom(training, zero, recompute=not over(priced, full), context_parallel=not over(priced, split),
                         # a smaller batch holds fewer sequences in flight, down to one a replica
                         smaller_batch=training.global_batch_size > 1 and not over(priced, one_sequence=True))


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


def _block_hints(model, training, info, tp: int, cp: int, worst: str, stages) -> list[str]:
    """What the training could allow for one block of ``info``'s class to fit (``_friendliest``
    at ``tp`` and ``cp`` does not), a ZeRO stage among ``stages``.  No "more stages": the block
    is a stage of its own already."""
    hints = []
    if "full" not in training.recompute_modes:
        hints.append("allow full recompute")
    zero = _block_zero_stage(model, training, info, stages)
    if zero is not None:
        hints.append(f"allow ZeRO-{zero} (training.zero_stages)")
    if training.max_tp < info.gpus_per_node:
        hints.append(f"allow tp up to {info.gpus_per_node}")
    if worst == "activations" and 2 * cp * tp <= info.gpus_per_node:
        hints.append("allow context parallelism (training.context_parallel_degrees, seq_len a "
                     "multiple of 2 x each degree)")
    return hints


def explain_infeasible(cluster, model, training, spec, classes, stats) -> str:
    if stats.unexplored or stats.timed_out:
        from planner.search import clock

        work = clock.active()
        if work is not None and not work.wall_clock_bound:
            return (f"no plan found within the work budget ({stats.solved} of {stats.knobs} "
                    f"knob tuples solved, none feasible yet, {work.units:,.0f} units of work done); raise "
                    "--work-budget (or --time-limit, which scales the default budget)")
        return (f"no plan found within the time limit ({stats.solved} of {stats.knobs} "
                "knob tuples solved, none feasible yet); raise --time-limit")
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
    # a stage that leaves a split's states over every GPU's room cannot help a block either
    stages = [z for z in _higher_zero_stages(training)
              if not _split_over(model, training, classes, z, activations=False)]
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
        terms = {"weights": mem.weights_bytes, "gradients": mem.grads_bytes,
                 "optimizer state": mem.optimizer_bytes, "activations": mem.activations_bytes,
                 "workspace": mem.workspace_bytes}
        worst = max(terms, key=terms.get)
        # with the states over all GPUs together no knob makes the model fit, only memory does
        hints = [] if state_line else _block_hints(model, training, info, t, cp, worst, stages)
        hints.append(f"GPUs with more than {_gib(mem.total_bytes)}")
        lines.append(
            f"{info.name} ({cap / 2**30:.0f} GiB): even one block with tp={t}, "
            + (f"context_parallel={cp}, " if cp > 1 else "") + "one sequence, "
            f"recompute={rc}, ZeRO-{z} over {n} replicas needs {_gib(mem.total_bytes)} per GPU, "
            f"over by {_gib(mem.total_bytes - cap)}; largest term {worst} {_gib(terms[worst])} "
            f"(weights {_gib(mem.weights_bytes)}, grads {_gib(mem.grads_bytes)}, optimizer "
            f"{_gib(mem.optimizer_bytes)}, activations {_gib(mem.activations_bytes)}); would fit: "
            + ", ".join(hints))
    if state_line:
        lines.append(state_line)
    if fits_somewhere:
        total = sum(c.node_class.num_gpus for c in classes)
        # the state line above says how many GPUs: no other freedom can make up for them
        freedom = ["more GPUs"] if state_line else _split_freedom(model, training, classes, stages)
        lines.append(f"single blocks fit, but no split of {model.num_layers} blocks (plus embedding "
                     f"and head) over the {total} GPUs fits in memory with the allowed knobs "
                     f"(schedules {', '.join(training.schedules)}, recompute "
                     f"{', '.join(training.recompute_modes)}, ZeRO {', '.join(map(str, training.zero_stages))}); "
                     "would fit: " + ", ".join(freedom))
    return f"no feasible plan for {model.name} on {cluster.name}:\n  " + "\n  ".join(lines)
