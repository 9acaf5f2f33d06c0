"""ZeRO-2 and ZeRO-3 / FSDP2: memory against the ZeRO paper, the data-parallel collectives,
the search against brute force, the plan field and the launch formats."""

from __future__ import annotations

import json
import tomllib

import pytest
from test_launch_formats import make_plan, megatron_args, rep
from test_oracle import check_case, make_case

from planner.cost import CostContext, topology_for
from planner.cost.comm import _eff, dp_exposed_s, dp_sync_time_s, ring_allreduce_s, ring_reduce_scatter_s
from planner.cost.evaluate import context_for_plan
from planner.cost.flops import block_params, embedding_params, head_params
from planner.cost.memory import replica_memory, stage_params, zero_state_bytes
from planner.errors import InputError, InputErrors
from planner.launch import render
from planner.launch.torchtitan import CONFIG_FILE
from planner.plan import Plan
from planner.plan.schema import validate_plan_json
from planner.search.classes import class_infos
from planner.search.knobs import enumerate_knobs
from planner.search.oracle import oracle
from planner.spec import Training, cluster_from_dict, load_model

GB = 1e9
GPT = load_model({"name": "gpt", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
                  "vocab_size": 32000})


# -- memory -------------------------------------------------------------------------------------
def test_paper_figure_1_per_gpu_memory():
    """Rajbhandari et al. 2020, Fig. 1: a 7.5B model, N = 64, fp16 weights and grads (2 + 2),
    K = 12 bytes of Adam state: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB for stages 0 to 3."""
    params, n = 7.5e9, 64
    got = [round(params * sum(zero_state_bytes(2, 2, 12, z, n)) / GB, 1) for z in range(4)]
    assert got == [120.0, 31.4, 16.6, 1.9]


@pytest.mark.parametrize("precision,w,g,o", [("bf16", 2, 4, 12), ("fp16", 2, 2, 16), ("fp32", 4, 4, 8)])
def test_replica_memory_follows_the_stages(precision, w, g, o):
    """Each stage shards one more term over the replicas, in the codebase's bytes per parameter
    (bf16 keeps fp32 main grads: 4 bytes, not the paper's 2)."""
    n = 8
    want = {0: w + g + o, 1: w + g + o / n, 2: w + (g + o) / n, 3: (w + g + o) / n}
    params = stage_params(CostContext(model=GPT, seq_len=512), 8, True, True)
    for z, per_param in want.items():
        ctx = CostContext(model=GPT, seq_len=512, precision=precision, zero_stage=z)
        mem = replica_memory(ctx, None, 1, 1, 8, True, True, n, 1.0)
        static = mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes
        assert static == pytest.approx(params * per_param, rel=1e-12)
        assert (mem.gathered_bytes > 0) == (z == 3)


def test_zero3_gathered_working_set():
    """Resharding: two of the largest FSDP unit on the stage (prefetch); without: the stage."""
    elem = 2   # bf16 working weights
    for emb, head in ((False, False), (True, False), (False, True)):
        on = CostContext(model=GPT, seq_len=512, zero_stage=3)
        off = CostContext(model=GPT, seq_len=512, zero_stage=3, reshard_after_forward=False)
        units = [block_params(GPT)] + ([embedding_params(GPT)] if emb else []) \
            + ([head_params(GPT, with_embedding_on_same_stage=emb)] if head else [])
        for tp in (1, 2):
            got_on = replica_memory(on, None, tp, 1, 4, emb, head, 4, 1.0).gathered_bytes
            got_off = replica_memory(off, None, tp, 1, 4, emb, head, 4, 1.0).gathered_bytes
            assert got_on == pytest.approx(2 * max(units) / tp * elem)
            assert got_off == pytest.approx(stage_params(on, 4, emb, head) / tp * elem)
    # with 4 blocks, holding the whole stage costs more than two units
    assert got_off > got_on
    # one replica shards nothing: nothing to gather, and its state is whole
    alone = replica_memory(on, None, 1, 1, 4, False, False, 1, 1.0)
    assert alone.gathered_bytes == 0.0
    assert alone.weights_bytes + alone.grads_bytes + alone.optimizer_bytes == pytest.approx(
        stage_params(on, 4, False, False) * 18)


