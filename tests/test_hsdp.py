"""HSDP (zero_shard_degree): ZeRO shards inside groups of consecutive replicas, replication
across the groups.  Memory and traffic against hand formulas, the plan field, launch outputs
and refusals (tests/test_zero.py has the ZeRO stages themselves)."""

from __future__ import annotations

import json
import tomllib

import pytest
from test_launch_formats import make_plan, megatron_args, rep

from planner.cost import CostContext, evaluate, topology_for
from planner.cost.comm import _eff, dp_exposed_s, dp_sync_time_s
from planner.cost.hsdp import replicate_allreduce_s
from planner.cost.memory import bytes_per_param, replica_memory, stage_params
from planner.errors import InputError, InputErrors
from planner.launch import render
from planner.launch.torchtitan import CONFIG_FILE
from planner.plan import Plan
from planner.plan.schema import validate_plan_json
from planner.spec import cluster_from_dict, load_model

GPT = load_model({"name": "gpt", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
                  "vocab_size": 32000})


# -- the plan field -------------------------------------------------------------------------------
def test_plan_bytes_unchanged_without_the_field_and_kept_with_it():
    plain = make_plan(zero_stage=1)
    assert "zero_shard_degree" not in plain.dumps()
    hsdp = make_plan(zero_stage=1, zero_shard_degree=1)
    assert '"zero_shard_degree": 1' in hsdp.dumps()
    validate_plan_json(hsdp.to_json(), file="p.json")   # the JSON Schema knows the field
    assert Plan.from_json(hsdp.to_json()).zero_shard_degree == 1
    # the rest of the file is the same bytes
    assert hsdp.dumps().replace('  "zero_shard_degree": 1,\n', "") == plain.dumps()


@pytest.mark.parametrize("knobs,message", [
    ({"zero_stage": 0, "zero_shard_degree": 1}, "zero_shard_degree 1 needs zero_stage 1, 2 or 3"),
    ({"zero_stage": 1, "zero_shard_degree": 3}, "zero_shard_degree 3 must divide every stage's replica count"),
    ({"zero_stage": 1, "zero_shard_degree": 1, "expert_parallel": 2}, "zero_shard_degree 1 with expert_parallel 2"),
])
def test_plan_field_refusals_name_the_field(knobs, message):
    with pytest.raises(InputErrors) as exc:
        make_plan(**knobs)
    assert message in str(exc.value)


# -- memory -------------------------------------------------------------------------------------
@pytest.mark.parametrize("cp", [1, 2])
def test_memory_divides_by_the_shard_group(cp):
    """ZeRO's divisor is d x cp, not n x cp: each of the n/d groups holds a whole copy."""
    n, d = 8, 2
    w, g, o = bytes_per_param("bf16")
    shards = d * cp
    want = {1: w + g + o / shards, 2: w + (g + o) / shards, 3: (w + g + o) / shards}
    for z, per_param in want.items():
        ctx = CostContext(model=GPT, seq_len=512, zero_stage=z, zero_shard_degree=d, context_parallel=cp)
        params = stage_params(ctx, 8, True, True)
        mem = replica_memory(ctx, None, 1, 1, 8, True, True, n, 1.0)
        assert mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes == pytest.approx(params * per_param)
        # the same as full sharding over a stage of d replicas
        alone = replica_memory(CostContext(model=GPT, seq_len=512, zero_stage=z, context_parallel=cp),
                               None, 1, 1, 8, True, True, d, 1.0)
        assert mem.total_bytes == pytest.approx(alone.total_bytes)
    # a shard group of one replica (cp 1) shards nothing and gathers nothing
    one = CostContext(model=GPT, seq_len=512, zero_stage=3, zero_shard_degree=1)
    mem = replica_memory(one, None, 1, 1, 8, True, True, n, 1.0)
    assert mem.gathered_bytes == 0.0
    assert mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes == pytest.approx(
        stage_params(one, 8, True, True) * (w + g + o))


