"""Core sharing: a plan that puts more computing devices on a node than the node's ``cores``.

On CPU a node's "devices" are processes, and a cluster spec may say how many cores they share
(``cores:`` of a node group).  A profile measured alone gives each op's time at full speed;
with ``k`` processes computing on ``C < k`` cores each runs at ``C/k`` (processor sharing,
planner.simulate.sharing).  How many compute at a given moment depends on the schedule: a
pipeline's fill and drain leave stages idle, so its steady state is slowed more than its
bubbles.  The closed forms (planner.cost.schedule) have no notion of that, so the pipeline is
run twice in the event simulator, alone and shared, and the difference is the ``core_sharing``
part of the compute term; the optimizer steps, which every process runs at the same moment,
are a processor-sharing makespan.  Data-parallel replicas on one node are processes of the
same stage, so their op runs at ``C/n`` whenever the stage computes: the same rule.

Not modelled: cache and memory-bandwidth contention between processes on different cores
(a co-tenant profile, planner profile --concurrent, holds that), collectives waiting on a
descheduled peer, and communication's own CPU use (sends are not slowed).

The search (planner.search) prices plans without core sharing; the chosen plan's final
``evaluate`` includes it, so ``solver.priced_vs_evaluated_rel`` shows the difference.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.compute import optimizer_time_s
from planner.cost.memory import stage_params
from planner.simulate.engine import simulate_pipeline
from planner.simulate.sharing import CoreShare, processor_sharing_makespan_s


@dataclass(frozen=True)
class CoreSharing:
    """What sharing cores adds to an evaluation (seconds per iteration)."""

    pipeline_alone_s: float      # simulated, each device on its own core
    pipeline_shared_s: float     # simulated under processor sharing
    optimizer_s: float           # slowest node's optimizer steps, run together
    optimizer_extra_s: float     # over the unshared optimizer term
    nodes: tuple[tuple[str, int, int], ...]  # (node, devices computing, cores), oversubscribed only

    @property
    def pipeline_extra_s(self) -> float:
        # Longer ops never shorten a fixed-order schedule, so this is >= 0 up to float dust.
        return max(0.0, self.pipeline_shared_s - self.pipeline_alone_s)

    @property
    def total_extra_s(self) -> float:
        return self.pipeline_extra_s + self.optimizer_extra_s

    def explain(self) -> str:
        where = ", ".join(f"node {n}: {k} devices on {c} cores" for n, k, c in self.nodes)
        return (f"{where}; k devices computing at once on C cores each run at min(1, C/k) "
                f"(processor sharing): simulated pipeline {self.pipeline_shared_s:.4g} s shared vs "
                f"{self.pipeline_alone_s:.4g} s alone, +{self.pipeline_extra_s:.4g} s in compute; "
                f"optimizer steps together {self.optimizer_s:.4g} s, +{self.optimizer_extra_s:.4g} s "
                "in optimizer; the search prices without core sharing")


def core_shares(cluster, plan) -> list[tuple[str, CoreShare]]:
    """(node, share) for each node whose ``cores`` the plan's devices outnumber; [] when none,
    and then the closed forms stand unchanged."""
    nodes = cluster.node_by_name
    p = len(plan.stages)
    per_node: dict[str, list[int]] = {}
    for i, st in enumerate(plan.stages):
        for r in st.replicas:
            per_node.setdefault(r.node, [0] * p)[i] += len(r.devices)   # tp x cp processes
    out = []
    for name, procs in per_node.items():
        cores = nodes[name].group.cores
        if cores is not None and sum(procs) > cores:
            out.append((name, CoreShare(cores, tuple(procs))))
    return out


def price_core_sharing(ctx, plan, nodes, stage_timings, shares, unshared_optimizer_s: float) -> CoreSharing:
    """Simulate the pipeline alone and shared; the optimizer as a processor-sharing makespan."""
    m, v, schedule = plan.num_micro_batches, plan.virtual_stages, plan.schedule
    if schedule in ("zb-h1", "zb-v", "dualpipev", "bitpipe", "latency-aware"):
        # The shared-core engine runs F / B orders only: the zero-bubble schedules, BitPipe and the latency-aware lists take 1F1B's
        # stretch (shared minus alone), the schedule ZB-H1 splits the backward of (the V ones
        # on one chunk per rank); an approximation, said in docs/internals.md.
        schedule, v = "1f1b", 1
    alone = simulate_pipeline(stage_timings, m, schedule, v).makespan_s
    shared = simulate_pipeline(stage_timings, m, schedule, v,
                               core_shares=[sh for _, sh in shares]).makespan_s
    works: dict[str, list[float]] = {name: [] for name, _ in shares}
    for st in plan.stages:
        params = stage_params(ctx, st.num_blocks, st.embedding, st.head)
        # ZeRO shards over replicas x cp ranks (planner.cost.memory)
        shard = max(1, len(st.replicas) * ctx.context_parallel) if ctx.zero_stage >= 1 else 1
        for r in st.replicas:
            if r.node in works:
                step_s = optimizer_time_s(ctx, nodes[r.node].gpu, params / r.tp / shard)
                works[r.node].extend([step_s] * len(r.devices))
    by_name = dict(shares)
    opt_s = max([unshared_optimizer_s] + [processor_sharing_makespan_s(w, by_name[n].cores)
                                          for n, w in works.items()])
    return CoreSharing(
        pipeline_alone_s=alone, pipeline_shared_s=shared, optimizer_s=opt_s,
        optimizer_extra_s=opt_s - unshared_optimizer_s,
        nodes=tuple((n, sum(sh.processes), int(sh.cores)) for n, sh in shares))