# -- collectives ----------------------------------------------------------------------------------
BW, LAT, N, TP = 50e9, 5e-6, 4, 2


def _sync(z, m=6, reshard=True, params=1e9, **kw):
    ctx = CostContext(model=GPT, seq_len=512, zero_stage=z, num_micro_batches=m,
                      reshard_after_forward=reshard, **kw)
    return ctx, dp_sync_time_s(ctx, params, N, TP, BW, LAT, "nvlink", None)


def test_dp_collective_volumes():
    """Ring volumes on the replica group's link: no ZeRO all-reduces the fp32 grads; ZeRO-1
    reduce-scatters them once and all-gathers the bf16 weights once; ZeRO-2 and ZeRO-3 keep
    only a gradient shard, so they reduce-scatter after each of the m micro-batches; ZeRO-3
    gathers the weights in each micro-batch's forward and backward (2m), once without
    resharding."""
    params, m = 1e9, 6
    ctx = CostContext(model=GPT, seq_len=512)
    eff, step = _eff(ctx, "nvlink", None)
    bw, lat = BW * eff, LAT + step
    grads, weights = params / TP * 4, params / TP * 2
    rs, ag = ring_reduce_scatter_s(grads, N, bw, lat), ring_reduce_scatter_s(weights, N, bw, lat)
    assert _sync(0)[1] == pytest.approx(ring_allreduce_s(grads, N, bw, lat))
    assert _sync(1)[1] == pytest.approx(rs + ag)
    assert _sync(2)[1] == pytest.approx(m * rs + ag)
    assert _sync(3, m=m, reshard=False)[1] == pytest.approx(m * rs + ag)
    assert _sync(3, m=m)[1] == pytest.approx(m * rs + 2 * m * ag)
    # (n-1)/n of each buffer per ring step sequence: the reduce-scatter moves twice the bytes
    assert rs - (N - 1) * lat == pytest.approx(2 * (ag - (N - 1) * lat))


def test_zero3_gathers_scale_with_micro_batches_unless_resharding_is_off():
    for m in (2, 5):
        # without resharding ZeRO-3 gathers once, as ZeRO-2 does; with it 2m times
        assert _sync(3, m=m, reshard=False)[1] == pytest.approx(_sync(2, m=m)[1])
        assert _sync(3, m=m)[1] > _sync(3, m=m, reshard=False)[1]


def test_zero3_overlap():
    """Forward gathers hide behind the m forwards, backward gathers and the reduce-scatter
    behind the m backwards; without overlap all is exposed."""
    ctx, dp = _sync(3, m=4)
    assert dp_exposed_s(ctx, dp, 1e3, 1e3) == 0.0
    assert dp_exposed_s(ctx, dp, 0.0, 0.0) == pytest.approx(dp)
    # the forward side (4 gathers of 2 bytes out of 4 x 4 reduce-scatter + 8 x 2 gather bytes)
    fwd = dp * 8 / 32
    assert dp_exposed_s(ctx, dp, 1e3, 0.0) == pytest.approx(fwd)
    # each forward hides its own gather: a forward a quarter of the forward side's hides it all
    assert dp_exposed_s(ctx, dp, 1e3, fwd / 4) == pytest.approx(0.0, abs=1e-15)
    ctx_off, dp_off = _sync(3, m=4, grad_reduce_overlap=False)
    assert dp_exposed_s(ctx_off, dp_off, 1e3, 1e3) == dp_off


