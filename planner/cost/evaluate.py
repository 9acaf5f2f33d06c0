"""``evaluate(cluster, plan)``: a plan's iteration time, throughput, MFU, cost and memory.

Decomposition (what the search may rely on, docs/internals.md):
    iteration_time = pipeline_time_s(stage timings) + max_s dp_sync_exposed_s + max_s optimizer_s
(plus, only where a plan's devices outnumber a node's ``cores``, the core-sharing slowdown of
planner.cost.sharing, which the search does not price) where each ``StageTiming`` depends only on the stage's own replicas (GPU type, tp, share,
blocks, embedding/head) and on the paths to its neighbour stages.
"""

from __future__ import annotations

import itertools

from planner.cost.bitpipe import in_flight_micro_batches as bitpipe_in_flight
from planner.cost.bitpipe import pair_sync_s, with_pair_copy
from planner.cost.calibration import Calibration
from planner.cost.comm import (
    boundary_bytes,
    boundary_time_s,
    dp_exposed_s,
    dp_sync_time_s,
    dp_wire_bytes_per_param,
    p2p_time_s,
    shared_link_time_s,
)
from planner.cost.compute import (
    backward_weight_s,
    optimizer_time_s,
    replica_compute,
)
from planner.cost.context import CostContext
from planner.cost.explain_rows import bottleneck_details, plan_sources, trust_of
from planner.cost.flops import model_flops_per_iteration
from planner.cost.hsdp import hsdp_details, hsdp_sync, is_hsdp
from planner.cost.memory import logits_in_flight, replica_memory, stage_holds, stage_params
from planner.cost.memory_hints import memory_problem
from planner.cost.moe import ep_comm_per_micro_batch, expert_params, expert_rings, optimizer_params
from planner.cost.money import plan_money
from planner.cost.result import Evaluation
from planner.cost.schedule import (
    StageTiming,
    bottleneck_stage,
    pipeline_breakdown,
    pipeline_time_s,
    with_cp_comm,
)
from planner.cost.sharing import core_shares, price_core_sharing
from planner.errors import InputError
from planner.plan.model import SPLIT_BACKWARD_SCHEDULES, V_SCHEDULES

_TOPOLOGIES: dict[int, tuple[object, object, object]] = {}


def _topology_entry(cluster):
    hit = _TOPOLOGIES.get(id(cluster))
    if hit is not None and hit[0] is cluster:
        return hit
    from planner.topology import Topology
    topo = Topology(cluster)
    if len(_TOPOLOGIES) > 16:
        _TOPOLOGIES.clear()
    hit = _TOPOLOGIES[id(cluster)] = (cluster, topo, _Paths(topo))
    return hit


def topology_for(cluster):
    """One ``Topology`` per cluster object (building it walks the cluster; paths are cached)."""
    return _topology_entry(cluster)[1]


def _training(plan) -> tuple[int, int, str]:
    t = plan.inputs.training or {}
    try:
        seq_len = int(t["seq_len"])
    except (KeyError, TypeError, ValueError):
        raise InputError("plan inputs.training needs seq_len") from None
    gbs = int(t.get("global_batch_size") or plan.micro_batch_size * plan.num_micro_batches)
    return seq_len, gbs, str(t.get("precision", "bf16"))


def context_for_plan(plan, calibration: Calibration | None = None, profiles=None, model=None,
                     precision: str | None = None, **extra) -> CostContext:
    """The plan's context: its precision and kernel choices unless ``precision`` or ``extra``
    say otherwise (a run that computed the plan another way: profile.from_run)."""
    from planner.spec import load_model
    model = model or load_model(plan.inputs.model)
    seq_len, _, planned = _training(plan)
    precision = precision or planned
    extra.setdefault("cross_entropy", plan.training_choice("cross_entropy"))
    extra.setdefault("elementwise", plan.training_choice("elementwise"))
    extra.setdefault("flash_attention", plan.training_choice("attention") == "flash")
    return CostContext.from_plan(plan, model, seq_len, precision, calibration, profiles, **extra)


