"""Mixture-of-Experts models and expert parallelism (issue 20): the catalog shapes against the
published parameter counts, FLOPs counting active experts only, memory with experts / ep, the
dispatch / combine all-to-all volumes and times, the expert gradients over dp / ep, refusals."""

from __future__ import annotations

import pytest

from planner import catalog
from planner.catalog.benchmarks import collective_figures
from planner.cost.comm import dp_sync_time_s
from planner.cost.context import CostContext
from planner.cost.evaluate import evaluate
from planner.cost.flops import (
    active_params,
    model_flops_per_iteration,
    model_forward_flops,
    moe_block_params,
    total_params,
)
from planner.cost.memory import replica_memory
from planner.cost.moe import all_to_all_bytes_per_gpu
from planner.errors import InputError
from planner.plan import Plan
from planner.spec import ModelSpec, cluster_from_dict
from planner.topology.paths import INTRA_NODE_LATENCY_S, NETWORK_LATENCY_S

# A small MoE model (SwiGLU, 8 experts, top-2, one shared expert), cheap to price.
SMALL = {"name": "small-moe", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16,
         "num_kv_heads": 4, "ffn_hidden_size": 2816, "mlp": "swiglu", "vocab_size": 32000,
         "tied_embeddings": False, "num_experts": 8, "moe_top_k": 2, "moe_ffn_hidden_size": 1408,
         "num_shared_experts": 1}
SEQ = 2048

CLUSTER = cluster_from_dict({
    "name": "moe", "zones": [{"name": "z1"}, {"name": "z2"}],
    "nodes": [{"name": "h", "count": 2, "zone": "z1", "gpu": "H100-SXM5-80GB", "gpus_per_node": 8,
               "network_bandwidth": "3200 Gbit/s"},
              {"name": "far", "zone": "z2", "gpu": "H100-SXM5-80GB", "gpus_per_node": 8,
               "network_bandwidth": "3200 Gbit/s"}],
    "links": [{"between": ["z1", "z2"], "bandwidth": "10 Gbit/s", "latency": "20 ms"}]})


def plan_of(replicas, ep=1, model=SMALL, m=4, **knobs) -> Plan:
    """One stage holding the whole model; ``replicas``: (devices, share) per replica."""
    mb = sum(share for _, share in replicas)
    data = {"schema": "planner.plan/v1",
            "inputs": {"cluster": "moe", "model": model,
                       "training": {"global_batch_size": mb * m, "seq_len": SEQ, "precision": "bf16"}},
            "micro_batch_size": mb, "num_micro_batches": m, "schedule": "1f1b", "recompute": "none",
            "zero_stage": 0, "sequence_parallel": True, "expert_parallel": ep,
            "stages": [{"index": 0, "blocks": [0, 4], "embedding": True, "head": True,
                        "replicas": [{"gpu_type": "H100-SXM5-80GB", "tp": len(devs),
                                      "micro_batch_share": share, "devices": list(devs)}
                                     for devs, share in replicas]}]}
    data.update(knobs)
    return Plan.from_json(data)


# -- catalog and parameter counts ---------------------------------------------------------------

def test_mixtral_has_its_published_46_7b_total_and_12_9b_active_parameters():
    m = catalog.model("mixtral-8x7b")
    # Mistral AI's model card: "46.7B total parameters but only uses 12.9B parameters per token"
    assert total_params(m) / 1e9 == pytest.approx(46.7, abs=0.05)
    assert active_params(m) / 1e9 == pytest.approx(12.9, abs=0.05)


def test_qwen3_30b_a3b_has_its_published_30_5b_total_and_3_3b_active_parameters():
    m = catalog.model("qwen3-30b-a3b")
    assert m.head_dim == 128 and m.q_width == 4096 != m.hidden_size   # heads wider than h / a
    assert total_params(m) / 1e9 == pytest.approx(30.5, abs=0.05)
    # the card gives 3.3B to one decimal; the count here (embedding and output both counted,
    # per-head q/k norms not) is 3.35B
    assert active_params(m) / 1e9 == pytest.approx(3.3, abs=0.06)