# -- spec, plan, search --------------------------------------------------------------------------
def test_plan_field_only_for_zero3():
    plan = make_plan(zero_stage=3, reshard_after_forward=False)
    assert plan.reshards_after_forward is False and '"reshard_after_forward": false' in plan.dumps()
    validate_plan_json(plan.to_json(), file="p.json")     # the JSON Schema knows the field
    assert make_plan(zero_stage=3).reshards_after_forward is True
    assert "reshard_after_forward" not in make_plan(zero_stage=3).dumps()
    with pytest.raises(InputErrors) as exc:
        make_plan(zero_stage=1, reshard_after_forward=True)
    assert "reshard_after_forward applies only to zero_stage 3" in str(exc.value)
    with pytest.raises(InputErrors):
        make_plan(zero_stage=4)


def test_training_defaults_and_knobs():
    t = Training(global_batch_size=8, seq_len=256)
    assert t.zero_stages == (0, 1) and t.reshard_after_forward == (True,)
    with pytest.raises(ValueError, match="reshard_after_forward must list at least one"):
        Training(global_batch_size=8, seq_len=256, reshard_after_forward=())
    cluster, model, _ = make_case(3)
    classes = class_infos(topology_for(cluster))
    both = Training(global_batch_size=8, seq_len=256, zero_stages=(1, 3), schedules=("1f1b",),
                    recompute_modes=("none",), reshard_after_forward=(True, False))
    knobs = enumerate_knobs(model, both, classes)
    assert {(k.zero_stage, k.reshard_after_forward) for k in knobs} == {(1, True), (3, True), (3, False)}
    ones = sum(k.zero_stage == 1 for k in knobs)
    assert sum(k.zero_stage == 3 for k in knobs) == 2 * ones


def test_launchers_narrow_the_zero_knobs():
    """--launcher keeps only what the launcher runs: DeepSpeed no ZeRO-2/3 with a pipeline,
    Megatron-LM no ZeRO-3 that keeps its gathered weights."""
    cluster, model, training = _tight_case()
    classes = class_infos(topology_for(cluster))
    free = enumerate_knobs(model, training, classes)
    ds = enumerate_knobs(model, training, classes, "deepspeed")
    mg = enumerate_knobs(model, training, classes, "megatron")
    assert any(k.zero_stage >= 2 and k.num_stages > 1 for k in free)
    assert not any(k.zero_stage >= 2 and k.num_stages > 1 for k in ds)
    assert any(k.zero_stage == 3 and k.num_stages == 1 for k in ds)
    assert any(k.zero_stage == 3 and not k.reshard_after_forward for k in free)
    assert not any(k.zero_stage == 3 and not k.reshard_after_forward for k in mg)
    assert any(k.zero_stage == 3 for k in mg)


def _sharded(training: Training) -> Training:
    return training.model_copy(update={"zero_stages": (0, 2, 3), "reshard_after_forward": (True, False)})


@pytest.mark.parametrize("seed", [4, 6, 8, 18, 36])
def test_solver_equals_oracle_with_zero_2_and_3(seed):
    cluster, model, training = make_case(seed, max_plans=500)
    check_case(cluster, model, _sharded(training))


def _tight_case():
    """One node of eight 3 GiB GPUs (1.5 GiB of it workspace) and a 0.47B-parameter model:
    at 18 bytes per parameter only ZeRO-3 over the eight replicas fits it on one stage."""
    cluster = cluster_from_dict({"name": "tight", "zones": [{"name": "z0"}], "nodes": [{
        "name": "n0", "gpus_per_node": 8, "zone": "z0", "network_bandwidth": "100 Gbit/s",
        "gpu": {"name": "g", "memory": "3 GiB", "peak_tflops": 100, "memory_bandwidth": "900 GB/s",
                "intra_node_bandwidth": "100 GB/s", "price_per_hour": 1.0}}]})
    model = load_model({"name": "t", "num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16,
                        "vocab_size": 32000})
    training = Training(global_batch_size=8, seq_len=256, schedules=("1f1b",), recompute_modes=("full",),
                        zero_stages=(0, 1, 2, 3), reshard_after_forward=(True, False), max_tp=1, max_stages=2)
    return cluster, model, training