# -- traffic ------------------------------------------------------------------------------------
def test_replicate_allreduce_hand_formula():
    """2 (G-1)/G of the gradient shard (params / tp / (d cp) x 4 bytes) per reduction, plus
    2 (G-1) latencies; ZeRO-2/3 reduce after each of the m micro-batches, ZeRO-1 once."""
    params, d, cp, groups, tp, bw, lat, m = 1e9, 2, 2, 3, 2, 10e9, 1e-3, 5
    for z, reductions in ((1, 1), (2, m), (3, m)):
        ctx = CostContext(model=GPT, seq_len=512, zero_stage=z, zero_shard_degree=d, context_parallel=cp,
                          num_micro_batches=m)
        eff, step = _eff(ctx, "zone-link")
        shard = params / tp / (d * cp) * 4
        want = reductions * (2 * (groups - 1) / groups * shard / (bw * eff) + 2 * (groups - 1) * (lat + step))
        got = replicate_allreduce_s(ctx, params, d * cp, groups, tp, bw, lat, "zone-link")
        assert got == pytest.approx(want)
    assert replicate_allreduce_s(ctx, params, d * cp, 1, tp, bw, lat, "zone-link") == 0.0


def _two_zone_cluster(link_gbit: float = 10):
    """Two zones of one 4-GPU node each, a slow link between them."""
    gpu = {"name": "g", "memory": "80 GiB", "peak_tflops": 300, "memory_bandwidth": "2000 GB/s",
           "intra_node_bandwidth": "300 GB/s", "price_per_hour": 1.0}
    return cluster_from_dict({
        "name": "two-zone", "zones": [{"name": "z0"}, {"name": "z1"}],
        "nodes": [{"name": "a", "gpus_per_node": 4, "zone": "z0", "network_bandwidth": "100 Gbit/s", "gpu": gpu},
                  {"name": "b", "gpus_per_node": 4, "zone": "z1", "network_bandwidth": "100 Gbit/s", "gpu": gpu}],
        "links": [{"between": ["z0", "z1"], "bandwidth": f"{link_gbit} Gbit/s", "latency": "5 ms"}]})


def _one_stage(**knobs) -> Plan:
    """One stage of four tp-1 replicas, two per zone (a:0, a:1 | b:0, b:1)."""
    reps = [rep([dev], share=1, gpu="g") for dev in ("a:0", "a:1", "b:0", "b:1")]
    return make_plan([reps], blocks=((0, 8),), num_micro_batches=4, **knobs)


def test_evaluate_prices_the_groups_and_the_replicate_ring():
    """The stage's sync = the ZeRO collectives on one group's ring (inside a node) + the
    replicate all-reduce on the ring across the zones; the shard rings' bytes stay off the
    zone link."""
    cluster = _two_zone_cluster()
    topo = topology_for(cluster)
    for z in (1, 3):
        plan = _one_stage(zero_stage=z, zero_shard_degree=2, recompute="none")
        ev = evaluate(cluster, plan, model=GPT, check=False)
        ctx = CostContext.from_plan(plan, GPT, 2048)
        params = stage_params(ctx, 8, True, True)
        inner = topo.ring(("a:0", "a:1"), 1)
        across = topo.ring(("a:0", "b:0"), 2)   # 2 positions x tp 1 rings share the zone link
        shard = dp_sync_time_s(ctx, params, 2, 1, inner.bandwidth_Bps, inner.latency_s, inner.kind)
        repl = replicate_allreduce_s(ctx, params, 2, 2, 1, across.bandwidth_Bps, across.latency_s, across.kind)
        st = ev.stages[0]
        assert st.dp_sync_s == pytest.approx(shard + repl)
        assert st.dp_replicate_s == pytest.approx(repl)
        assert st.dp_sync_exposed_s == pytest.approx(dp_exposed_s(ctx, shard + repl, st.backward_s,
                                                                  st.forward_s, repl))
        names = {name for name, _, _ in ev.details}
        assert {"hsdp_shard_sync_s", "hsdp_replicate_sync_s"} <= names
        # ZeRO-3 over the slow link gathers 2m times per iteration there: HSDP's sync is less
        full = evaluate(cluster, _one_stage(zero_stage=z, recompute="none"), model=GPT, check=False)
        if z == 3:
            assert st.dp_sync_s < full.stages[0].dp_sync_s
            assert ev.iteration_time_s < full.iteration_time_s


