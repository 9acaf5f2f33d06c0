"""The declared plan space's pricing into CoreProblems (docs/search-space.md).

A *knob* tuple (knobs.py) fixes the global choices (logical micro-batch size B and count m,
schedule with its virtual stages, recompute, ZeRO stage, number of stages p).  For each, every stage
option ``(node class, tp, replicas n)`` is priced with the cost model's own pure functions
(``replica_compute``, ``replica_memory``, ``dp_sync_time_s``, ``optimizer_time_s``,
``p2p_time_s``) on representative devices of its class, so the CoreProblem's objective is
``planner.cost`` 's iteration time for the plan that naming.py builds.  Everything per stage
is affine in its block count (identical blocks), which the core relies on; we measure the
slope and intercept at two block counts and re-check memory at the chosen limit.
"""

from __future__ import annotations

from planner.cost import (
    CostContext,
    dp_sync_time_s,
    optimizer_time_s,
    replica_compute,
    replica_memory_bytes,
    stage_params,
)
from planner.cost.comm import exposed_sync_parts
from planner.cost.hsdp import is_hsdp
from planner.cost.memory import logits_in_flight, stage_holds, w_input_grad_bytes
from planner.cost.moe import ep_sync_s, optimizer_params, option_ep_comm
from planner.search.classes import ClassInfo
from planner.search.core import CoreOption, CoreProblem, Row
from planner.search.knobs import Knobs, OptionKey, pipeline_rows, tp_degrees
from planner.search.mixed import StandIn, key_of, mixed_keys, mixed_options
from planner.search.option_lines import OptionLines, _experts, zero_shard
from planner.search.pieces import _busiest_points, _max_units, model_units, replica_counts, shares  # noqa: F401
from planner.search.schedules import SCHEDULES
from planner.search.sends import SendPricing
from planner.search.slots import POSITIONS, Quantity, per_quantity


def _affine(f, unit: int) -> tuple[float, float]:
    """(slope, intercept) per core unit of a function affine in blocks for blocks >= 1."""
    a, b = f(unit), f(2 * unit)
    return b - a, a - (b - a)


