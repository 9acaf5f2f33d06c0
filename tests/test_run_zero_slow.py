"""ZeRO-1/2/3 plans on the reference runner (planner.launch.zero_shards): the loss and every
parameter match the single-process reference, and what each rank held, measured from its
tensors, equals the ZeRO paper's formula (planner.cost.memory.zero_state_bytes) for the
runner's element size: stage 1 shards the optimizer state, 2 the gradients too, 3 the weights.
"""

from __future__ import annotations

import pytest

from planner.cost.memory import zero_state_bytes
from planner.launch import runner
from planner.plan import Plan
from tests.test_run_slow import GELU, STEPS, _reference, assert_matches_reference, make_plan, rep

pytestmark = pytest.mark.slow

ELEMENT_BYTES = 8  # the runs below train in float64


def zero_plan(stage: int) -> Plan:
    """Two pipeline stages; stage 0 in three replicas (uneven shares 2, 1, 1), stage 1 in two of
    tp 2: sharded three ways and, per tp shard, two ways. The embedding is tied across stages
    (summed apart from the shards)."""
    plan = make_plan(GELU, [
        ((0, 2), [rep(1, 2, ["z:0"]), rep(1, 1, ["z:1"]), rep(1, 1, ["z:2"])]),
        ((2, 4), [rep(2, 2, ["z:3", "z:4"]), rep(2, 2, ["z:5", "z:6"])]),
    ], mbs=4, nmb=2, schedule="1f1b")
    return Plan.from_json({**plan.to_json(), "zero_stage": stage})


def trained(plan: Plan) -> tuple:
    """(plan, the runner's result, the single-process reference) after STEPS steps in float64."""
    return plan, runner.run_plan(plan, steps=STEPS, dtype="float64", return_params=True), _reference(plan)


@pytest.fixture(scope="module", params=[1, 2, 3])
def zero_run(request):
    return (request.param, *trained(zero_plan(request.param)))


def test_zero_plans_match_the_single_process_reference(zero_run):
    _, _, result, reference = zero_run
    assert_matches_reference(result, reference)


def assert_held_bytes(held: dict, stage: int, shards: int) -> None:
    """A rank's held bytes against the ZeRO paper's formula over ``shards`` ranks (Adam: 3
    optimizer copies). The parameters are counted from the rank's full tensors when sharding
    began; shards are padded to equal size, at most shards - 1 elements each; ZeRO-3 releases
    the gathered weights between steps, so only the shard's copy stays."""
    psi = held["parameters"]
    w, g, o = zero_state_bytes(ELEMENT_BYTES, ELEMENT_BYTES, 3 * ELEMENT_BYTES, stage, shards)
    pad = shards * ELEMENT_BYTES * 3
    assert held["grads"] == pytest.approx(g * psi, abs=pad)
    assert held["optimizer"] == pytest.approx(o * psi, abs=pad)
    assert held["weights"] == (0 if stage >= 3 else pytest.approx(w * psi))


def test_held_bytes_follow_the_zero_formula(zero_run):
    stage, plan, result, _ = zero_run
    assert result.zero_state_bytes and len(result.zero_state_bytes) == 7
    for r in result.ranks:
        assert_held_bytes(result.zero_state_bytes[r.rank], stage, len(plan.stages[r.stage].replicas))


def test_zero3_with_context_parallelism_matches_the_reference():
    """ZeRO-3 shards over replicas x cp ranks (the weights are replicated over cp): stage 0 in
    two replicas of 2 cp ranks (4 shards), stage 1 one replica of 2 (2 shards)."""
    from tests.test_context_parallel import _runner_plan
    from tests.test_run_slow import SWIGLU_GQA
    plan = _runner_plan(SWIGLU_GQA, [
        ((0, 2), [rep(1, 1, ["c:0", "c:1"]), rep(1, 1, ["c:2", "c:3"])]),
        ((2, 4), [rep(1, 2, ["c:4", "c:5"])]),
    ], mbs=2, nmb=2, cp=2)
    plan = Plan.from_json({**plan.to_json(), "zero_stage": 3})
    _, result, reference = trained(plan)
    assert_matches_reference(result, reference)
    for r in result.ranks:
        assert_held_bytes(result.zero_state_bytes[r.rank], 3, 4 if r.stage == 0 else 2)


# -- HSDP (zero_shard_degree): ZeRO inside groups of replicas, all-reduce across them --------
def hsdp_plan(stage: int) -> Plan:
    """One stage in four replicas (uneven shares 2, 1, 1, 1) on 4 ranks, ZeRO in two groups of
    two consecutive replicas (planner.launch.hsdp_groups): shards over 2 ranks, not 4."""
    plan = make_plan(GELU, [((0, 4), [rep(1, 2, ["h:0"]), rep(1, 1, ["h:1"]), rep(1, 1, ["h:2"]),
                                      rep(1, 1, ["h:3"])])], mbs=5, nmb=2, schedule="1f1b")
    return Plan.from_json({**plan.to_json(), "zero_stage": stage, "zero_shard_degree": 2})


@pytest.fixture(scope="module", params=[1, 3])
def hsdp_run(request):
    return (request.param, *trained(hsdp_plan(request.param)))


def test_hsdp_plans_match_the_single_process_reference(hsdp_run):
    _, _, result, reference = hsdp_run
    assert_matches_reference(result, reference)


def test_hsdp_held_bytes_follow_the_zero_formula_over_the_shard_group(hsdp_run):
    stage, plan, result, _ = hsdp_run
    assert result.zero_state_bytes and len(result.zero_state_bytes) == 4
    for r in result.ranks:
        assert_held_bytes(result.zero_state_bytes[r.rank], stage, plan.zero_shard_degree)


def test_hsdp_with_context_parallelism_matches_the_reference():
    """ZeRO-2 HSDP with cp 2 and shard degree 1: each replica's two cp ranks are a shard group
    (2 shards), the two replicas replicate each other (the d = 1 and cp paths of hsdp_groups)."""
    from tests.test_context_parallel import _runner_plan
    from tests.test_run_slow import SWIGLU_GQA
    plan = _runner_plan(SWIGLU_GQA, [((0, 4), [rep(1, 1, ["c:0", "c:1"]), rep(1, 1, ["c:2", "c:3"])])],
                        mbs=2, nmb=2, cp=2)
    plan = Plan.from_json({**plan.to_json(), "zero_stage": 2, "zero_shard_degree": 1})
    _, result, reference = trained(plan)
    assert_matches_reference(result, reference)
    for held in result.zero_state_bytes.values():
        assert_held_bytes(held, 2, 2)


def test_hsdp_with_tensor_parallelism_matches_the_reference():
    """ZeRO-1 HSDP on tp 2: four replicas of two ranks, shard groups of two replicas per tp
    position (planner.launch.hsdp_groups), so each tp slice of the weights is sharded 2 ways
    and replicated across the two groups: 8 gloo ranks."""
    plan = make_plan(GELU, [((0, 4), [rep(2, 1, ["t:0", "t:1"]), rep(2, 1, ["t:2", "t:3"]),
                                      rep(2, 1, ["t:4", "t:5"]), rep(2, 1, ["t:6", "t:7"])])],
                     mbs=4, nmb=2, schedule="1f1b")
    plan = Plan.from_json({**plan.to_json(), "zero_stage": 1, "zero_shard_degree": 2})
    _, result, reference = trained(plan)
    assert_matches_reference(result, reference)
    for held in result.zero_state_bytes.values():
        assert_held_bytes(held, 1, 2)
