"""Mixed stages: one stage whose replicas come from two node classes of one zone, each class
with its own TP degree and its own micro-batch share (docs/search-space.md, "Mixed stages").

A mixed stage holds ``n_a`` replicas of kind a (class, tp, share ``s_a``) and ``n_b`` of kind b,
with ``n_a s_a + n_b s_b = B``.  Its forward and backward are its slowest replica's (by total
time, ties to kind a, which naming lists first, as ``planner.cost.evaluate`` reads them); the
slowest kind can change with the block count, so one mixed key becomes one core option per
block range where the slowest kind (and the optimizer's slowest kind) stays the same
(``CoreOption.min_blocks`` / ``max_blocks`` per position).  Its gradient sync is one ring over
all replicas at the smaller TP; its optimizer step the slower kind's; every replica must fit in
memory with its own share.

The declared mixed stages (``mixed_keys``): two classes of one zone, any TP degree each; per
kind 1, 2, 4, ... whole nodes (GPU slices of a one-node class); and for each pair of replica
counts the splits of B nearest, from each side, to the kinds' ratio of peak FLOP/s (tp x GPU
peak), so a fast kind takes more sequences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost import (
    dp_sync_time_s,
    optimizer_time_s,
    replica_compute,
    replica_memory_bytes,
    stage_params,
)
from planner.cost.comm import exposed_sync_parts
from planner.cost.compute import backward_weight_s
from planner.cost.memory import logits_in_flight, stage_holds
from planner.search.core import CoreOption
from planner.search.pieces import _max_units
from planner.search.schedules import SCHEDULES
from planner.search.slots import per_quantity


@dataclass(frozen=True)
class Kind:
    """``replicas`` replicas of ``tp`` GPUs of class ``cls``, ``share`` sequences each."""
    cls: int
    tp: int
    replicas: int
    share: int

    def units_in(self, classes) -> int:
        return classes[self.cls].units(self.tp, self.replicas)


@dataclass(frozen=True)
class MixedKey:
    a: Kind             # listed first in the plan (its GPU prices the ring, it wins ties)
    b: Kind

    @property
    def kinds(self) -> tuple[Kind, Kind]:
        return (self.a, self.b)

    @property
    def cls(self) -> int:
        return self.a.cls

    @property
    def replicas(self) -> int:
        return self.a.replicas + self.b.replicas

    @property
    def min_tp(self) -> int:
        return min(self.a.tp, self.b.tp)

    def uses(self, classes) -> tuple[tuple[int, int], ...]:
        """(class, units) of each kind, kind a first."""
        return tuple((k.cls, k.units_in(classes)) for k in self.kinds)


@dataclass(frozen=True)
class MixedPiece:
    """A core option's label: the mixed key over one block range (``piece`` numbers them)."""
    key: MixedKey
    piece: int

    @property
    def cls(self) -> int:
        return self.key.cls


def key_of(label):
    """The mixed key behind a core option's label or a stand-in; anything else as it is."""
    return label.key if isinstance(label, (MixedPiece, StandIn)) else label