def test_zero3_opens_plans_that_did_not_fit():
    """The space with ZeRO-3 holds a plan where stages 0 to 2 hold none, and the solver finds
    the oracle's best there (the random cases above never need ZeRO-3: their memory binds on
    the workspace and activations)."""
    cluster, model, training = _tight_case()
    plain = oracle(cluster, model, training.model_copy(update={"zero_stages": (0, 1, 2)}))
    assert plain.value is None and plain.plans_unfit > 0
    res, ref = check_case(cluster, model, training)
    assert ref.plan.zero_stage == 3 and res.plan.zero_stage == 3
    assert res.evaluation.fits


def test_evaluate_reads_the_plan():
    plan = make_plan(zero_stage=3, reshard_after_forward=False)
    ctx = context_for_plan(plan)
    assert ctx.zero_stage == 3 and not ctx.reshard_after_forward and ctx.num_micro_batches == 16


# -- launch --------------------------------------------------------------------------------------
def one_stage(**knobs) -> Plan:
    return make_plan([[rep(["a:0", "a:1"]), rep(["a:2", "a:3"])]], blocks=((0, 8),), **knobs)


def test_deepspeed_stage_and_refusal():
    files = render(one_stage(zero_stage=3), "deepspeed", master_addr="h")
    assert json.loads(files["ds_config.json"])["zero_optimization"] == {"stage": 3}
    assert "PipelineEngine refuses" in files["deepspeed_pipeline.json"]
    for z in (2, 3):
        with pytest.raises(InputError) as exc:
            render(make_plan(zero_stage=z), "deepspeed", master_addr="h")
        assert f"zero_stage {z} with 2 pipeline stages" in str(exc.value)
        assert "training.zero_stages" in str(exc.value)
    # ZeRO-1 with a pipeline stays allowed
    assert json.loads(render(make_plan(), "deepspeed", master_addr="h")["ds_config.json"])["zero_optimization"] == {"stage": 1}


def test_torchtitan_shard_degree_and_reshard():
    for reshard, value in ((None, "always"), (False, "never")):
        extra = {} if reshard is None else {"reshard_after_forward": reshard}
        files = render(make_plan(zero_stage=3, **extra), "torchtitan", master_addr="h")
        par = tomllib.loads(files[CONFIG_FILE])["parallelism"]
        assert par["data_parallel_shard_degree"] == 2 and par["data_parallel_replicate_degree"] == 1
        assert par["fsdp_reshard_after_forward"] == value
    zero2 = render(make_plan(zero_stage=2), "torchtitan", master_addr="h")[CONFIG_FILE]
    assert "fsdp_reshard_after_forward" not in zero2 and "zero_stage 2: torchtitan has no gradient-only" in zero2


def test_megatron_fsdp_flags_and_refusal():
    for z, strategy in ((2, "optim_grads"), (3, "optim_grads_params")):
        files = render(make_plan(zero_stage=z), "megatron", master_addr="h")
        args = megatron_args(files)
        i = args.index("--data-parallel-sharding-strategy")
        assert args[i + 1] == strategy and "--use-megatron-fsdp" in args
        assert args[args.index("--ckpt-format") + 1] == "fsdp_dtensor"
        assert "CUDA_DEVICE_MAX_CONNECTIONS" not in files["node0-a.sh"]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in render(make_plan(), "megatron", master_addr="h")["node0-a.sh"]
    with pytest.raises(InputError) as exc:
        render(make_plan(zero_stage=3, reshard_after_forward=False), "megatron", master_addr="h")
    assert "reshard_after_forward false with zero_stage 3" in str(exc.value)


def test_torchrun_carries_reshard_only_for_zero3():
    spec = json.loads(render(make_plan(zero_stage=3, reshard_after_forward=False), "torchrun",
                             master_addr="h")["rank_map.json"])
    assert spec["zero_stage"] == 3 and spec["reshard_after_forward"] is False
    plain = json.loads(render(make_plan(), "torchrun", master_addr="h")["rank_map.json"])
    assert "reshard_after_forward" not in plain
