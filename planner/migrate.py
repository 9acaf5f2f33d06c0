"""What moving from one plan to another costs: the bytes of weights and optimizer state that
must reach a device which did not hold them before, and how long that takes on the new
cluster's links (``planner replan``'s migration term).

A device holds, per unit of the model it serves (a transformer block, the embedding, the
head), its TP shard of the weights and of the optimizer state; under ZeRO-1 the optimizer
state is further split over the stage's replicas, replica r of R holding the range
[r/R, (r+1)/R) of it.  A weight shard stays put when the device held the same shard before
(same unit, TP degree and TP rank); of the optimizer state, the part of its range the device
held before (same unit, TP degree and rank) stays and the rest moves.  Gradients are not moved: the next
step recomputes them.  Moved bytes come from the nearest device that held the unit in the old
plan and still exists (a data-parallel twin); when none is left (the only copy was on a lost
node) they come from a checkpoint, counted apart and not priced (no link of the cluster says
how fast storage is).

Time: every receiving device pulls its bytes one source after the other over the path
``Topology.p2p`` gives (its share of the node's NICs), all devices at once; the migration
takes the longest device's total.  Senders shared by many receivers are not modelled.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from planner.cost.comm import p2p_time_s
from planner.cost.flops import block_params, embedding_params, head_params
from planner.cost.memory import bytes_per_param
from planner.plan import Plan


@dataclass(frozen=True)
class Migration:
    moved_bytes: float              # weights + optimizer state that change device
    total_bytes: float              # weights + optimizer state of the new plan
    from_checkpoint_bytes: float    # of moved_bytes, those no surviving device held
    time_s: float                   # the longest device's transfers (checkpoint reads not priced)
    moved_devices: int              # devices that receive anything

    @property
    def moved_fraction(self) -> float:
        return self.moved_bytes / self.total_bytes if self.total_bytes > 0 else 0.0

    def as_dict(self) -> dict:
        return {"moved_bytes": self.moved_bytes, "total_bytes": self.total_bytes,
                "moved_fraction": self.moved_fraction, "from_checkpoint_bytes": self.from_checkpoint_bytes,
                "time_s": self.time_s, "devices_receiving": self.moved_devices}


@dataclass(frozen=True)
class Shard:
    """One device's piece of one unit: its TP shard (unit, tp, tp rank), the bytes of its
    weights, and the range of the shard's optimizer state it holds (all of it without ZeRO)."""
    unit: str
    key: tuple
    weights_bytes: float
    optimizer_full_bytes: float             # the whole TP shard's optimizer state
    optimizer_range: tuple[float, float]    # the part of it held here, as fractions
    weights_sharded: bool = False           # ZeRO-3: the weights held are that range of them too

    @property
    def weights_range(self) -> tuple[float, float]:
        return self.optimizer_range if self.weights_sharded else (0.0, 1.0)

    @property
    def optimizer_bytes(self) -> float:
        lo, hi = self.optimizer_range
        return self.optimizer_full_bytes * (hi - lo)


def _units(model, stage) -> list[tuple[str, float]]:
    units = [(f"block{b}", float(block_params(model))) for b in range(*stage.blocks)]
    if stage.embedding:
        units.append(("embedding", float(embedding_params(model))))
    if stage.head:
        units.append(("head", float(head_params(model, with_embedding_on_same_stage=stage.embedding))))
    return units


def shards(plan: Plan, model) -> dict[str, list[Shard]]:
    """device -> the shards it holds under ``plan``."""
    precision = str(plan.inputs.training.get("precision", "bf16"))
    w_pp, _, o_pp = bytes_per_param(precision)
    out: dict[str, list[Shard]] = defaultdict(list)
    cp = plan.context_parallel
    for stage in plan.stages:
        d = plan.shard_replicas(len(stage.replicas))   # HSDP: shard groups of d replicas
        n_rep = d * cp     # ZeRO shards over replicas x cp ranks (of the replica's group)
        units = _units(model, stage)
        for r_i, rep in enumerate(stage.replicas):
            sharded = plan.zero_stage >= 3
            for slot, dev in enumerate(rep.devices):
                # device slot = cp rank x tp + tp rank; ZeRO-1/2 shard the optimizer state over
                # the replicas' cp ranks, ZeRO-3 the weights too (gradients are not moved: they
                # are rebuilt by the next step)
                k = (r_i % d) * cp + slot // rep.tp
                span = (k / n_rep, (k + 1) / n_rep) if plan.zero_stage >= 1 else (0.0, 1.0)
                rank = slot % rep.tp
                for unit, params in units:
                    w = params / rep.tp * w_pp * ((span[1] - span[0]) if sharded else 1.0)
                    out[dev].append(Shard(unit, (unit, rep.tp, rank), w, params / rep.tp * o_pp, span, sharded))
    return out


def migration(old: Plan, new: Plan, model, topo) -> Migration:
    """Moving from ``old`` to ``new`` on the cluster of ``topo`` (planner.topology)."""
    before = shards(old, model)
    held = held_ranges(before)
    holders: dict[str, list[str]] = defaultdict(list)     # unit -> surviving old devices
    for d, ss in before.items():
        if topo.has_device(d):
            for s in ss:
                holders[s.unit].append(d)
    moved = total = from_ckpt = 0.0
    longest_s = 0.0
    receiving = 0
    for dev, ss in shards(new, model).items():
        per_source: dict[str, float] = defaultdict(float)
        got = False
        for s in ss:
            total += s.weights_bytes + s.optimizer_bytes
            need = s.weights_bytes + s.optimizer_bytes - kept_bytes(s, held.get(dev, {}))
            if need <= 1e-9 * (s.weights_bytes + s.optimizer_bytes):
                continue
            moved += need
            got = True
            src = _nearest(topo, dev, [h for h in holders.get(s.unit, []) if h != dev])
            if src is None:
                from_ckpt += need
            else:
                per_source[src] += need
        receiving += got
        dev_s = sum(p2p_time_s(b, topo.p2p(src, dev)) for src, b in sorted(per_source.items()))
        longest_s = max(longest_s, dev_s)
    return Migration(moved, total, from_ckpt, longest_s, receiving)


def held_ranges(by_device: dict[str, list[Shard]]) -> dict[str, dict]:
    """device -> {shard key: (optimizer range, weights range)}, what ``kept_bytes`` reads."""
    return {d: {s.key: (s.optimizer_range, s.weights_range) for s in ss} for d, ss in by_device.items()}


def kept_bytes(shard: Shard, held: dict) -> float:
    """The bytes of ``shard`` a device already holds, ``held`` being its old shards' ranges."""
    if shard.key not in held:
        return 0.0
    old_opt, old_w = held[shard.key]
    (w_lo, w_hi) = shard.weights_range
    full_weights = shard.weights_bytes / (w_hi - w_lo)
    return (full_weights * _overlap(shard.weights_range, old_w)
            + shard.optimizer_full_bytes * _overlap(shard.optimizer_range, old_opt))


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def _nearest(topo, dev: str, candidates: list[str]) -> str | None:
    """The surviving holder with the fastest path to ``dev`` (ties: the first in name order)."""
    if not candidates:
        return None
    return min(sorted(set(candidates)), key=lambda c: (-topo.p2p(c, dev).bandwidth_Bps, topo.p2p(c, dev).latency_s))
