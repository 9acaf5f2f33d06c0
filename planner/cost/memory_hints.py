"""What an over-full replica needs and what would make it fit (``evaluate``'s memory problems):
each alternative priced by the memory model, not guessed."""

from __future__ import annotations

import math

from planner.cost.memory import logits_in_flight, replica_memory


def _gb(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def memory_problem(ctx, plan, st, k, r, gpu, mem, inflight, deferred_w: float = 0.0,
                   gpus_per_node: int | None = None) -> str:
    """Which device, by how much, and what would fit (each alternative priced); a doubled TP
    only where it divides the heads and stays within ``gpus_per_node``."""
    over = mem.total_bytes - gpu.memory_bytes
    head = (f"stage {st.index} replica {k} ({r.devices[0]}{'…' if len(r.devices) > 1 else ''}, {gpu.name}): "
            f"needs {_gb(mem.total_bytes)} of {_gb(gpu.memory_bytes)}, over by {_gb(over)} "
            f"(weights {_gb(mem.weights_bytes)}, grads {_gb(mem.grads_bytes)}, optimizer "
            f"{_gb(mem.optimizer_bytes)}, activations {_gb(mem.activations_bytes)}"
            + (f", ZeRO-3 gathered weights {_gb(mem.gathered_bytes)}" if mem.gathered_bytes else "") + ")")
    hints = []
    n = len(st.replicas)

    def total(tp: int = r.tp, **changes) -> float:
        alt = ctx.variant(**changes)
        return replica_memory(alt, gpu, tp, r.micro_batch_share, st.num_blocks, st.embedding,
                              st.head, n, inflight, logits_in_flight(plan.schedule), deferred_w).total_bytes

    def priced(label: str, need: float) -> str:
        """Each alternative alone, said whether it fits (a list headed "would fit" named ones
        that did not: a robustness sweep)."""
        left = need - gpu.memory_bytes
        return f"{label}: {_gb(need)} " + ("(fits)" if left <= 0 else f"(still over by {_gb(left)})")

    if ctx.recompute != "full":
        hints.append(priced("full recompute", total(recompute="full")))
    if ctx.zero_stage == 0 and n > 1:
        hints.append(priced(f"ZeRO-1 over its {n} replicas", total(zero_stage=1)))
    static = mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes
    if st.num_blocks > 1 and static > 0:
        room = gpu.memory_bytes - mem.workspace_bytes
        per_block = (static + mem.activations_bytes) / st.num_blocks
        fit_blocks = max(0, int(room // per_block)) if per_block > 0 else st.num_blocks
        if fit_blocks >= 1:
            parts = math.ceil(st.num_blocks / fit_blocks)
            hints.append(f"more stages: about {fit_blocks} of its {st.num_blocks} blocks fit per "
                         f"replica, so split it into {parts} stages")
    if ctx.model.num_attention_heads % (2 * r.tp) == 0 and (gpus_per_node is None or 2 * r.tp <= gpus_per_node):
        hints.append(priced(f"tp={2 * r.tp} (twice the GPUs)", total(tp=2 * r.tp)))
    if mem.activations_bytes > 0:   # context parallelism splits every sequence's activations
        hints.append(priced(f"context_parallel={2 * ctx.context_parallel}",
                            total(context_parallel=2 * ctx.context_parallel)))
    return head + "; each change alone: " + "; ".join(hints)
