"""What a knob tuple is bounded and priced on, shared by the tuples that agree on it: its cost
context and the options a plan of the search can use.  The search (solve.py) and the hint
checks of an infeasible job (hint_checks.py) read them the same way."""

from __future__ import annotations

from planner.search.knobs import make_context
from planner.search.objectives import ObjectiveSpec
from planner.search.space import Pricer


def usable_keys(pricer: Pricer, knobs, launcher: str | None, spec: ObjectiveSpec) -> list:
    """The tuple's options less those no plan of the search can use: with a launcher, replica
    counts that do not split B evenly (its layouts have equal shares); under a budget, options
    whose own rent is over it (a one-node class is rented whole by any plan on it).  Without
    the latter, a class the budget cannot rent kept the bounds low and the gap open.  Mixed
    stages (``training.mixed_stages``) come as their stand-ins (mixed.StandIn), never with a
    launcher (its layouts are uniform)."""
    keys = pricer.option_keys(knobs)
    if launcher:
        keys = [k for k in keys if knobs.micro_batch_size % k.replicas == 0]
    else:
        keys = [*keys, *pricer.stand_ins(knobs)]
    if spec.budget_usd_per_hour is not None:
        cap = spec.budget_usd_per_hour * (1 + 1e-12)
        keys = [k for k in keys if k.full_least_rent(pricer.classes) <= cap]
    return keys


class TupleInputs:
    """Per knob tuple, its context and usable options (``pricer``'s model, training and
    profiles), each built once for the tuples that share it."""

    def __init__(self, pricer: Pricer, launcher: str | None, spec: ObjectiveSpec):
        self.pricer, self.launcher, self.spec = pricer, launcher, spec
        self._contexts: dict = {}
        self._keys: dict = {}

    def context(self, knobs):
        # no cost function reads the schedule from ctx; ZeRO-2/3's per-micro-batch
        # reduce-scatters and ZeRO-3's gathers read m, ZeRO-3's gathers the resharding
        ck = (knobs.recompute, knobs.zero_stage, knobs.reshard_after_forward, knobs.zero_shard_degree,
              knobs.num_micro_batches if knobs.zero_stage >= 2 else 0, knobs.context_parallel,
              knobs.expert_parallel)
        ctx = self._contexts.get(ck)
        if ctx is None:
            p = self.pricer
            ctx = self._contexts[ck] = make_context(p.model, p.training, knobs, p.profiles)
        return ctx

    def keys(self, knobs) -> tuple[list, bool]:
        """(the usable options, whether this call built the list): one list per B, cp (keys are
        tp x cp wide), EP degree and shard degree, the same object each time (the bounds cache
        by it)."""
        uk = (knobs.micro_batch_size, knobs.context_parallel, knobs.expert_parallel, knobs.zero_shard_degree)
        keys = self._keys.get(uk)
        if keys is not None:
            return keys, False
        keys = self._keys[uk] = usable_keys(self.pricer, knobs, self.launcher, self.spec)
        return keys, True
