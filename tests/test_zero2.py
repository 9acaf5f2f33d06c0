"""ZeRO-2: gradients sharded with the optimizer state and reduce-scattered after every
micro-batch (tests/test_zero.py has the memory figures and ZeRO-3): the sync's volume and
overlap, the search against brute force, DeepSpeed's stage 2."""

from __future__ import annotations

import pytest

from planner import api
from planner.cost.comm import dp_exposed_s, dp_sync_time_s, ring_reduce_scatter_s
from planner.cost.context import CostContext
from planner.errors import InputError
from planner.spec import Training, load_model

GB = 1e9


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


def test_deepspeed_runs_zero2_without_a_pipeline(one_stage_zero2):
    import json
    cluster, plan = one_stage_zero2
    assert plan.zero_stage == 2 and plan.num_stages == 1
    files = api.launch(plan, "deepspeed", cluster=cluster, master_addr="10.0.0.1")
    config = json.loads(next(text for name, text in files.items() if name.endswith(".json") and "zero" in text))
    assert config["zero_optimization"]["stage"] == 2


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


def test_deepspeed_search_leaves_zero2_pipelines_out():
    t = Training(global_batch_size=8, seq_len=256, zero_stages=(1, 2))
    cluster = api.load_cluster("cluster_specs/tiny-2gpu.yaml")
    result = api.plan(cluster, "opt-350m", t.model_copy(update={"max_stages": 2}), time_limit_s=30,
                      launcher="deepspeed")
    assert not (result.plan.zero_stage == 2 and result.plan.num_stages > 1)
