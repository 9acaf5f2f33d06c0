"""The knob tuples of the plan space (docs/search-space.md, "The space"): the global choices
one search enumerates (``Knobs``: micro-batch size and count, schedule, recompute, ZeRO,
stages, cp / ep / HSDP degrees), a stage option's key (``OptionKey``: class, TP, replicas), the
cost context a tuple is priced in, and its schedule's core rows.  Pricing a tuple's options is
space.py's ``Pricer``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from planner.cost import CostContext
from planner.errors import InputError
from planner.search.classes import ClassInfo
from planner.search.core import Row, Term
from planner.search.schedules import SCHEDULES, schedules_for

INTERLEAVE_V = 2            # virtual stages tried for interleaved-1f1b


@dataclass(frozen=True)
class Knobs:
    micro_batch_size: int       # B: sequences of one logical micro-batch (sum of a stage's shares)
    num_micro_batches: int      # m = global batch / B
    schedule: str
    virtual_stages: int
    recompute: str
    zero_stage: int
    num_stages: int
    reshard_after_forward: bool = True     # ZeRO-3 only (FSDP2); True for the other stages
    context_parallel: int = 1              # cp: every replica is tp x cp GPUs (ring attention)
    expert_parallel: int = 1               # MoE: replicas per expert group (planner.cost.moe)
    zero_shard_degree: int | None = None   # HSDP: replicas per ZeRO shard group (cost/hsdp.py); None: all

    @property
    def block_unit(self) -> int:
        """Blocks per core unit: interleaving needs each stage's blocks to split into v chunks."""
        return SCHEDULES[self.schedule].block_unit()

    def label(self) -> str:
        v = f"x{self.virtual_stages}" if self.schedule == "interleaved-1f1b" else ""
        return (f"p={self.num_stages} B={self.micro_batch_size} m={self.num_micro_batches} "
                f"{self.schedule}{v} rc={self.recompute} zero={self.zero_stage}"
                + ("" if self.reshard_after_forward else " no-reshard")
                + (f" cp={self.context_parallel}" if self.context_parallel > 1 else "")
                + (f" ep={self.expert_parallel}" if self.expert_parallel > 1 else "")
                + (f" hsdp={self.zero_shard_degree}" if self.zero_shard_degree is not None else ""))


@dataclass(frozen=True)
class OptionKey:
    cls: int
    tp: int
    replicas: int
    cp: int = 1     # the knob tuple's context-parallel degree: a replica is tp x cp GPUs

    @property
    def width(self) -> int:
        """GPUs per replica: tp x cp (what the class's packing and prices count)."""
        return self.tp * self.cp

    @property
    def ranks(self) -> int:
        """Ranks holding each weight: replicas x cp (the gradient reduction and ZeRO's shards)."""
        return self.replicas * self.cp

    @property
    def send_groups(self) -> tuple[tuple[int, int], ...]:
        """The (class, TP) pairs whose paths its sends take (mixed.StandIn: two)."""
        return ((self.cls, self.tp),)

    def units_in(self, classes) -> int:
        return classes[self.cls].units(self.width, self.replicas)

    def uses(self, classes) -> tuple[tuple[int, int], ...]:
        """(class, units) it takes (mixed.MixedKey: one pair per kind)."""
        return ((self.cls, self.units_in(classes)),)

    def extra_units_in(self, classes) -> tuple[tuple[int, int], ...]:
        """(class, units) it also takes from other classes: none (mixed.StandIn: one)."""
        return ()

    def rent_share_in(self, classes) -> float:
        return classes[self.cls].rent_share(self.width, self.replicas)

    def least_rent_in(self, classes) -> float:
        return classes[self.cls].least_rent(self.width, self.replicas)

    full_least_rent = least_rent_in