class Pricer(OptionLines, SendPricing):
    """Prices the options of one knob tuple; topology paths are cached across knob tuples."""

    def __init__(self, model, training, classes: list[ClassInfo], topology, profiles=None):
        self.model, self.training, self.classes, self.topo = model, training, classes, topology
        self.profiles = profiles
        self._rings: dict = {}
        self._paths: dict = {}
        self._bases: dict = {}
        self._sends: dict = {}
        self._keys: dict = {}
        self._fb: dict = {}
        self._opt: dict = {}
        self._syncs: dict = {}
        self._memory: dict = {}
        self._contexts: dict = {}       # id -> context: kept alive, so cache keys by id stay unique
        self._mixed_sends: dict = {}
        self._mixed_positions: dict = {}
        self._stand_ins: dict = {}
        self._pure: dict = {}
        self.floor_terms: dict = {}     # floors.tuple_floors: each option's price and work terms

    def cache_id(self, ctx) -> int:
        """The context's id for cache keys; the pricer holds the context so the id is not reused."""
        return id(self._contexts.setdefault(id(ctx), ctx))

    def option_keys(self, knobs: Knobs) -> list[OptionKey]:
        ck = (knobs.micro_batch_size, knobs.context_parallel, knobs.expert_parallel, knobs.zero_shard_degree)
        hit = self._keys.get(ck)
        if hit is None:
            hit = self._keys[ck] = self._option_keys(knobs)
        return hit

    def stand_ins(self, knobs: Knobs) -> list[StandIn]:
        """The mixed stages of the tuple's B (``training.mixed_stages``), as the bounds see
        them (mixed.StandIn); pricing turns them back into mixed core options."""
        if (not self.training.mixed_stages or knobs.context_parallel > 1 or knobs.expert_parallel > 1
                or knobs.zero_shard_degree is not None):
            return []   # mixed stages are searched without context or expert parallelism, or HSDP
        hit = self._stand_ins.get(knobs.micro_batch_size)
        if hit is None:
            hit = self._stand_ins[knobs.micro_batch_size] = [
                StandIn(k) for k in mixed_keys(self.model, self.training, self.classes, knobs.micro_batch_size,
                                               tp_degrees)]
        return hit

    def pure_part(self, keys: list) -> list[OptionKey]:
        """``keys`` without the mixed stages' stand-ins, one list per list (the bounds cache
        by the list's id)."""
        hit = self._pure.get(id(keys))
        if hit is None or hit[0] is not keys:
            pure = [k for k in keys if isinstance(k, OptionKey)]
            hit = self._pure[id(keys)] = (keys, keys if len(pure) == len(keys) else pure)
        return hit[1]

    def _option_keys(self, knobs: Knobs) -> list[OptionKey]:
        allowed_q = set(self.training.micro_batch_sizes or ())
        cp = knobs.context_parallel
        keys = []
        for info in self.classes:
            for t in tp_degrees(self.model, info, self.training.max_tp):
                w = t * cp      # a replica's GPUs, inside one node
                if w > info.gpus_per_node:
                    continue
                for n in replica_counts(knobs.micro_batch_size):
                    if n > info.max_replicas(w) or info.units(w, n) > info.capacity_units:
                        continue
                    if n % knobs.expert_parallel:   # whole expert groups (cost/moe.py)
                        continue
                    if knobs.zero_shard_degree is not None and n % knobs.zero_shard_degree:
                        continue    # whole HSDP shard groups (the plan's zero_shard_degree divides n)
                    if allowed_q and -(-knobs.micro_batch_size // n) not in allowed_q:
                        continue
                    keys.append(OptionKey(info.index, t, n, cp))
        return keys

    def ring(self, key: OptionKey):
        hit = self._rings.get(key)
        if hit is None:
            info = self.classes[key.cls]
            # one member per cp rank of each replica (its first tp GPU), as evaluate's ring
            devs = tuple(r[c * key.tp] for r in info.replica_devices(key.width, key.replicas)
                         for c in range(key.cp))
            hit = self._rings[key] = self.topo.ring(devs, concurrent_rings=key.tp)
        return hit

    def mixed_ring(self, key):
        """The gradient ring of a mixed stage (mixed.py): kind a's replicas, then kind b's,
        each packed from its class's first node, at the smaller TP."""
        hit = self._rings.get(key)
        if hit is None:
            devs = tuple(r[0] for k in key.kinds
                         for r in self.classes[k.cls].replica_devices(k.tp, k.replicas))
            hit = self._rings[key] = self.topo.ring(devs, concurrent_rings=key.min_tp)
        return hit

    def price(self, knobs: Knobs, ctx: CostContext, keys: list[OptionKey] | None = None,
              sends: bool = True) -> CoreProblem:
        """The tuple's CoreProblem on ``keys``: options, and mixed stages as their stand-ins,
        keys or core labels (mixed.py); ``sends=False``: without the pipeline sends (no
        boundary table, rows without send terms): a relaxation, whose optimum bounds the
        tuple's from below (sends are >= 0 with non-negative coefficients)."""
        keys = self.option_keys(knobs) if keys is None else keys
        mixed = list(dict.fromkeys(key_of(k) for k in keys if not isinstance(k, OptionKey)))
        keys = [k for k in keys if isinstance(k, OptionKey)]
        p, _m, _B = knobs.num_stages, knobs.num_micro_batches, knobs.micro_batch_size
        unit = knobs.block_unit
        L_units = self.model.num_layers // unit
        options = []
        for key in keys:
            opt = self._option(ctx, knobs, key, unit, L_units)
            if opt is not None:
                options.append(opt)
        for key in mixed:
            options.extend(mixed_options(self, ctx, knobs, key, unit, L_units))
        boundary = self._boundary(ctx, knobs, options) if p > 1 and options and sends else None
        rows, terms = pipeline_rows(knobs)
        if not sends:
            rows = [Row(stage=r.stage, hinges=r.hinges) for r in rows]
        res_price = []
        for info in self.classes:
            price = info.node_price_usd_per_hour
            res_price.append((price or 0.0) if info.shared_node else 0.0)
        return CoreProblem(num_blocks=L_units, num_stages=p, capacity=[c.capacity_units for c in self.classes],
                           options=options, rows=rows, terms=terms, boundary=boundary,
                           wrap=SCHEDULES[knobs.schedule].wraps and p > 1, resource_price=res_price)

    def _base(self, ctx, knobs, key: OptionKey, unit: int, emb: bool, head: bool, timing_only: bool = False):
        """Per (knobs without p, option, end flags): quantity slopes/intercepts per core unit and
        the memory model mem(u, f) = c0 + c1 u + f (c2 + c3 u) in units u and in-flight f
        (weights/grads/optimizer are affine in blocks, activations blocks x in-flight)."""
        ck = (self.cache_id(ctx), knobs.micro_batch_size, key, unit, emb, head)
        hit = self._bases.get(ck)
        if hit is not None and (timing_only or hit[2] is not None):
            return hit
        info = self.classes[key.cls]
        gpu, intra, t, n = info.gpu, info.node_class.intra_Bps, key.tp, key.replicas
        share = -(-knobs.micro_batch_size // n)
        ring = self.ring(key) if key.ranks > 1 else None
        shard = zero_shard(ctx, key)
        hsdp = is_hsdp(ctx, n)

        devices = info.replica_devices(t, n) if ctx.expert_parallel > 1 else None

        def quantities(nb: int) -> tuple[float, ...]:
            rt = replica_compute(ctx, gpu, intra, t, share, nb, emb, head)
            params, experts = stage_params(ctx, nb, emb, head), _experts(ctx, nb)
            fwd, bwd = rt.total_forward_s, rt.total_backward_s
            replicate = 0.0
            if experts:   # expert parallelism (cp is 1 then): all-to-alls, experts' sync over n/ep (cost/moe.py)
                ep_f, ep_b = option_ep_comm(ctx, self.topo, devices, shares(knobs.micro_batch_size, n), t, nb, gpu)
                fwd, bwd = fwd + ep_f, bwd + ep_b
                dp = ep_sync_s(ctx, self.topo, [d[0] for d in devices], t, params, experts, gpu)
            elif hsdp:   # shard groups' collectives and the all-reduce across them (cost/hsdp.py)
                hs = self.hsdp(ctx, key, params)
                dp, replicate = hs.total_s, hs.replicate_s   # the all-reduce is backward-side whole
            else:
                dp = (dp_sync_time_s(ctx, params, key.ranks, t, ring.bandwidth_Bps, ring.latency_s, ring.kind, gpu)
                      if ring else 0.0)
            rs, ag = exposed_sync_parts(ctx, dp, fwd, bwd, replicate)
            return per_quantity(forward=fwd, backward=bwd, sync_less_backward=rs, gather_less_forward=ag,
                                optimizer=optimizer_time_s(ctx, gpu, optimizer_params(ctx, params, experts, t, shard)),
                                backward_input=0.0)     # set below, from the W's own lines

        if hit is None:
            q1, q2 = quantities(unit), quantities(2 * unit)
            sl = tuple(b - a for a, b in zip(q1, q2))
            fx = tuple(a - d for a, d in zip(q1, sl))
            # the input part of the backward, I = backward - W (zero-bubble schedules)
            w_slope, w_icpt = self.weight_lines(ctx, key.cls, t, share, unit)
            sl, fx = list(sl), list(fx)
            sl[Quantity.BACKWARD_INPUT] = sl[Quantity.BACKWARD] - w_slope
            fx[Quantity.BACKWARD_INPUT] = fx[Quantity.BACKWARD] - float(w_icpt[POSITIONS.index((emb, head))])
            sl, fx = tuple(sl), tuple(fx)
        else:
            sl, fx = hit[0], hit[1]
        if timing_only:
            hit = self._bases[ck] = (sl, fx, None, None, None)
            return hit

        coef, exact, mem = self.memory_model(ctx, knobs, key, unit, emb, head)
        hit = self._bases[ck] = (sl, fx, coef, exact, mem)
        return hit

    def memory_model(self, ctx, knobs, key: OptionKey, unit: int, emb: bool, head: bool):
        """(c0..c4, exact, mem) with mem(u, f, d) = c0 + c1 u + f (c2 + c3 u) + c4 u d bytes for
        u units of blocks, f micro-batches in flight and d of them waiting for their W
        (memory.deferred_w_micro_batches; d's term is exact by construction); ``exact`` when a third point agrees (else the
        callers settle limits with ``mem`` itself).  Apart from ``_base`` so that the knob
        bound reads memory without pricing the timings."""
        info = self.classes[key.cls]
        gpu, t, n = info.gpu, key.tp, key.replicas
        # a stand-in (mixed.py): its primary kind's replica, ZeRO-sharded over the whole stage
        share = key.primary.share if isinstance(key, StandIn) else -(-knobs.micro_batch_size // n)
        # the memory reads the replicas only through ZeRO's optimizer shards: options of any
        # micro-batch size with the same share of it have the same model
        logits = logits_in_flight(knobs.schedule) if head else None
        ck = (self.cache_id(ctx), gpu.name, t, share, n if ctx.zero_stage >= 1 else 0, unit, emb, head, logits)
        hit = self._memory.get(ck)
        if hit is not None:
            return hit

        def mem(u: int, f: float, d: float = 0.0) -> float:
            return replica_memory_bytes(ctx, gpu, t, share, u * unit, emb, head, n, f, logits, d)

        m11, m21, m12, m22 = mem(1, 1.0), mem(2, 1.0), mem(1, 2.0), mem(2, 2.0)
        c3 = (m22 - m12) - (m21 - m11)
        c1 = (m21 - m11) - c3
        c2 = (m12 - m11) - c3
        c0 = m11 - c1 - c2 - c3
        probe = mem(3, 3.0)
        exact = abs(c0 + 3 * c1 + 3 * (c2 + 3 * c3) - probe) <= 1e-9 * probe
        c4 = unit * w_input_grad_bytes(ctx, t, share)
        hit = self._memory[ck] = ((c0, c1, c2, c3, c4), exact, mem)
        return hit

    def _option(self, ctx, knobs, key: OptionKey, unit: int, L_units: int) -> CoreOption | None:
        info = self.classes[key.cls]
        p, m, v = knobs.num_stages, knobs.num_micro_batches, knobs.virtual_stages
        cap = info.gpu.memory_bytes
        slope = None
        fixed: list[tuple[float, ...] | None] = []
        max_blocks: list[int] = []
        entry = SCHEDULES[knobs.schedule]
        bases: dict = {}        # per (embedding, head): at most four however long the pipeline
        for s in range(p):
            ends = entry.stage_ends(p, s)
            base = bases.get(ends)
            if base is None:
                base = bases[ends] = self._base(ctx, knobs, key, unit, *ends)
            sl, fx, coef, exact, mem = base
            slope = slope or sl
            hi = model_units((coef, exact, mem), cap, *stage_holds(knobs.schedule, p, s, m, v), L_units)
            fixed.append(fx if hi >= 1 else None)
            max_blocks.append(hi)
        if not any(max_blocks):
            return None
        return CoreOption(resource=key.cls, units=info.units(key.width, key.replicas), slope=slope, fixed=fixed,
                          max_blocks=max_blocks, price_usd_per_hour=info.option_price(key.width, key.replicas),
                          label=key)