def test_replicate_traffic_is_backward_side():
    """The all-reduce follows each reduce-scatter: it hides behind the backwards, never the
    forwards; without overlap everything is exposed."""
    ctx = CostContext(model=GPT, seq_len=512, zero_stage=3, num_micro_batches=4, zero_shard_degree=2)
    shard, repl = 2.0, 1.0
    plain = dp_exposed_s(ctx, shard, 0.0, 1e3)
    assert dp_exposed_s(ctx, shard + repl, 0.0, 1e3, repl) == pytest.approx(plain + repl)
    assert dp_exposed_s(ctx, shard + repl, 1e3, 0.0, repl) == pytest.approx(dp_exposed_s(ctx, shard, 1e3, 0.0))
    off = CostContext(model=GPT, seq_len=512, zero_stage=3, num_micro_batches=4, grad_reduce_overlap=False)
    assert dp_exposed_s(off, shard + repl, 1e3, 1e3, repl) == shard + repl


# -- launch -------------------------------------------------------------------------------------
def _four_replicas(**knobs) -> Plan:
    return make_plan([[rep(["a:0"]), rep(["a:1"]), rep(["a:2"]), rep(["a:3"])]], blocks=((0, 8),), **knobs)


@pytest.mark.parametrize("z", [1, 2, 3])
def test_torchtitan_shard_and_replicate_degrees(z):
    par = tomllib.loads(render(_four_replicas(zero_stage=z, zero_shard_degree=2), "torchtitan",
                               master_addr="h")[CONFIG_FILE])["parallelism"]
    assert par["data_parallel_shard_degree"] == 2 and par["data_parallel_replicate_degree"] == 2
    full = tomllib.loads(render(_four_replicas(zero_stage=z), "torchtitan", master_addr="h")[CONFIG_FILE])
    assert full["parallelism"]["data_parallel_shard_degree"] == 4
    assert full["parallelism"]["data_parallel_replicate_degree"] == 1


@pytest.mark.parametrize("z", [1, 2, 3])
def test_megatron_optimizer_instances(z):
    args = megatron_args(render(_four_replicas(zero_stage=z, zero_shard_degree=1), "megatron", master_addr="h"))
    assert args[args.index("--num-distributed-optimizer-instances") + 1] == "4"
    assert "--use-distributed-optimizer" in args
    plain = megatron_args(render(_four_replicas(zero_stage=z), "megatron", master_addr="h"))
    assert "--num-distributed-optimizer-instances" not in plain


def test_deepspeed_refuses_and_torchrun_and_the_runner_carry_it():
    with pytest.raises(InputError) as exc:
        render(_four_replicas(zero_stage=3, zero_shard_degree=2), "deepspeed", master_addr="h")
    assert "zero_shard_degree 2: DeepSpeed has no hybrid sharding" in str(exc.value)
    spec = json.loads(render(_four_replicas(zero_stage=3, zero_shard_degree=2), "torchrun",
                             master_addr="h")["rank_map.json"])
    assert spec["zero_shard_degree"] == 2
    plain = json.loads(render(_four_replicas(zero_stage=3), "torchrun", master_addr="h")["rank_map.json"])
    assert "zero_shard_degree" not in plain
    from planner.launch.runner import check_plan, model_shape
    plan = _four_replicas(zero_stage=1, zero_shard_degree=2)
    check_plan(plan, model_shape(plan))   # the runner trains HSDP (tests/test_run_zero_slow.py)