def tp_degrees(model, info: ClassInfo, max_tp: int) -> list[int]:
    out, t = [], 1
    while t <= min(info.gpus_per_node, max_tp):
        if model.num_attention_heads % t == 0 and model.kv_heads % t == 0:
            out.append(t)
        t *= 2
    return out


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending (by trial up to sqrt(n): a global batch of 10^9 sequences
    must not take a minute to split)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def check_expert_degrees(model, training) -> None:
    """A MoE model whose allowed EP degrees all fail to divide its experts is an input error:
    the search dropped them and searched EP 1, which was not allowed, so `--expert-parallel 3`
    on Mixtral's 8 experts answered a plan without expert parallelism and no word (found by
    scripts/fuzz_plans.py).  Some degrees dividing is a narrower space, as for TP; dense models
    take no EP, so the degrees are moot there."""
    if not model.is_moe or any(model.num_experts % e == 0 for e in training.expert_parallel_degrees):
        return
    asked = ",".join(map(str, training.expert_parallel_degrees))
    valid = ", ".join(map(str, divisors(model.num_experts)))
    raise InputError(f"expert_parallel_degrees (--expert-parallel {asked}): none divides the number of "
                     f"experts ({model.name} has {model.num_experts}); choose among {valid}")


def enumerate_knobs(model, training, classes: list[ClassInfo], launcher: str | None = None) -> list[Knobs]:
    """Every knob tuple of the space; with ``launcher``, only the schedules it can run
    (schedules.py: Megatron-LM and DeepSpeed cannot run zb-h1) and the ZeRO settings it can
    (DeepSpeed: ZeRO-2/3 on one stage only; Megatron-LM: ZeRO-3 resharding after forward)."""
    gbs, L = training.global_batch_size, model.num_layers
    total_units = sum(c.capacity_units for c in classes)
    max_p = min(L, training.max_stages or L, total_units if all(c.shared_node for c in classes) else 10**9)
    max_p = min(max_p, sum(c.node_class.num_gpus for c in classes))
    out = []
    # EP: MoE models only, a degree dividing the experts; DeepSpeed has no config for it
    eps = [e for e in training.expert_parallel_degrees
           if model.is_moe and model.num_experts % e == 0 and (e == 1 or launcher != "deepspeed")] or [1]
    cps = context_degrees(training, launcher)
    node_counts = {cp: per_node(model, training, classes, cp) for cp in cps}
    # a tuple's parallel degrees (cp, then ep and HSDP's shard degree) depend on its ZeRO stage
    # alone: built once per stage.  CP and EP are searched apart: one of the two is 1 in a tuple
    degrees = {z: [(cp, [(e, d) for e in eps if cp == 1 or e == 1
                         for d in shard_degrees(training, z, e, launcher, node_counts[cp])])
                   for cp in cps]
               for z in training.zero_stages}
    for B in divisors(gbs):
        m = gbs // B
        for entry in schedules_for(training, launcher):
            v = entry.virtual_stages
            for rc in training.recompute_modes:
                for z in training.zero_stages:
                    # reshard_after_forward is a ZeRO-3 knob: the other stages take one value
                    for rs in (training.reshard_after_forward if z == 3 else (True,)):
                        if launcher == "megatron" and z == 3 and not rs:
                            continue    # Megatron FSDP cannot keep gathered weights (launch/megatron.py)
                        for cp, combos in degrees[z]:
                            for p in range(1, max_p + 1):
                                if not entry.admits(p, m, L):
                                    continue
                                if launcher == "deepspeed" and z >= 2 and p > 1:
                                    continue    # DeepSpeed's PipelineEngine refuses ZeRO-2/3 (launch/deepspeed.py)
                                out += [Knobs(B, m, entry.name, v, rc, int(z), p, bool(rs), cp, e, d)
                                        for e, d in combos]
    return out