class _Paths:
    """Cached path look-ups for one evaluation (the topology is cached per cluster)."""

    def __init__(self, topo):
        self.topo = topo
        self.cache: dict = {}

    def send(self, dev_a: str, dev_b: str, flows: int):
        key = ("send", dev_a, dev_b, flows)
        hit = self.cache.get(key)
        if hit is None:
            path = self.topo.p2p(dev_a, dev_b)
            na, nb = dev_a.rpartition(":")[0], dev_b.rpartition(":")[0]
            cap = None if na == nb else self.topo.node_p2p(na, nb).bandwidth_Bps
            zones = (self.topo.node(na).zone, self.topo.node(nb).zone)
            hit = self.cache[key] = (path, cap, zones)
        return hit

    def ring(self, devices: tuple[str, ...], concurrent: int):
        key = ("ring", devices, concurrent)
        hit = self.cache.get(key)
        if hit is None:
            ring = self.topo.ring(devices, concurrent_rings=concurrent)
            order = self.topo.sort_devices(devices)
            zones = [self.topo.node_of(d).zone for d in order]
            hops = list(zip(zones, zones[1:] + zones[:1])) if len(zones) > 2 else list(itertools.pairwise(zones))
            crossings = [tuple(sorted(h)) for h in hops if h[0] != h[1]]
            hit = self.cache[key] = (ring, crossings)
        return hit


def _boundary(ctx, paths, sa, sb, crossings, m_sends, ctx_gpu):
    """Send time between stage ``sa`` and ``sb``: the busiest replica, and no less than the
    transfers crossing a capped zone link take together; records egress."""
    per_seq = ctx.seq_len * ctx.model.hidden_size * ctx.activation_bytes
    shares_a = [r.micro_batch_share for r in sa.replicas]
    shares_b = [r.micro_batch_share for r in sb.replicas]
    times = []
    over_links: dict = {}     # (zone, zone) -> [bytes, a path, the sender's GPU]
    for i, j, nbytes in boundary_bytes(shares_a, shares_b, per_seq):
        ra, rb = sa.replicas[i], sb.replicas[j]
        # each cp rank sends its own s/cp of the activation: min(tp) flows per cp rank
        flows = min(ra.tp, rb.tp) * ctx.context_parallel
        path, cap, zones = paths.send(ra.devices[0], rb.devices[0], flows)
        times.append((i, j, p2p_time_s(nbytes, path, ctx, flows, cap, ctx_gpu(ra))))
        if zones[0] != zones[1]:
            key = tuple(sorted(zones))
            crossings[key] = crossings.get(key, 0.0) + 2 * nbytes * m_sends  # both directions
            over_links.setdefault(zones, [0.0, path, ctx_gpu(ra)])[0] += nbytes
    shared = [shared_link_time_s(nbytes, path, paths.topo.zone_path(*zones)[1], ctx, gpu)
              for zones, (nbytes, path, gpu) in over_links.items()]
    return max([boundary_time_s(times), *shared])


def _ring_sync(ctx, paths, replicas, params, gpu_of, crossings) -> float:
    """Gradient sync of ``params`` over ``replicas`` and their cp ranks (one ring per TP rank of
    the smallest TP, comm.dp_sync_time_s); records the bytes its hops carry across zones in
    ``crossings``."""
    cp = ctx.context_parallel   # every cp rank of every replica holds the same weights
    n = len(replicas) * cp
    if n <= 1:
        return 0.0
    min_tp = min(r.tp for r in replicas)
    devs = tuple(r.devices[c * r.tp] for r in replicas for c in range(cp))
    ring, ring_crossings = paths.ring(devs, min_tp)
    dp = dp_sync_time_s(ctx, params, n, min_tp, ring.bandwidth_Bps, ring.latency_s, ring.kind,
                        gpu_of(replicas[0]))
    if ring_crossings:
        per_ring = params / min_tp
        # every ring hop carries (n-1)/n of the buffer per reduce-scatter or all-gather
        # (an all-reduce is both; ZeRO-3 gathers again per micro-batch); a 2-member
        # ring's one hop is used both ways, larger rings list each directed crossing hop
        hop_bytes = (n - 1) / n * per_ring * dp_wire_bytes_per_param(ctx) * min_tp
        both_ways = 2 if n == 2 else 1
        for key in ring_crossings:
            crossings[key] = crossings.get(key, 0.0) + hop_bytes * both_ways
    return dp


