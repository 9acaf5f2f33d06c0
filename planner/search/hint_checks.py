"""The "would fit" hints of an infeasible job (diagnose.py), each checked by the search itself.

Every candidate change (full recompute, a ZeRO stage above those searched, context or expert
parallelism, a larger TP where the heads allow one, a freer schedule, micro-batch, HSDP or
stage setting, GPUs with more memory, twice the nodes, a smaller global batch) is applied
alone to the user's settings and kept only where ``solve`` then finds a plan: no memory
estimate stands in for the cost model's own formulas.  A check stops at the first plan (its
gap tolerance takes any plan) and searches only the space the change adds where the rest was
just shown empty (the new recompute mode, ZeRO stage, cp / ep / shard degrees alone).  The
checks run on a work clock of their own (clock.py), so the hints are the same on any machine;
a check that runs out of its share is reported as undecided, never as a fix.
"""

from __future__ import annotations

import contextvars
import math
import time
from dataclasses import dataclass

from planner.errors import InfeasibleError, PlannerError
from planner.search import clock
from planner.search.knobs import tp_degrees

CHECK_S = 0.6           # work seconds (clock.py) one check may search
TOTAL_S = 1.25          # all checks of one explanation together
WALL_S = 1.5            # and on the wall clock, the guard where work runs slower than it counts
LEAST_CHECK_S = 0.05    # a check with less left is not started
ANY_PLAN = 1 - 1e-9     # gap_rel: the first plan found prunes everything else
BATCH_CHECKS = 6        # the most global batch sizes tried

# Set while a check's own search runs: diagnose.explain_infeasible then records whether that
# search ran out of time (undecided) instead of explaining, and never checks in turn.
_RECORD: contextvars.ContextVar[list | None] = contextvars.ContextVar("hint_check_record", default=None)


def record(timed_out: bool) -> bool:
    """Inside a check: note whether its search found no plan only for want of time.  Returns
    whether a check is running (the caller then explains nothing)."""
    out = _RECORD.get()
    if out is None:
        return False
    out.append(timed_out)
    return True


@dataclass(frozen=True)
class Change:
    """One candidate: ``hint`` as the user would apply it, ``short`` in the lists of changes
    that did not help; the search to check it with (``training`` updates, the space it adds;
    ``cluster`` another cluster)."""
    hint: str
    short: str
    training: dict
    cluster: object = None


def _listed(values) -> str:
    return ",".join(map(str, values))


def _with_groups(cluster, change):
    """``cluster`` with every node group passed through ``change`` (a new object: its cached
    node list and fingerprint are not carried over)."""
    fields = {k: getattr(cluster, k) for k in type(cluster).model_fields if k != "source_sha256"}
    fields["nodes"] = tuple(change(g) for g in cluster.nodes)
    return type(cluster)(**fields)


def _powers_of_two(upto: int) -> list[int]:
    return [2 ** k for k in range(1, max(1, upto).bit_length()) if 2 ** k <= upto]