def test_deepseek_v3_total_within_its_attention_stand_in():
    m = catalog.model("deepseek-v3")
    assert m.num_moe_layers == 58 and not m.is_moe_layer(2) and m.is_moe_layer(3)
    # 671B published; plain attention of head_dim 56 stands in for MLA: +18.4M weights on each
    # of 61 layers (205.5M against 187.1M, catalog source line), +1.1B in all
    mla_excess = 61 * (4 * 7168**2 - (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256
                                      + 128 * 128 * 7168))
    assert (total_params(m) - mla_excess) / 1e9 == pytest.approx(671, abs=1.0)


def test_forward_flops_count_the_active_experts_and_the_router():
    m = ModelSpec(**SMALL)
    h, s, L = m.hidden_size, SEQ, m.num_layers
    experts, rest = moe_block_params(m)
    norms = 4 * h   # two norms of scale + bias per block
    active_block = rest - norms + experts * m.moe_top_k // m.num_experts
    expected = s * (L * (2 * active_block + 4 * s * m.q_width) + 2 * h * m.vocab_size)
    assert model_forward_flops(m, 1, s) == pytest.approx(expected, rel=1e-12)
    assert model_flops_per_iteration(m, 8, s) == pytest.approx(3 * 8 * expected, rel=1e-12)
    # all experts' weights count in the total, the top_k in the active ones
    assert total_params(m) - active_params(m) == L * experts * (m.num_experts - m.moe_top_k) // m.num_experts


def test_dense_models_keep_their_mapping_and_plans_their_bytes():
    llama = catalog.model("llama3-8b")
    assert not llama.is_moe and "num_experts" not in llama.to_mapping() and "head_dim" not in llama.to_mapping()
    dense = {k: v for k, v in SMALL.items() if not k.startswith(("num_experts", "moe_", "num_shared"))}
    plan = plan_of([(["h-0:0"], 2)], model=dense)
    assert "expert_parallel" not in plan.dumps()
    assert plan_of([(["h-0:0"], 2)], model=SMALL, ep=1).dumps().count("expert_parallel") == 0
    assert '"expert_parallel": 2' in plan_of([(["h-0:0"], 1), (["h-0:1"], 1)], ep=2).dumps()