def _backward_weight_s(ctx: CostContext, nodes, stage, slowest: int) -> float:
    """The W part of the slowest replica's backward compute (zero-bubble schedules;
    ``compute.backward_weight_s``, which the search prices too)."""
    r = stage.replicas[slowest]
    node = nodes[r.node]
    gpu, intra, tp, share = node.gpu, node.group.intra_Bps, r.tp, r.micro_batch_share
    key = ("backward_weight", gpu.name, tp, share, stage.num_blocks, stage.embedding, stage.head)
    hit = ctx.cache.get(key)
    if hit is None:
        hit = ctx.cache[key] = backward_weight_s(ctx, gpu, intra, tp, share, stage.num_blocks,
                                                 stage.embedding, stage.head)
    return hit


def _priced_stages(plan) -> list:
    """The plan's stages as the cost model prices them.  In a V (zb-v, dualpipev) the model's
    last piece, the head's, is rank 0's second chunk (planner.launch.common.chunks deals the
    pieces down the ranks and back), so rank 0 is priced with the head and the last rank
    without it; the plan file keeps the head on its last stage, as for every schedule."""
    if plan.schedule not in V_SCHEDULES or len(plan.stages) == 1:
        return list(plan.stages)
    return [st.model_copy(update={"head": i == 0}) for i, st in enumerate(plan.stages)]