def knob_changes(model, training, classes, launcher: str | None = None) -> list[list[Change]]:
    """The training changes to check, in groups: within a group (the ZeRO stages) the first
    that gives a plan is named and the rest are not tried.  The savers of both states and
    activations first (recompute, TP), cp (activations alone) after the ZeRO stages; none that
    ``launcher`` cannot run (launcher_space.py: DeepSpeed has no context or expert
    parallelism, nor HSDP)."""
    out: list[list[Change]] = []
    if "full" not in training.recompute_modes:
        modes = _listed((*training.recompute_modes, "full"))
        out.append([Change(f"full recompute (--recompute {modes})", "full recompute",
                           {"recompute_modes": ("full",)})])
    # a TP the heads allow beside the node's GPUs (20 heads: none above 4)
    tp = max((tps[-1] for c in classes if (tps := tp_degrees(model, c, c.gpus_per_node))), default=0)
    if tp > training.max_tp:
        out.append([Change(f"tp up to {tp} (training.max_tp: {tp})", f"tp up to {tp}", {"max_tp": tp})])
    out.append([Change(f"ZeRO-{z} (--zero-stage {_listed((*training.zero_stages, z))})", f"ZeRO-{z}",
                       {"zero_stages": (z,)}) for z in range(max(training.zero_stages) + 1, 4)])
    per_node = max(c.gpus_per_node for c in classes)
    cps = [d for d in _powers_of_two(per_node)
           if d not in training.context_parallel_degrees and training.seq_len % (2 * d) == 0]
    if cps:
        degrees = _listed(sorted({*training.context_parallel_degrees, *cps}))
        out.append([Change(f"context parallelism (--context-parallel {degrees})", "context parallelism",
                           {"context_parallel_degrees": tuple(cps)})])
    if model.is_moe:
        gpus = sum(c.node_class.num_gpus for c in classes)
        eps = [d for d in _powers_of_two(min(model.num_experts, gpus))
               if model.num_experts % d == 0 and d not in training.expert_parallel_degrees]
        if eps:
            degrees = _listed(sorted({*training.expert_parallel_degrees, *eps}))
            out.append([Change(f"expert parallelism (--expert-parallel {degrees})", "expert parallelism",
                               {"expert_parallel_degrees": tuple(eps)})])
    if "1f1b" not in training.schedules:
        out.append([Change(f"the 1f1b schedule (--schedule {_listed((*training.schedules, '1f1b'))})",
                           "the 1f1b schedule", {"schedules": ("1f1b",)})])
    if training.micro_batch_sizes:
        out.append([Change("any micro-batch size (training.micro_batch_sizes unset)", "any micro-batch size",
                           {"micro_batch_sizes": None})])
    if "all" not in training.zero_shard_degrees:
        degrees = _listed((*training.zero_shard_degrees, "all"))
        out.append([Change(f"ZeRO over all replicas (--zero-shard-degree {degrees})", "ZeRO over all replicas",
                           {"zero_shard_degrees": ("all",)})])
    if training.max_stages:
        out.append([Change(f"more than {training.max_stages} stages (training.max_stages unset)",
                           f"more than {training.max_stages} stages", {"max_stages": None})])
    from planner.launcher_space import LAUNCHER_CHOICES  # it imports the search

    runs = LAUNCHER_CHOICES.get(launcher or "", {})
    out = [[c for c in group if all(set(v) <= set(runs[k]) for k, v in c.training.items() if k in runs)]
           for group in out]
    return [group for group in out if group]


def cluster_changes(cluster, classes, blocked: dict[str, float]) -> list[list[Change]]:
    """GPUs with the memory one block needs (``blocked``: GPU type -> bytes, whole GiB up),
    then twice the nodes of every group."""
    out = []
    for name, need in blocked.items():
        gib = math.ceil(need / 2**30)

        def bigger(g, name=name, gib=gib):
            if g.gpu.name != name:
                return g
            return g.model_copy(update={"gpu": g.gpu.model_copy(update={"memory_bytes": gib * 2**30})})
        out.append([Change(f"GPUs with at least {gib} GiB in place of the {name}", f"{name} with {gib} GiB", {},
                           _with_groups(cluster, bigger))])
    gpus = sum(c.node_class.num_gpus for c in classes)
    twice = _with_groups(cluster, lambda g: g.model_copy(update={"count": 2 * (g.count or 1)}))
    out.append([Change(f"twice the nodes ({2 * gpus} GPUs)", "twice the nodes", {}, twice)])
    return out