# -- search -------------------------------------------------------------------------------------
def test_training_knob_defaults_and_knobs():
    from test_oracle import make_case

    from planner.search.classes import class_infos
    from planner.search.knobs import enumerate_knobs
    from planner.spec import Training
    t = Training(global_batch_size=8, seq_len=256)
    assert t.zero_shard_degrees == ("all",) and t.shard_degrees() == (None,)
    assert "zero_shard_degrees" not in t.io_mapping()
    with pytest.raises(ValueError, match="zero_shard_degrees must list at least one"):
        Training(global_batch_size=8, seq_len=256, zero_shard_degrees=())
    cluster, model, _ = make_case(3)
    classes = class_infos(topology_for(cluster))
    both = Training(global_batch_size=8, seq_len=256, zero_stages=(0, 1), schedules=("1f1b",),
                    recompute_modes=("none",), zero_shard_degrees=("all", 2))
    assert both.io_mapping()["zero_shard_degrees"] == ["all", 2]
    knobs = enumerate_knobs(model, both, classes)
    assert {(k.zero_stage, k.zero_shard_degree) for k in knobs} == {(0, None), (1, None), (1, 2)}
    assert not any(k.zero_shard_degree for k in enumerate_knobs(model, both, classes, "deepspeed"))


def _slow_network_case():
    """Two nodes of four GPUs in one zone, NVLink inside, 200 Gbit/s between (a quarter of it
    per GPU): ZeRO-3 over all eight replicas all-gathers the weights over the network twice per
    micro-batch (two micro-batches of one sequence per replica); HSDP's groups of four keep the
    gathers on NVLink and send only the gradient shard across.  (The search keeps a stage
    inside one node class, so one zone: the node boundary is where HSDP pays here.)"""
    gpu = {"name": "g", "memory": "40 GiB", "peak_tflops": 300, "memory_bandwidth": "2000 GB/s",
           "intra_node_bandwidth": "300 GB/s", "price_per_hour": 1.0}
    cluster = cluster_from_dict({"name": "slow-net", "zones": [{"name": "z0"}], "nodes": [
        {"name": "n", "count": 2, "gpus_per_node": 4, "zone": "z0", "network_bandwidth": "200 Gbit/s", "gpu": gpu}]})
    model = load_model({"name": "t", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
                        "vocab_size": 32000})
    from planner.spec import Training
    training = Training(global_batch_size=16, seq_len=4096, schedules=("1f1b",), recompute_modes=("none",),
                        zero_stages=(3,), zero_shard_degrees=("all", 4), max_tp=1, max_stages=1,
                        micro_batch_sizes=(1,))
    return cluster, model, training


def test_solver_equals_oracle_where_hsdp_wins():
    from test_oracle import check_case

    from planner.search.oracle import oracle
    cluster, model, training = _slow_network_case()
    res, ref = check_case(cluster, model, training)
    assert ref.plan.zero_shard_degree == 4 and res.plan.zero_shard_degree == 4
    assert len(res.plan.stages[0].replicas) == 8 and res.plan.num_micro_batches == 2
    # without HSDP the best plan (ZeRO-3 over all eight) is over 10% slower
    plain = oracle(cluster, model, training.model_copy(update={"zero_shard_degrees": ("all",)}))
    assert plain.plan.zero_shard_degree is None and len(plain.plan.stages[0].replicas) == 8
    assert plain.value > 1.1 * ref.value


@pytest.mark.parametrize("seed", [4, 8, 18])
def test_solver_equals_oracle_with_shard_degrees(seed):
    from test_oracle import check_case, make_case
    cluster, model, training = make_case(seed, max_plans=500)
    check_case(cluster, model, training.model_copy(update={"zero_stages": (1, 3), "zero_shard_degrees": ("all", 1, 2)}))