def evaluate(cluster, plan, profiles=None, calibration: Calibration | None = None, *,
             model=None, check: bool = True, ctx: CostContext | None = None, **ctx_extra) -> Evaluation:
    """Price ``plan`` on ``cluster``.  Checks the plan first (planner.plan.check when present)."""
    from planner.spec import load_model
    model = model or (ctx.model if ctx is not None else load_model(plan.inputs.model))
    if check:
        try:
            from planner.plan.check import check_plan
        except ImportError:
            check_plan = None
        if check_plan is not None:
            check_plan(cluster, plan, model)
    if ctx is None:
        ctx = context_for_plan(plan, calibration, profiles, model=model, **ctx_extra)
    seq_len, gbs, _ = _training(plan)
    _, _topo, paths = _topology_entry(cluster)  # paths are memoised per cluster, across calls
    nodes = cluster.node_by_name
    m, v = plan.num_micro_batches, plan.virtual_stages
    v_schedule = plan.schedule in V_SCHEDULES
    # each boundary is crossed v_eff times each way per micro-batch: v interleaved, twice in a V
    v_eff = v if plan.schedule == "interleaved-1f1b" or v_schedule else 1
    p = len(plan.stages)
    stages = _priced_stages(plan)

    # -- per stage: compute of its slowest replica ------------------------------------------
    timings: list[dict] = []
    peak_flops = 0.0
    for st in stages:
        best = None
        for k, r in enumerate(st.replicas):
            node = nodes.get(r.node)
            if node is None:
                raise InputError(f"stage {st.index} replica {k}: unknown node {r.node!r}")
            peak_flops += node.gpu.peak_flops_for(ctx.precision) * len(r.devices)  # tp x cp; the precision used
            rt = replica_compute(ctx, node.gpu, node.group.intra_Bps, r.tp, r.micro_batch_share,
                                 st.num_blocks, st.embedding, st.head)
            if best is None or rt.total_s > best[1].total_s:
                best = (k, rt)
        timings.append({"slowest": best[0], "rt": best[1]})

    def gpu_of(replica):
        return nodes[replica.node].gpu

    # -- sends between neighbours (interleaved: the last stage also sends to stage 0) -------
    crossings: dict[tuple[str, str], float] = {}
    send_fwd = [0.0] * p
    send_bwd = [0.0] * p
    for i in range(p - 1):
        t = _boundary(ctx, paths, stages[i], stages[i + 1], crossings, m * v_eff, gpu_of)
        send_fwd[i] = t
        send_bwd[i + 1] = t
    if v_eff > 1 and p > 1 and not v_schedule:  # the V turns around on the last rank, no wrap
        t = _boundary(ctx, paths, stages[-1], stages[0], crossings, m * (v_eff - 1), gpu_of)
        send_fwd[-1] = t
        send_bwd[0] = max(send_bwd[0], t)

    # -- DP sync and optimizer per stage ---------------------------------------------------
    stage_timings: list[StageTiming] = []
    bitpipe = plan.schedule == "bitpipe"
    for i, st in enumerate(stages):
        params = stage_params(ctx, st.num_blocks, st.embedding, st.head)
        if bitpipe:  # the rank also holds its pair's share: its DP sync and step cover both copies
            mirror = stages[p - 1 - i]
            params += stage_params(ctx, mirror.num_blocks, mirror.embedding, mirror.head)
        # the weights are replicated over each replica's cp ranks too: the gradients are
        # reduced over replicas x cp ranks, one ring through every cp rank of every replica
        n = len(st.replicas)
        ep = ctx.expert_parallel if model.is_moe else 1
        experts = expert_params(ctx, st.num_blocks) if ep > 1 else 0.0
        replicate = 0.0   # HSDP: the all-reduces across shard groups (cost/hsdp.py)
        if is_hsdp(ctx, n):
            hs = hsdp_sync(ctx, paths, st.replicas, params - experts, gpu_of, crossings, _ring_sync)
            dp, replicate = hs.total_s, hs.replicate_s
        else:
            dp = _ring_sync(ctx, paths, st.replicas, params - experts, gpu_of, crossings)
        if experts:   # each EP rank's E/ep experts over the replicas holding them (cost/moe.py)
            dp += max(_ring_sync(ctx, paths, [st.replicas[j] for j in ring], experts / ep, gpu_of, crossings)
                      for ring in expert_rings(n, ep))
        rt = timings[i]["rt"]
        ep_fwd, ep_bwd, ep_zones = ep_comm_per_micro_batch(ctx, _topo, st, gpu_of)
        for key, nbytes in ep_zones.items():
            crossings[key] = crossings.get(key, 0.0) + m * nbytes
        exposed = dp_exposed_s(ctx, dp, rt.total_backward_s + ep_bwd, rt.total_forward_s + ep_fwd, replicate)
        # ZeRO over dp x cp (HSDP: over the shard group's replicas x cp)
        shard = max(1, ctx.shard_group(n) * ctx.context_parallel) if ctx.zero_stage >= 1 else 1
        opt = max(optimizer_time_s(ctx, nodes[r.node].gpu, optimizer_params(ctx, params, experts, r.tp, shard))
                  for r in st.replicas)
        stage_timings.append(StageTiming(
            forward_s=rt.total_forward_s + ep_fwd, backward_s=rt.total_backward_s + ep_bwd,
            ep_comm_s=ep_fwd + ep_bwd,
            send_forward_s=send_fwd[i], send_backward_s=send_bwd[i], dp_sync_s=dp,
            dp_sync_exposed_s=exposed, optimizer_s=opt, compute_s=rt.forward_s + rt.backward_s,
            recompute_s=rt.recompute_s, tp_comm_s=rt.tp_comm_s, slowest_replica=timings[i]["slowest"],
            backward_weight_s=(_backward_weight_s(ctx, nodes, st, timings[i]["slowest"])
                               if plan.schedule in (*SPLIT_BACKWARD_SCHEDULES, "latency-aware") else 0.0),
            pair_sync_s=pair_sync_s(ctx, paths, plan, i, gpu_of) if bitpipe else 0.0,
            cp_comm_s=rt.cp_comm_s, dp_replicate_s=replicate))

    latency_aware = None
    if plan.schedule == "latency-aware":   # priced from its own action lists (cost/latency_aware.py)
        from planner.cost.latency_aware import price_actions
        latency_aware = price_actions(stage_timings, plan, _topo)

    # -- memory -----------------------------------------------------------------------------
    peak: dict[str, float] = {}
    capacity: dict[str, float] = {}
    by_replica = []
    problems: list[str] = []
    bitpipe_inflight = bitpipe_in_flight(p, m) if bitpipe else None
    for i, st in enumerate(stages):
        inflight, deferred = stage_holds(plan.schedule, p, i, m, v)
        if bitpipe_inflight:
            inflight = bitpipe_inflight[i]
        if latency_aware is not None:   # its own lists' peaks (cost/latency_aware.py)
            inflight, deferred = float(latency_aware.peak_in_flight[i]), float(latency_aware.peak_waiting_w[i])
        row = []
        for k, r in enumerate(st.replicas):
            gpu = nodes[r.node].gpu
            key = ("memory", gpu.name, gpu.memory_bytes, r.tp, r.micro_batch_share, st.num_blocks,
                   st.embedding, st.head, len(st.replicas), inflight, deferred,
                   (stages[p - 1 - i].blocks, stages[p - 1 - i].embedding, stages[p - 1 - i].head) if bitpipe
                   else None)
            mem = ctx.cache.get(key)
            if mem is None:
                mem = replica_memory(ctx, gpu, r.tp, r.micro_batch_share, st.num_blocks,
                                     st.embedding, st.head, len(st.replicas), inflight,
                                     logits_in_flight(plan.schedule), deferred)
                if bitpipe:
                    mem = with_pair_copy(ctx, gpu, r, st, stages[p - 1 - i], mem, inflight)
                ctx.cache[key] = mem
            row.append(mem)
            for d in r.devices:
                peak[d] = mem.total_bytes
                capacity[d] = gpu.memory_bytes
            if mem.total_bytes > gpu.memory_bytes:
                problems.append(memory_problem(ctx, plan, st, k, r, gpu, mem, inflight, deferred,
                                               gpus_per_node=nodes[r.node].gpus_per_node))
        by_replica.append(row)

    # -- totals -------------------------------------------------------------------------------
    if latency_aware is not None:
        from planner.cost.latency_aware import breakdown as latency_breakdown
        pipe = latency_aware.pipeline_time_s
        breakdown = latency_breakdown(stage_timings, m, pipe)
    else:
        pipe = pipeline_time_s(stage_timings, m, plan.schedule, v)
        breakdown = pipeline_breakdown(stage_timings, m, plan.schedule, v)
    if ctx.context_parallel > 1:
        breakdown = with_cp_comm(breakdown, stage_timings, m,
                                 bottleneck_stage(stage_timings, plan.schedule, v))
    details = bottleneck_details(ctx, plan, stages, nodes, stage_timings,
                                 bottleneck_stage(stage_timings, plan.schedule, v))
    details += hsdp_details(ctx, stage_timings)
    shares = core_shares(cluster, plan)
    if shares:  # only then: plans on nodes without (enough) sharing keep the closed form exactly
        sharing = price_core_sharing(ctx, plan, nodes, stage_timings, shares, breakdown["optimizer"])
        pipe += sharing.pipeline_extra_s
        breakdown["compute"] += sharing.pipeline_extra_s  # the compute ops are what is stretched
        breakdown["optimizer"] = sharing.optimizer_s
        details.append(("core_sharing_s", sharing.total_extra_s, sharing.explain()))
    iteration = sum(breakdown.values())
    tokens = gbs * seq_len
    flops = model_flops_per_iteration(model, gbs, seq_len)
    money = plan_money(cluster, [r.node for st in stages for r in st.replicas], crossings, iteration)
    tps = tokens / iteration
    usd_h = money.usd_per_hour
    return Evaluation(
        iteration_time_s=iteration, tokens_per_s=tps, samples_per_s=gbs / iteration,
        mfu=flops / (peak_flops * iteration), usd_per_hour=usd_h,
        usd_per_million_tokens=None if usd_h is None else usd_h / (tps * 3600) * 1e6,
        breakdown_s=breakdown, peak_memory_bytes=peak, memory_capacity_bytes=capacity,
        fits=not problems, memory_problems=problems, stages=stage_timings, pipeline_time_s=pipe,
        bottleneck_stage=bottleneck_stage(stage_timings, plan.schedule, v),
        model_flops_per_iteration=flops, nodes_usd_per_hour=money.nodes_usd_per_hour,
        egress_usd_per_hour=money.egress_usd_per_hour, memory_by_replica=by_replica,
        sources=plan_sources(ctx, stages, nodes), repriced=plan_sources(ctx, stages, nodes, "repriced"), schedule=plan.schedule, num_micro_batches=m, virtual_stages=v,
        details=details, trust=trust_of(ctx, stages, nodes))
