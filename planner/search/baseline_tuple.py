"""One knob tuple as the baseline rules see it (baselines.py): its options and their memory
limits per stage, read the way Pricer._option reads them, with the cheap exact checks that
let the rules try hundreds of options per tuple and build few memory models."""

from __future__ import annotations

from planner.cost.memory import logits_in_flight, replica_memory, stage_holds
from planner.search.knobs import OptionKey
from planner.search.pieces import model_units
from planner.search.schedules import SCHEDULES


class _Tuple:
    """One knob tuple's options and their memory limits per stage, as Pricer._option prices
    them (the same memory model, in-flight count and end flags), without their timings: the
    rules try hundreds of options per tuple on c and price few.  ``limits`` is shared by the
    tuples of one ``seed`` call: tuples differing only in the schedule or stage count meet the
    same (memory model, in-flight count) pairs again."""

    def __init__(self, pricer, knobs, ctx, keys, limits: dict | None = None):
        self.pricer, self.knobs, self.ctx = pricer, knobs, ctx
        self.key_list = keys    # ranked's list, one per B (tuple_inputs.usable_keys): it names the options
        self.unit = knobs.block_unit
        self.L_units = pricer.model.num_layers // self.unit
        self._limits = self.shared = {} if limits is None else limits
        B = knobs.micro_batch_size
        # what the tuple's options are depends on the list and B alone: read once per seed call
        # (c: 368 options a tuple, 516 tuples); the rules cache by the list's id too
        # (baselines.py): kept alive with the cache, no other list takes its id
        opts = self.shared.get(("options", id(keys), B))
        if opts is None:
            opts = self.shared[("options", id(keys), B)] = _Options(keys, set(pricer.pure_part(keys)), B)
        self.keys, self.replicas, self.tps = opts.keys, opts.replicas, opts.tps
        self._most_replicas, self._by_group = opts.most_replicas, opts.by_group
        self._fit: dict = {}
        self._models: dict = {}
        self._over: dict = {}
        self._run_ends: dict = {}
        self.cp = knobs.context_parallel    # the tuple's keys all carry it
        p, entry = knobs.num_stages, SCHEDULES[knobs.schedule]
        # per stage: (embedding, head) as the cost model prices it (a V holds both on rank 0)
        # and its micro-batches in flight
        self._ends = [entry.stage_ends(p, s) for s in range(p)]
        self._holds = [stage_holds(knobs.schedule, p, s, knobs.num_micro_batches, knobs.virtual_stages)
                       for s in range(p)]

    def fits(self, key: OptionKey, s: int, units: int) -> bool:
        """Whether ``units`` core units of blocks fit the memory of ``key`` at stage ``s``."""
        return (key in self.keys and 1 <= units and not self._state_over(key.cls, key.tp, self._ends[s], units)
                and units <= self._max_units(key, s))

    def fits_range(self, key: OptionKey, first: int, stop: int, units: int) -> bool:
        """``fits`` at every stage of ``first`` .. ``stop`` - 1."""
        if key not in self.keys or units < 1 or self.state_over(key.cls, key.tp, first, stop, units):
            return False
        if (key, first) not in self._fit and self._over_at(key, first, units):
            return False        # without the memory model (five memory evaluations)
        return all(units <= self._max_units(key, s) for s in range(first, stop))

    def state_over(self, cls: int, tp: int, first: int, stop: int, units: int) -> bool:
        """``_state_over`` at some stage of ``first`` .. ``stop`` - 1 (whatever the replicas)."""
        ends = self._run_ends.get((first, stop))
        if ends is None:
            ends = self._run_ends[(first, stop)] = tuple(set(self._ends[first:stop]))
        return any(self._state_over(cls, tp, e, units) for e in ends)

    def _over_at(self, key: OptionKey, s: int, units: int) -> bool:
        """Whether ``units`` core units overflow ``key`` at stage ``s`` by more than the
        margin within which _max_units settles the limit with the memory function itself:
        then they do not fit (the memory grows with the blocks), one memory evaluation
        where the model takes five.  A run of stages mostly fails at its first (1F1B keeps
        the most micro-batches in flight there)."""
        share = -(-self.knobs.micro_batch_size // key.replicas)
        gpu = self.pricer.classes[key.cls].gpu
        need = replica_memory(self.ctx, gpu, key.tp, share, units * self.unit, *self._ends[s], key.replicas,
                              self._holds[s][0], logits_in_flight(self.knobs.schedule),
                              self._holds[s][1]).total_bytes
        return need > gpu.memory_bytes * (1 + 1e-6)

    def _state_over(self, cls: int, tp: int, ends: tuple[bool, bool], units: int) -> bool:
        """Whether the weights, gradients, optimizer state and workspace alone of ``units``
        core units at a stage with these ends overflow the GPU for every option of the class
        and TP degree: those parts shrink as replicas grow (ZeRO shards them over the
        replicas), so at the tuple's most replicas they bound every option's memory from
        below, and activations and gathered weights only add.  Exact: no option it rules out
        fits (the margin covers the memory model's affine reading, pieces._max_units); it
        saves building the memory model of every replica count of a class and TP degree
        that cannot hold a stage at all (GPT-3 175B at TP 1 or 2)."""
        ck = (cls, tp, ends, units)
        hit = self._over.get(ck)
        if hit is None:
            gpu = self.pricer.classes[cls].gpu
            part = replica_memory(self.ctx, gpu, tp, 1, units * self.unit, *ends, self._most_replicas, 0.0)
            state = part.weights_bytes + part.grads_bytes + part.optimizer_bytes + part.workspace_bytes
            hit = self._over[ck] = state > gpu.memory_bytes * (1 + 1e-6)
        return hit

    def _max_units(self, key: OptionKey, s: int) -> int:
        hit = self._fit.get((key, s))
        if hit is None:
            ends = self._ends[s]
            model = self._models.get((key, ends))
            if model is None:
                model = self._models[(key, ends)] = self.pricer.memory_model(self.ctx, self.knobs, key, self.unit, *ends)
            f, d = self._holds[s]
            # the pricer keeps each memory model for its lifetime, so its id names it
            lk = (id(model), f, d, self.L_units)
            hit = self._limits.get(lk)
            if hit is None:
                cap = self.pricer.classes[key.cls].gpu.memory_bytes
                hit = self._limits[lk] = model_units(model, cap, f, d, self.L_units)
            self._fit[(key, s)] = hit
        return hit

    def replicas_of(self, cls: int, tp: int) -> frozenset:
        """The replica counts the tuple has options for on class ``cls`` at TP ``tp``."""
        return self._by_group.get((cls, tp), frozenset())


class _Options:
    """A tuple's options as the rules read them: the set, the replica counts with equal
    shares of B (largest first), the TP degrees, and the replica counts per (class, TP)."""

    def __init__(self, key_list: list, keys: set, micro_batch_size: int):
        self.key_list = key_list        # holds the list alive while its id names it
        self.keys = keys
        self.most_replicas = max((k.replicas for k in keys), default=1)
        self.replicas = sorted({k.replicas for k in keys if micro_batch_size % k.replicas == 0}, reverse=True)
        self.tps = sorted({k.tp for k in keys})
        self.by_group: dict = {}
        for k in keys:
            self.by_group.setdefault((k.cls, k.tp), set()).add(k.replicas)