def test_cli_flag_sets_the_degrees():
    from planner.cli.freedoms import with_freedoms
    from planner.spec import Training
    t = with_freedoms(Training(global_batch_size=8, seq_len=256), {"--zero-shard-degree": "all, 4"}, None)
    assert t.zero_shard_degrees == ("all", 4) and t.shard_degrees() == (None, 4)
    t = with_freedoms(Training(global_batch_size=8, seq_len=256), {"--zero-shard-degree": "node,2"}, None)
    assert t.shard_degrees((1, 2, 4)) == (1, 2, 4)
    with pytest.raises(InputError, match="--zero-shard-degree 'zone'"):
        with_freedoms(Training(global_batch_size=8, seq_len=256), {"--zero-shard-degree": "zone"}, None)


def test_migration_and_diff_know_the_groups():
    """Each group holds a whole copy: replica r holds shard r mod d of d; diff lists the field."""
    from test_launch_formats import MODEL

    from planner.diff import diff_plans
    from planner.migrate import shards
    model = load_model(MODEL)
    held = shards(_four_replicas(zero_stage=3, zero_shard_degree=2), model)
    spans = [held[f"a:{i}"][0].optimizer_range for i in range(4)]
    assert spans == [(0.0, 0.5), (0.5, 1.0), (0.0, 0.5), (0.5, 1.0)]
    full = shards(_four_replicas(zero_stage=3), model)
    assert [full[f"a:{i}"][0].optimizer_range for i in range(4)] == [(0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0)]
    d = diff_plans(_four_replicas(zero_stage=3), _four_replicas(zero_stage=3, zero_shard_degree=2))
    assert {"field": "zero_shard_degree", "a": None, "b": 2} in d.settings


def test_node_means_the_replicas_one_node_holds():
    """On the two 4-GPU nodes with tp 1 or 2: groups of 4 or 2 replicas; the search's best is
    the groups of four (one node's replicas) found above."""
    from test_oracle import check_case

    from planner.search.classes import class_infos
    from planner.search.knobs import enumerate_knobs
    cluster, model, training = _slow_network_case()
    node = training.model_copy(update={"zero_shard_degrees": ("node",), "max_tp": 2})
    knobs = enumerate_knobs(model, node, class_infos(topology_for(cluster)))
    assert {k.zero_shard_degree for k in knobs} == {2, 4}
    res, _ = check_case(cluster, model, training.model_copy(update={"zero_shard_degrees": ("all", "node")}))
    assert res.plan.zero_shard_degree == 4


def test_baselines_keep_whole_shard_groups():
    """The baseline rules draw only on the tuple's options (baseline_tuple.py), which hold
    whole shard groups of 3: the answer and the baseline it names are valid HSDP layouts."""
    from planner import api
    cluster, model, training = _slow_network_case()
    t = training.model_copy(update={"global_batch_size": 12, "zero_shard_degrees": (3,), "zero_stages": (1,),
                                    "micro_batch_sizes": None, "max_stages": 2})
    plan = api.plan(cluster, model, t, time_limit_s=30).plan
    assert plan.zero_shard_degree == 3 and all(len(s.replicas) % 3 == 0 for s in plan.stages)
    assert plan.solver.baseline is not None and "d=3" in plan.solver.baseline


def test_pipelining_notes_the_mesh():
    notes = json.loads(render(_four_replicas(zero_stage=3, zero_shard_degree=2), "pipelining",
                              master_addr="h")["pipelining.json"])["notes"]
    assert any("2-D ('replicate', 'shard') mesh of shape (2, 2)" in n for n in notes)


@pytest.mark.parametrize("degree", [1, 2])
def test_solver_equals_oracle_with_context_parallel(degree):
    """Shard groups of d replicas x cp 2 ranks, and the all-reduce on every (position, cp
    rank) ring: the search prices them as evaluate does."""
    from test_oracle import check_case
    cluster, model, training = _slow_network_case()
    res, _ = check_case(cluster, model, training.model_copy(update={
        "context_parallel_degrees": (2,), "zero_shard_degrees": (degree,), "zero_stages": (1, 3),
        "max_stages": 2, "schedules": ("1f1b", "gpipe")}))
    assert res.plan.context_parallel == 2 and res.plan.zero_shard_degree == degree