def shard_degrees(training, zero_stage: int, ep: int, launcher: str | None = None,
                  node_counts: tuple[int, ...] = ()) -> tuple[int | None, ...]:
    """HSDP's shard-group sizes to try (``training.zero_shard_degrees``, None for "all",
    "node" as ``node_counts``): only with ZeRO, without expert parallelism (the plan refuses
    the pair), and not for DeepSpeed (launch/deepspeed.py refuses HSDP)."""
    if zero_stage == 0 or ep > 1 or launcher == "deepspeed" or not hasattr(training, "shard_degrees"):
        return (None,)
    return training.shard_degrees(node_counts) or (None,)


def per_node(model, training, classes, cp: int) -> tuple[int, ...]:
    """Replicas of tp x cp GPUs one node holds, for each node class and tp degree of the space
    (what ``zero_shard_degrees: [node]`` tries), ascending."""
    return tuple(sorted({c.gpus_per_node // (t * cp) for c in classes
                         for t in tp_degrees(model, c, training.max_tp) if t * cp <= c.gpus_per_node}))


def context_degrees(training, launcher: str | None = None) -> tuple[int, ...]:
    """The context-parallel degrees to try (``training.context_parallel_degrees``); with
    ``--launcher deepspeed`` only 1 (DeepSpeed has none, launch/deepspeed.py)."""
    degrees = tuple(dict.fromkeys(getattr(training, "context_parallel_degrees", (1,))))
    if launcher == "deepspeed":
        degrees = tuple(cp for cp in degrees if cp == 1)
    return degrees


def make_context(model, training, knobs: Knobs, profiles=None, calibration=None) -> CostContext:
    from planner.cost import default_calibration
    return CostContext(model=model, seq_len=training.seq_len, precision=training.precision,
                       recompute=knobs.recompute, sequence_parallel=training.sequence_parallel,
                       context_parallel=knobs.context_parallel, zero_stage=knobs.zero_stage, reshard_after_forward=knobs.reshard_after_forward,
                       num_micro_batches=knobs.num_micro_batches, schedule=knobs.schedule,
                       virtual_stages=knobs.virtual_stages, expert_parallel=knobs.expert_parallel,
                       zero_shard_degree=knobs.zero_shard_degree, cross_entropy=training.cross_entropy,
                       elementwise=training.elementwise,
                       flash_attention=training.attention == "flash",
                       calibration=calibration or default_calibration(), profiles=profiles)


def pipeline_rows(knobs: Knobs) -> tuple[list[Row], list[Term]]:
    """The schedule's core rows and terms (schedules.py: planner.cost.schedule's closed forms,
    or a lower bound on one)."""
    return SCHEDULES[knobs.schedule].rows(knobs.num_stages, knobs.num_micro_batches, knobs.virtual_stages)


def knob_rows(knobs: Knobs, stand_ins: bool = False, coarse: bool = False) -> tuple[tuple[Row, ...], tuple[Term, ...]]:
    """The rows the knob bounds read (SearchSchedule.bound_rows): the core's, or rows at most
    them where the core's hold a term the knob bounds do not read (``stand_ins``: the
    options include mixed stages' stand-ins).  Hashable: the knob bounds' caches key by them,
    since some schedules' rows depend on p (ZB-H1's W weight ``(q - 1) / p``, the V rows'
    choice of term) and others' do not (tuples differing only in p then share the work).
    ``coarse``: rows at most those that tuples of many p share (the same rows where the
    schedule has none: SearchSchedule.coarse_rows)."""
    return _knob_rows(knobs.schedule, knobs.num_stages, knobs.num_micro_batches, knobs.virtual_stages, stand_ins,
                      coarse)


@functools.lru_cache(maxsize=8192)
def _knob_rows(schedule: str, p: int, m: int, v: int, stand_ins: bool,
               coarse: bool = False) -> tuple[tuple[Row, ...], tuple[Term, ...]]:
    rows, terms = SCHEDULES[schedule].bound_rows(p, m, v, stand_ins, coarse)
    return tuple(rows), tuple(terms)