@pytest.mark.parametrize("bad, message", [
    ({"moe_top_k": 9}, "cannot exceed num_experts"),
    ({"moe_top_k": None}, "needs moe_top_k"),
    ({"first_k_dense_layers": 4}, "no layer is MoE"),
    ({"num_shared_experts": 0, "shared_expert_ffn_hidden_size": 512}, "needs num_shared_experts"),
])
def test_the_spec_refuses_inconsistent_experts(bad, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec(**{**SMALL, **bad})


def test_moe_fields_need_num_experts():
    with pytest.raises(ValueError, match="Mixture-of-Experts models only"):
        ModelSpec(**{**SMALL, "num_experts": None})


# -- memory ---------------------------------------------------------------------------------------

def test_each_gpu_holds_its_experts_over_ep_and_their_zero_shards_over_n_over_ep():
    m = ModelSpec(**SMALL)
    gpu = catalog.gpu("H100-SXM5-80GB")
    experts = m.num_layers * moe_block_params(m)[0]
    for zero in (0, 1):
        one = replica_memory(CostContext(model=m, seq_len=SEQ, zero_stage=zero), gpu, 1, 1, 4, True, True, 4, 1)
        two = replica_memory(CostContext(model=m, seq_len=SEQ, zero_stage=zero, expert_parallel=2),
                             gpu, 1, 1, 4, True, True, 4, 1)
        assert one.weights_bytes - two.weights_bytes == pytest.approx(experts / 2 * 2)   # bf16
        # ZeRO-1: each of the 4 replicas holds 12/4 bytes of every parameter's optimizer state;
        # with ep = 2 the experts' is sharded over the 2 replicas holding them, 12/2 of half
        want = 0.0 if zero else experts / 2 * 12
        assert one.optimizer_bytes - two.optimizer_bytes == pytest.approx(want)


# -- all-to-all -----------------------------------------------------------------------------------

def test_all_to_all_bytes_per_gpu():
    ctx = CostContext(model=ModelSpec(**SMALL), seq_len=SEQ)
    # tokens x top_k x hidden x bytes x (ep-1)/ep, tokens = share x s / tp
    assert all_to_all_bytes_per_gpu(ctx, 4, 2, 4) == 4 * SEQ / 2 * 2 * 1024 * 2 * 3 / 4


def _ep_comm(plan) -> float:
    return evaluate(CLUSTER, plan).breakdown_s["ep_comm"]


def test_ep_comm_is_four_all_to_alls_per_moe_layer_and_micro_batch_on_nvlink():
    plan = plan_of([(["h-0:0"], 2), (["h-0:1"], 2)], ep=2)
    gpu = catalog.gpu("H100-SXM5-80GB")
    fig = collective_figures(gpu.architecture)
    nbytes = 2 * SEQ * 2 * 1024 * 2 / 2          # share 2, top-2, h 1024, bf16, (ep-1)/ep
    a2a = INTRA_NODE_LATENCY_S + fig.intra_step_latency_s + nbytes / (CLUSTER.node_by_name["h-0"].group.intra_Bps
                                                                       * fig.busbw_fraction)
    # dispatch + combine, forward and backward, 4 MoE layers, 4 micro-batches
    assert _ep_comm(plan) == pytest.approx(4 * 4 * 4 * a2a, rel=1e-9)


def test_ep_comm_across_nodes_runs_at_the_gpus_nic_share():
    plan = plan_of([(["h-0:0"], 2), (["h-1:0"], 2)], ep=2)
    fig = collective_figures(catalog.gpu("H100-SXM5-80GB").architecture)
    nbytes = 2 * SEQ * 2 * 1024 * 2 / 2
    nic_share = 3200e9 / 8 / 8
    a2a = NETWORK_LATENCY_S + fig.inter_step_latency_s + nbytes / (nic_share * fig.network_busbw_fraction)
    assert _ep_comm(plan) == pytest.approx(4 * 4 * 4 * a2a, rel=1e-9)
    assert _ep_comm(plan) > _ep_comm(plan_of([(["h-0:0"], 2), (["h-0:1"], 2)], ep=2))


def test_the_busiest_gpu_of_the_slowest_group_sets_the_pace():
    # inside a group: the member with 3 sequences sends 3x the tokens of its peer
    uneven = plan_of([(["h-0:0"], 3), (["h-0:1"], 1)], ep=2)
    assert _ep_comm(uneven) == pytest.approx(_ep_comm(plan_of([(["h-0:0"], 3), (["h-0:1"], 3)], ep=2)), rel=1e-9)
    assert _ep_comm(uneven) > _ep_comm(plan_of([(["h-0:0"], 1), (["h-0:1"], 1)], ep=2))
    # across groups: the one crossing nodes
    both = plan_of([(["h-0:0"], 1), (["h-0:1"], 1), (["h-0:2"], 1), (["h-1:0"], 1)], ep=2)
    assert _ep_comm(both) == pytest.approx(_ep_comm(plan_of([(["h-0:2"], 1), (["h-1:0"], 1)], ep=2)), rel=1e-9)
    assert _ep_comm(both) > _ep_comm(plan_of([(["h-0:0"], 1), (["h-0:1"], 1)], ep=2))


def test_ep_across_a_slow_zone_link_costs_more():
    near = plan_of([(["h-0:0"], 2), (["h-1:0"], 2)], ep=2)
    far = plan_of([(["h-0:0"], 2), (["far:0"], 2)], ep=2)
    assert _ep_comm(far) > 10 * _ep_comm(near)


def test_expert_gradients_are_reduced_over_dp_over_ep_replicas():
    m = ModelSpec(**SMALL)
    reps = [([f"h-0:{i}"], 1) for i in range(4)]
    ep1, ep4 = evaluate(CLUSTER, plan_of(reps, ep=1)), evaluate(CLUSTER, plan_of(reps, ep=4))
    ctx = CostContext(model=m, seq_len=SEQ)
    experts = m.num_layers * moe_block_params(m)[0]
    gpu = catalog.gpu("H100-SXM5-80GB")
    # ep = n: each expert lives on one replica, only the rest is all-reduced over the 4
    rest = total_params(m) - experts
    from planner.topology import Topology
    r = Topology(CLUSTER).ring(("h-0:0", "h-0:1", "h-0:2", "h-0:3"), 1)
    assert ep4.stages[0].dp_sync_s == pytest.approx(
        dp_sync_time_s(ctx, rest, 4, 1, r.bandwidth_Bps, r.latency_s, r.kind, gpu), rel=1e-9)
    assert ep1.stages[0].dp_sync_s == pytest.approx(
        dp_sync_time_s(ctx, float(total_params(m)), 4, 1, r.bandwidth_Bps, r.latency_s, r.kind, gpu), rel=1e-9)
    assert "ep_comm" not in ep1.breakdown_s and ep4.breakdown_s["ep_comm"] > 0


def test_explain_names_the_ep_comm_term():
    rows = {t: f for t, _, f in evaluate(CLUSTER, plan_of([(["h-0:0"], 2), (["h-0:1"], 2)], ep=2)).explain()}
    assert "all-to-all" in rows["ep_comm"]
    assert any(t.startswith("gemm_efficiency.moe.experts") for t in rows)


# -- refusals -------------------------------------------------------------------------------------

@pytest.mark.parametrize("replicas, ep, model, message", [
    ([(["h-0:0"], 1), (["h-0:1"], 1), (["h-0:2"], 1)], 2, SMALL, "divide the stage's replica count"),
    ([(["h-0:0"], 1), (["h-0:1"], 1), (["h-0:2"], 1)], 3, SMALL, "divide the model's num_experts"),
    ([(["h-0:0"], 1), (["h-0:1"], 1)], 2, {k: v for k, v in SMALL.items() if k in (
        "name", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads",
        "ffn_hidden_size", "mlp", "vocab_size")}, "needs a Mixture-of-Experts model"),
])
def test_plans_with_impossible_expert_groups_are_refused(replicas, ep, model, message):
    with pytest.raises(InputError, match=message):
        evaluate(CLUSTER, plan_of(replicas, ep=ep, model=model))


def test_profiling_refuses_moe_models():
    from planner.profile.measure import measure_profile
    with pytest.raises(InputError, match="measures dense blocks"):
        measure_profile(catalog.model("mixtral-8x7b"), "cpu", [1], [1], 128, "fp32")


def test_a_model_mixing_dense_and_moe_layers_is_priced_as_its_average_block():
    from planner.cost.compute import gemm_curve_for
    from planner.cost.roofline import _block_work, block_work
    m = ModelSpec(**{**SMALL, "first_k_dense_layers": 1})       # 1 dense, 3 MoE layers
    ctx = CostContext(model=m, seq_len=SEQ)
    curve = gemm_curve_for(ctx, catalog.gpu("H100-SXM5-80GB"))
    dense, moe, mixed = (_block_work(ctx, curve, 1, 2, False), _block_work(ctx, curve, 1, 2, True),
                         block_work(ctx, curve, 1, 2))
    assert mixed.forward_s == pytest.approx(0.25 * dense.forward_s + 0.75 * moe.forward_s, rel=1e-12)
    assert mixed.backward_s == pytest.approx(0.25 * dense.backward_s + 0.75 * moe.backward_s, rel=1e-12)
    # whole-model FLOPs and parameters stay exact: 1 dense block + 3 MoE blocks
    all_moe, no_moe = ModelSpec(**SMALL), ModelSpec(**{k: v for k, v in SMALL.items() if k in (
        "name", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size",
        "mlp", "vocab_size", "tied_embeddings")})
    head = model_forward_flops(no_moe, 1, SEQ) - 4 * (model_forward_flops(no_moe, 1, SEQ) - model_forward_flops(
        no_moe.model_copy(update={"num_layers": 3}), 1, SEQ))
    per_dense = (model_forward_flops(no_moe, 1, SEQ) - head) / 4
    per_moe = (model_forward_flops(all_moe, 1, SEQ) - head) / 4
    assert model_forward_flops(m, 1, SEQ) == pytest.approx(head + per_dense + 3 * per_moe, rel=1e-12)
    assert total_params(m) == total_params(no_moe) + 3 * (total_params(all_moe) - total_params(no_moe)) // 4
