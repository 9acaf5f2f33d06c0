"""What an over-full replica needs and what would make it fit (``evaluate``'s memory problems):
each alternative priced by the memory model, not guessed."""

from __future__ import annotations

import math

from planner.cost.memory import logits_in_flight, replica_memory


def _gb(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def memory_problem(ctx, plan, st, k, r, gpu, mem, inflight, deferred_w: float = 0.0) -> str:
    """Which device, by how much, and what would fit (each alternative priced)."""
    over = mem.total_bytes - gpu.memory_bytes
    head = (f"stage {st.index} replica {k} ({r.devices[0]}{'…' if len(r.devices) > 1 else ''}, {gpu.name}): "
            f"needs {_gb(mem.total_bytes)} of {_gb(gpu.memory_bytes)}, over by {_gb(over)} "
            f"(weights {_gb(mem.weights_bytes)}, grads {_gb(mem.grads_bytes)}, optimizer "
            f"{_gb(mem.optimizer_bytes)}, activations {_gb(mem.activations_bytes)}"
            + (f", ZeRO-3 gathered weights {_gb(mem.gathered_bytes)}" if mem.gathered_bytes else "") + ")")
    hints = []
    n = len(st.replicas)

    def total(**changes) -> float:
        alt = ctx.variant(**changes)
        return replica_memory(alt, gpu, r.tp, r.micro_batch_share, st.num_blocks, st.embedding,
                              st.head, n, inflight, logits_in_flight(plan.schedule), deferred_w).total_bytes

    if ctx.recompute != "full":
        t = total(recompute="full")
        hints.append(f"full recompute: {_gb(t)}{' (fits)' if t <= gpu.memory_bytes else ''}")
    if ctx.zero_stage == 0 and n > 1:
        t = total(zero_stage=1)
        hints.append(f"ZeRO-1 over its {n} replicas: {_gb(t)}{' (fits)' if t <= gpu.memory_bytes else ''}")
    static = mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes
    if st.num_blocks > 1 and static > 0:
        room = gpu.memory_bytes - mem.workspace_bytes
        per_block = (static + mem.activations_bytes) / st.num_blocks
        fit_blocks = max(0, int(room // per_block)) if per_block > 0 else st.num_blocks
        if fit_blocks >= 1:
            parts = math.ceil(st.num_blocks / fit_blocks)
            hints.append(f"more stages: about {fit_blocks} of its {st.num_blocks} blocks fit per "
                         f"replica, so split it into {parts} stages")
    hints.append(f"more GPUs: tp={2 * r.tp} would roughly halve weights and optimizer state")
    if mem.activations_bytes > 0:   # context parallelism splits every sequence's activations
        cp = 2 * ctx.context_parallel
        hints.append(f"context_parallel={cp}: activations {_gb(mem.activations_bytes * ctx.context_parallel / cp)}")
    return head + "; would fit: " + "; ".join(hints)
