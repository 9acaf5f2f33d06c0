"""ZeRO-2 (issue 20, first step): gradients sharded with the optimizer state and reduce-scattered
after every micro-batch; memory against the ZeRO paper's formulas, the sync's volume, the
search against brute force, and what each launcher does with it."""

from __future__ import annotations

import pytest

from planner import api
from planner.cost.comm import dp_exposed_s, dp_sync_time_s, ring_reduce_scatter_s
from planner.cost.context import CostContext
from planner.cost.flops import block_params
from planner.cost.memory import bytes_per_param, replica_memory, stage_params
from planner.errors import InputError
from planner.spec import Training, load_model

GB = 1e9


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_model_states_follow_the_zero_paper(precision):
    """Rajbhandari et al. 2020, Fig. 1: per parameter, stage 1 keeps w + g + K/N bytes and stage 2
    w + (g + K)/N (the paper's fp16 case: 2 + 2 + 12/N and 2 + 14/N; here each precision's
    bytes).  At N = 64 the paper's 7.5B model goes 120 -> 31.4 -> 16.6 GB; our fp16 keeps a
    4-byte grad copy in K (K = 16): 20, 4.25 and 2.28 bytes per parameter."""
    model = load_model("megatron-gpt-7.5b")
    w, g, o = bytes_per_param(precision)
    n = 64
    states = {}
    for z in (0, 1, 2):
        ctx = CostContext(model=model, seq_len=2048, precision=precision, zero_stage=z)
        mem = replica_memory(ctx, None, 1, 1, model.num_layers, False, False, n, 1.0)
        states[z] = mem.weights_bytes + mem.grads_bytes + mem.optimizer_bytes
    params = stage_params(CostContext(model=model, seq_len=2048), model.num_layers, False, False)
    assert states[0] == pytest.approx(params * (w + g + o))
    assert states[1] == pytest.approx(params * (w + g + o / n))
    one_block_grads = block_params(model) * g       # the block whose gradients await their reduce-scatter
    assert states[2] == pytest.approx(params * (w + (g + o) / n) + one_block_grads)
    if precision == "fp16":
        per_param = [s / params for s in (states[0], states[1], states[2] - one_block_grads)]
        assert per_param == pytest.approx([20.0, 4.25, 2.28125])   # 2+2+16, 2+2+16/64, 2+18/64


def test_zero2_reduces_the_grads_once_per_micro_batch():
    model = load_model("megatron-gpt-7.5b")
    params, n, bw = 1e9, 8, 50e9
    z1 = CostContext(model=model, seq_len=2048, zero_stage=1)
    z2 = CostContext(model=model, seq_len=2048, zero_stage=2, num_micro_batches=4)
    rs = ring_reduce_scatter_s(params * z1.grad_bytes_per_param, n, bw * 0.8, 1e-5)
    one = dp_sync_time_s(z1, params, n, 1, bw, 0.0, "network")
    four = dp_sync_time_s(z2, params, n, 1, bw, 0.0, "network")
    assert four - one == pytest.approx(3 * rs, rel=1e-6)
    # each reduce-scatter hides behind its own micro-batch's backward
    assert dp_exposed_s(z2, four, last_backward_s=rs / 4) == pytest.approx(
        max(0.0, (four - one + rs) - 4 * rs / 4) + max(0.0, one - rs), rel=1e-6)
    assert dp_exposed_s(z2, four, last_backward_s=10.0, first_forward_s=10.0) == 0.0


@pytest.mark.parametrize("seed", [1, 4, 9])
def test_the_search_agrees_with_brute_force_on_zero2(seed):
    from tests.test_oracle import check_case, make_case
    cluster, model, training = make_case(seed)
    check_case(cluster, model, training.model_copy(update={"zero_stages": (1, 2)}))


@pytest.fixture(scope="module")
def one_stage_zero2():
    cluster = api.load_cluster("cluster_specs/tiny-2gpu.yaml")
    training = Training(global_batch_size=8, seq_len=256, zero_stages=(2,), max_stages=1)
    return cluster, api.plan(cluster, "opt-350m", training, time_limit_s=30).plan


def test_deepspeed_runs_zero2_without_a_pipeline_and_megatron_refuses_it(one_stage_zero2):
    import json
    cluster, plan = one_stage_zero2
    assert plan.zero_stage == 2 and plan.num_stages == 1
    files = api.launch(plan, "deepspeed", cluster=cluster, master_addr="10.0.0.1")
    config = json.loads(next(text for name, text in files.items() if name.endswith(".json") and "zero" in text))
    assert config["zero_optimization"]["stage"] == 2
    with pytest.raises(InputError, match="distributed optimizer"):
        api.launch(plan, "megatron", cluster=cluster, master_addr="10.0.0.1")


def test_deepspeed_refuses_zero2_with_a_pipeline(one_stage_zero2):
    from planner.launch.deepspeed import check
    from planner.plan import Plan
    _, plan = one_stage_zero2
    data = plan.to_json()
    data.pop("predicted", None), data.pop("solver", None), data.pop("launch", None)
    replica = {"gpu_type": "A100-SXM4-80GB", "micro_batch_share": 8, "tp": 1}
    data["stages"] = [{"index": 0, "blocks": [0, 12], "embedding": True, "head": False,
                       "replicas": [replica | {"devices": ["a100:0"]}]},
                      {"index": 1, "blocks": [12, 24], "embedding": False, "head": True,
                       "replicas": [replica | {"devices": ["a100:1"]}]}]
    piped = Plan.from_json(data)
    with pytest.raises(InputError, match="zero_stage 2 with 2 pipeline stages"):
        check(piped)


def test_launchers_narrow_the_search_to_what_they_run():
    from planner.launcher_space import narrow
    t = Training(global_batch_size=8, seq_len=256, zero_stages=(1, 2))
    assert narrow(t, "megatron").zero_stages == (1,)
    cluster = api.load_cluster("cluster_specs/tiny-2gpu.yaml")
    result = api.plan(cluster, "opt-350m", t.model_copy(update={"max_stages": 2}), time_limit_s=30,
                      launcher="deepspeed")
    assert not (result.plan.zero_stage == 2 and result.plan.num_stages > 1)
