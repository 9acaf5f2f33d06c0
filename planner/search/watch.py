"""What a running search has reached, for a live display: ``solve(..., watch=SearchWatch())``
and, from any thread, ``watch.snapshot()``.

The search fills ``watch.state`` (the same dict its Ctrl-C path reads: the best candidates,
the bounds of the tuples it has closed and the heap's least bound, ``stats.frontier``);
the snapshot only reads it.  The proved bound is the least of those: every tuple closed so
far is bounded by its own entry in ``bounds`` and every tuple still open by the heap's least.
Before the heap exists the cost objectives have no bound yet (None).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

TIME_LIKE = ("throughput", "throughput-under-budget")


@dataclass(frozen=True)
class SearchSnapshot:
    elapsed_s: float
    objective_kind: str
    best_label: str | None = None           # the best plan's knobs (knobs.Knobs.label)
    best_value: float | None = None         # in the objective's unit (answer.OBJECTIVE_UNITS)
    best_tokens_per_s: float | None = None
    best_usd_per_hour: float | None = None
    bound: float | None = None              # proved lower bound on the objective's value
    gap: float | None = None                # (value - bound) / value
    tokens_per_iteration: int = 0

    @property
    def bound_tokens_per_s(self) -> float | None:
        """For the throughput objectives: no plan is faster than this."""
        if self.objective_kind not in TIME_LIKE or not self.bound or self.bound <= 0:
            return None
        return self.tokens_per_iteration / self.bound


@dataclass
class SearchWatch:
    state: dict = field(default_factory=dict)

    def snapshot(self) -> SearchSnapshot | None:
        """None until the search has set up its state.  Lists are copied in one step each
        (atomic under the GIL): the search appends to them while this runs."""
        state = self.state
        if "best" not in state or "spec" not in state:
            return None
        spec, training = state["spec"], state["training"]
        tokens = training.global_batch_size * training.seq_len
        base = {"elapsed_s": time.monotonic() - state["t0"], "objective_kind": spec.kind,
                "tokens_per_iteration": tokens}
        items = state["best"].items[:1]      # Best.add puts a new list in place: one read
        if not items:
            return SearchSnapshot(**base)
        top = items[0]
        value = top.key[0]
        bounds = list(state["bounds"])
        frontier = state["stats"].frontier
        if frontier is not None:
            bounds.append(frontier)
        if state.get("subspace"):       # a mixed search's first phase bounds its subspace only (solve._pure_first)
            bounds = []
        bound = min(min(bounds), value) if bounds else None
        gap = None
        if bound is not None and math.isfinite(bound):
            gap = max(0.0, (value - bound) / abs(value)) if value > 0 else 0.0
        return SearchSnapshot(**base, best_label=top.knobs.label(), best_value=value,
                              best_tokens_per_s=tokens / top.time_s if top.time_s > 0 else None,
                              best_usd_per_hour=top.price_usd_per_hour, bound=bound, gap=gap)