class Checker:
    """Runs the checks of one explanation, each on a work clock of its own, ``TOTAL_S`` of
    work in all (``WALL_S`` on the wall clock at most); sorts the changes into those that
    give a plan, those that give none and those undecided."""

    def __init__(self, cluster, model, training, spec, launcher: str | None = None):
        self.cluster, self.model, self.training, self.spec = cluster, model, training, spec
        self.launcher = launcher
        self.fits: list[str] = []           # hints that give a plan
        self.fails: list[str] = []          # changes shown to give none
        self.undecided: list[str] = []      # changes whose check ran out of time
        self.spent_s = 0.0                  # work seconds the checks took so far
        self.wall_stop = time.monotonic() + WALL_S

    def run(self, groups: list[list[Change]]) -> None:
        for group in groups:
            for change in group:
                # another cluster is priced from nothing: only with a whole check's time left
                got = self.check(change.cluster or self.cluster, change.training,
                                 CHECK_S if change.cluster is not None else LEAST_CHECK_S)
                if got:
                    self.fits.append(change.hint)
                    break
                (self.fails if got is False else self.undecided).append(change.short)

    def smaller_batch(self) -> None:
        """The largest of the global batch's halvings (down to the least micro-batch size
        allowed) that gives a plan, tried from the largest down: fewer sequences hold fewer
        activations, but also allow fewer replicas to shard the states over, so neither end
        stands for the others."""
        gbs = self.training.global_batch_size
        least = min(self.training.micro_batch_sizes or (1,))
        sizes = sorted({max(least, gbs >> k) for k in range(1, gbs.bit_length())} - {gbs}, reverse=True)
        failed = []
        for size in sizes[:BATCH_CHECKS]:
            got = self.check(self.cluster, {"global_batch_size": size})
            if got:
                self.fits.append(f"a global batch of {size} sequence{'s' if size > 1 else ''} "
                                 f"(--global-batch-size {size})")
                return
            if got is None:
                break
            failed.append(size)
        if failed:
            self.fails.append("a smaller global batch" if len(failed) == len(sizes)
                              else f"a global batch of {'/'.join(map(str, failed))}")
        unchecked = sizes[len(failed):]
        if unchecked:
            self.undecided.append(f"a global batch of {unchecked[0]}" + (" or fewer" if len(unchecked) > 1 else ""))

    def check(self, cluster, update: dict, least_s: float = LEAST_CHECK_S) -> bool | None:
        """Whether the search with ``update`` applied finds a plan: True, False (none), None
        (not decided in the time it had, or not started with less than ``least_s`` left), on
        a work clock of its own (a deterministic search's is left as it was): first
        ``any_tuple_fits``, then, where a tuple may fit, ``solve`` until its first plan."""
        from planner.search.solve import solve

        limit = min(CHECK_S, TOTAL_S - self.spent_s, self.wall_stop - time.monotonic())
        if limit < least_s:
            return None
        training = self.training.model_copy(update=update)
        out: list[bool] = []
        token = _RECORD.set(out)
        try:
            with clock.work_clock(limit, None) as wc:
                try:
                    may = any_tuple_fits(cluster, self.model, training, self.spec, clock.now() + limit, self.launcher)
                    left = limit - clock.now()
                    if may is not True or left < LEAST_CHECK_S:
                        return False if may is False else None
                    solve(cluster, self.model, training, objective=self.spec, time_limit_s=left, gap_rel=ANY_PLAN,
                          launcher=self.launcher)
                    return True
                except InfeasibleError:
                    return None if any(out) or wc.wall_clock_bound else False
                except PlannerError:     # a change the search refuses: no fix, nor a proof of none
                    return None
                finally:
                    self.spent_s += wc.units * wc.seconds_per_unit
        finally:
            _RECORD.reset(token)


def any_tuple_fits(cluster, model, training, spec, deadline: float, launcher: str | None = None) -> bool | None:
    """Whether some knob tuple of the space may hold a plan, as the search's heap first sees
    it: options (``usable_keys``) and a finite memory-aware knob bound (``KnobBound.whole``,
    then with the packed bound's knapsacks), the tuples their twins dominate left out as the
    search leaves them.  False proves no plan (each bound holds every plan of its tuple): the
    search's own proof, without the warm start and MILPs it runs before it; None: past
    ``deadline`` (clock.now()) before an answer."""
    from planner.cost import topology_for
    from planner.search.bound import KnobBound
    from planner.search.classes import class_infos
    from planner.search.knobs import enumerate_knobs
    from planner.search.space import Pricer
    from planner.search.tuple_inputs import TupleInputs
    from planner.search.twins import gpipe_dominated, one_stage_zb_h1_twins

    topo = topology_for(cluster)
    classes = class_infos(topo, training.precision)
    if not classes:
        return False
    pricer = Pricer(model, training, classes, topo)
    bound = KnobBound(pricer)
    bound.set_deadline(deadline)
    knobs_list = enumerate_knobs(model, training, classes, launcher)
    dominated = gpipe_dominated(knobs_list) | one_stage_zb_h1_twins(knobs_list)
    inputs = TupleInputs(pricer, launcher, spec)
    for knobs in knobs_list:
        if clock.now() > deadline:
            return None
        if knobs in dominated:
            continue
        keys, _ = inputs.keys(knobs)
        if not keys:
            continue
        ctx = inputs.context(knobs)
        # the heap's first memory-aware levels: without, then with the packed bound's knapsacks
        if all(math.isfinite(bound.whole(knobs, ctx, keys, True, packed=level)) for level in (0, 1)):
            return True
    return False


def checked_hints(cluster, model, training, spec, classes, blocked: dict[str, float],
                  launcher: str | None = None) -> Checker:
    """Every candidate checked: ``knob_changes``, a smaller batch, then ``cluster_changes``."""
    checker = Checker(cluster, model, training, spec, launcher)
    checker.run(knob_changes(model, training, classes, launcher))
    checker.smaller_batch()
    checker.run(cluster_changes(cluster, classes, blocked))     # the dearest: a cluster priced anew
    return checker