def _splits(B: int, na: int, nb: int, ratio: float) -> list[tuple[int, int]]:
    """Shares (s_a, s_b) >= 1 with na s_a + nb s_b = B nearest to s_a / s_b = ratio from below
    and from above (one when it is exact)."""
    sols = [((B - nb * sb) // na, sb) for sb in range(1, B // nb + 1)
            if B - nb * sb >= na and (B - nb * sb) % na == 0]
    below = [s for s in sols if s[0] <= ratio * s[1]]
    above = [s for s in sols if s[0] >= ratio * s[1]]
    out = []
    if below:
        out.append(max(below, key=lambda s: s[0] / s[1]))
    if above:
        out.append(min(above, key=lambda s: s[0] / s[1]))
    return list(dict.fromkeys(out))


def kind_counts(info, tp: int, most: int) -> list[int]:
    """The declared replica counts of one kind: whole nodes in a class of several nodes (a
    stage holds its nodes whole, so a part-filled node only idles GPUs), 1, 2, 4, 8, ... nodes
    (or GPU slices of a one-node class); at most ``most``."""
    per_node = info.gpus_per_node // tp
    step, limit = (1, per_node) if info.shared_node else (per_node, info.node_class.count)
    out, u = [], 1
    while u <= limit and u * step <= most:
        out.append(u * step)
        u *= 2
    return out


def class_pairs(classes) -> list[tuple]:
    """The pairs of classes a mixed stage may join: two of one zone, the first the earlier in
    the topology's class order."""
    return [(ia, ib) for ia in classes for ib in classes if ib.index > ia.index and ib.zone == ia.zone]


def mixed_keys(model, training, classes, B: int, tp_degrees) -> list[MixedKey]:
    """The declared mixed stages for a micro-batch of B sequences (the search and the oracle
    share this definition).  ``tp_degrees(model, info, max_tp)`` as in space.py."""
    allowed_q = set(training.micro_batch_sizes or ())
    out = []
    for ia, ib in class_pairs(classes):
        for ta in tp_degrees(model, ia, training.max_tp):
            for tb in tp_degrees(model, ib, training.max_tp):
                ratio = (ia.gpu.peak_flops_for(training.precision) * ta) / (
                    ib.gpu.peak_flops_for(training.precision) * tb)
                for na in kind_counts(ia, ta, B - 1):
                    for nb in kind_counts(ib, tb, B - na):
                        for sa, sb in _splits(B, na, nb, ratio):
                            if allowed_q and (sa not in allowed_q or sb not in allowed_q):
                                continue
                            out.append(MixedKey(Kind(ia.index, ta, na, sa), Kind(ib.index, tb, nb, sb)))
    return out


def mixed_options(pricer, ctx, knobs, key: MixedKey, unit: int, L_units: int) -> list[CoreOption]:
    """The core options of ``key`` in this knob tuple: one per block range over which the
    slowest kind (compute; optimizer step) is the same at every stage position."""
    p, m, v = knobs.num_stages, knobs.num_micro_batches, knobs.virtual_stages
    classes = pricer.classes
    infos = [classes[k.cls] for k in key.kinds]
    n = key.replicas
    shard = n if knobs.zero_stage >= 1 else 1
    curves, caps = [], []          # per stage position: its curves (shared by the ends' kinds), its memory limit
    for s in range(p):
        emb, head = SCHEDULES[knobs.schedule].stage_ends(p, s)   # a V: the head on rank 0
        ck = (pricer.cache_id(ctx), key, unit, L_units, emb, head)
        hit = pricer._mixed_positions.get(ck)
        if hit is None:
            hit = pricer._mixed_positions[ck] = _position_curves(ctx, key, infos, unit, L_units, emb, head, shard,
                                                                 pricer.mixed_ring(key) if n > 1 else None)
        curves.append(hit)
        f, d = stage_holds(knobs.schedule, p, s, m, v)
        logits = logits_in_flight(knobs.schedule) if head else None
        caps.append(min(_kind_units(ctx, info, k, n, unit, (emb, head), (f, logits, d), L_units)
                        for k, info in zip(key.kinds, infos)))
    # block ranges with one (slowest kind, optimizer's kind) per position
    ranges: dict[tuple[int, int], list] = {}
    for s, c in enumerate(curves):
        tag = c.slow * 2 + c.opt_slow
        start = 0
        for i in range(1, L_units + 1):
            if i == L_units or tag[i] != tag[start]:
                ranges.setdefault((s, int(tag[start])), []).append((start + 1, i))
                start = i
    pieces = sorted({(t, j) for (s, t), rs in ranges.items() for j in range(len(rs))})
    out = []
    for t, j in pieces:
        opt = _piece(ctx, key, classes, curves, caps, [ranges.get((s, t), []) for s in range(p)], t, j)
        if opt is not None:
            opt.label = MixedPiece(key, len(out))
            out.append(opt)
    return out


@dataclass(frozen=True)
class _Curves:
    """One stage position of a mixed stage, at every block count 1..L (arrays [kinds, L]):
    each kind's forward and backward, which kind is slowest (compute; the optimizer step,
    [L]), the kinds' optimizer steps, the ring's sync ([L])."""
    forward: np.ndarray
    backward: np.ndarray
    slow: np.ndarray
    opt_slow: np.ndarray
    optimizer: np.ndarray
    sync: np.ndarray
    backward_input: np.ndarray     # each kind's backward less its W ([kinds, L]; zero-bubble schedules)


def _position_curves(ctx, key, infos, unit, L_units, emb, head, shard, ring) -> _Curves:
    nbs = range(1, L_units + 1)
    rts = [[replica_compute(ctx, info.gpu, info.node_class.intra_Bps, k.tp, k.share, u * unit, emb, head)
            for u in nbs] for k, info in zip(key.kinds, infos)]
    totals = np.array([[r.total_s for r in row] for row in rts])
    params = [stage_params(ctx, u * unit, emb, head) for u in nbs]
    opts = np.array([[optimizer_time_s(ctx, info.gpu, q / k.tp / shard) for q in params]
                     for k, info in zip(key.kinds, infos)])
    dp = np.array([dp_sync_time_s(ctx, q, key.replicas, key.min_tp, ring.bandwidth_Bps, ring.latency_s, ring.kind,
                                  infos[0].gpu) if ring else 0.0 for q in params])
    weights = np.array([[backward_weight_s(ctx, info.gpu, info.node_class.intra_Bps, k.tp, k.share, u * unit, emb, head)
                         for u in nbs] for k, info in zip(key.kinds, infos)])
    backward = np.array([[r.total_backward_s for r in row] for row in rts])
    return _Curves(forward=np.array([[r.total_forward_s for r in row] for row in rts]),
                   backward=backward, backward_input=backward - weights,
                   slow=np.where(totals[1] > totals[0], 1, 0),      # evaluate: ties to the replica listed first
                   opt_slow=np.where(opts[1] > opts[0], 1, 0), optimizer=opts, sync=dp)


def _piece(ctx, key, classes, curves: list[_Curves], caps: list[int], ranges: list[list], tag: int,
           j: int) -> CoreOption | None:
    """The core option of the ``j``-th block range, per position, where the kinds' tag
    (slowest kind x 2 + the optimizer's slowest kind) is ``tag``; None where it has none."""
    slow_kind, opt_kind = tag // 2, tag % 2
    slope = None
    fixed, lo_b, hi_b = [], [], []
    for c, cap, rs in zip(curves, caps, ranges):
        if j >= len(rs) or min(rs[j][1], cap) < rs[j][0]:
            fixed.append(None), lo_b.append(0), hi_b.append(0)
            continue
        fwd, bwd = c.forward[slow_kind], c.backward[slow_kind]
        rsync, ag = exposed_sync_parts(ctx, c.sync, fwd, bwd)
        q = np.stack(per_quantity(forward=fwd, backward=bwd, sync_less_backward=rsync, optimizer=c.optimizer[opt_kind],
                                  gather_less_forward=ag, backward_input=c.backward_input[slow_kind]),
                     axis=1)                                                           # [L_units, quantities]
        # every per-stage quantity is affine in the block count: take the line from the
        # whole curve (two points), the range only selects where it applies
        sl = q[1] - q[0] if len(q) >= 2 else np.zeros(q.shape[1])
        if slope is None:
            slope = tuple(float(x) for x in sl)
        fixed.append(tuple(float(x) for x in q[0] - sl))
        lo_b.append(rs[j][0])
        hi_b.append(min(rs[j][1], cap))
    if slope is None:
        return None
    (cls_a, units_a), extra = key.uses(classes)
    return CoreOption(resource=cls_a, units=units_a, extra_uses=(extra,), slope=slope, fixed=fixed,
                      max_blocks=hi_b, min_blocks=lo_b,
                      price_usd_per_hour=sum(classes[k.cls].option_price(k.tp, k.replicas) for k in key.kinds))


def _kind_units(ctx, info, kind: Kind, n: int, unit: int, ends: tuple[bool, bool], in_flight: tuple,
                L_units: int) -> int:
    """Most block units a replica of ``kind`` fits with ``in_flight`` = (micro-batches, the
    head's logits where they differ: memory.logits_in_flight, those waiting for their W:
    memory.deferred_w_micro_batches) in flight at a stage of ``ends``."""
    def mem(u: int) -> float:
        return replica_memory_bytes(ctx, info.gpu, kind.tp, kind.share, u * unit, *ends, n, *in_flight)
    base = mem(1)
    per_u = mem(2) - base
    return _max_units(info.gpu.memory_bytes, base - per_u, per_u, False, mem, L_units)


@dataclass(frozen=True)
class StandIn:
    """A mixed key as the knob bounds see it (bound.py, packed.py, floors.py): an option of
    its primary kind's class (the kind with more sequences) that rents only that kind's
    nodes, whose lines are at most the stage's (``Pricer._stand_in_lines``), with no
    gradient sync, the primary kind's memory, and sends priced over both kinds' paths
    (``packed.partner_sends``).  Each is at most what the mixed stage has, so any plan with
    mixed stages maps to a plan over stand-ins that every bound level bounds from below.
    Its other kind's units (``extra_units_in``) are charged to that class where the bounds
    read capacities as sums (the class speed cap, the max-row bound, the position LPs); the
    knapsacks of whole options leave them out, which only lowers what they say.
    ``replicas`` is the whole stage's: no share is below ``ceil(B / replicas)``, which is
    all the send floors read of it."""
    key: MixedKey

    @property
    def primary(self) -> Kind:
        a, b = self.key.kinds
        return b if b.replicas * b.share > a.replicas * a.share else a

    @property
    def cls(self) -> int:
        return self.primary.cls

    @property
    def tp(self) -> int:
        return self.primary.tp

    @property
    def replicas(self) -> int:
        return self.key.replicas

    @property
    def send_groups(self) -> tuple[tuple[int, int], ...]:
        return tuple(dict.fromkeys((k.cls, k.tp) for k in self.key.kinds))

    def units_in(self, classes) -> int:
        return self.primary.units_in(classes)

    def extra_units_in(self, classes) -> tuple[tuple[int, int], ...]:
        """The other kind's units: the position LPs (packed.py) charge them to its class."""
        k = self.key.b if self.primary is self.key.a else self.key.a
        return ((k.cls, k.units_in(classes)),)

    def rent_share_in(self, classes) -> float:
        k = self.primary
        return classes[k.cls].rent_share(k.tp, k.replicas)

    def least_rent_in(self, classes) -> float:
        k = self.primary
        return classes[k.cls].least_rent(k.tp, k.replicas)

    def full_least_rent(self, classes) -> float:
        """What any plan with this stage rents at least (the budget filter): both kinds'."""
        return sum(classes[k.cls].least_rent(k.tp, k.replicas) for k in self.key.kinds)
