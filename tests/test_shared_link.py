"""A zone link's ``aggregate_bandwidth`` caps every flow across it together (DESIGN §2): the
sends of one stage boundary that cross it share it, in ``evaluate`` and in the search's
pricing alike (the oracle, which evaluates whole plans, must agree with the solver)."""

from __future__ import annotations

import pytest
from test_oracle import check_case

from planner.cost import evaluate
from planner.spec import Training, cluster_from_dict, load_model


def two_zones(aggregate: str | None) -> dict:
    link = {"between": ["za", "zb"], "bandwidth": "10 Gbit/s", "latency": "1 ms"}
    if aggregate:
        link["aggregate_bandwidth"] = aggregate
    return {"name": "capped", "zones": [{"name": "za"}, {"name": "zb"}], "links": [link], "nodes": [
        {"name": "a", "zone": "za", "gpu": "A100-SXM4-80GB", "gpus_per_node": 4,
         "network_bandwidth": "400 Gbit/s"},
        {"name": "b", "zone": "zb", "gpu": "A100-SXM4-80GB", "gpus_per_node": 4,
         "network_bandwidth": "400 Gbit/s"}]}


MODEL = {"name": "wide", "num_layers": 32, "hidden_size": 2048, "num_attention_heads": 16, "vocab_size": 32000}
# unfused attention (pinned): its s x s scores, kept without recompute, are what keep the model off
# one zone's GPUs, so the plan pipelines across the capped link; with flash one stage fits
TRAINING = Training(global_batch_size=8, seq_len=2048, schedules=("1f1b",), recompute_modes=("none",),
                    zero_stages=(1,), max_tp=1, max_stages=2, attention="unfused")


@pytest.fixture(scope="module")
def solved():
    res, _ = check_case(cluster_from_dict(two_zones("20 Gbit/s")), load_model(MODEL), TRAINING)
    return res


def test_solver_equals_oracle_with_a_binding_cap(solved):
    plan = solved.plan
    zones = {d.partition("-")[0][0] for s in plan.stages for r in s.replicas for d in r.devices}
    assert len(plan.stages) == 2 and zones == {"a", "b"}, "the case must pipeline across the link"


def test_cap_slows_the_crossing_sends_only_when_it_binds(solved):
    plan = solved.plan
    model = load_model(MODEL)
    capped = evaluate(cluster_from_dict(two_zones("20 Gbit/s")), plan, model=model)
    free = evaluate(cluster_from_dict(two_zones(None)), plan, model=model)
    loose = evaluate(cluster_from_dict(two_zones("10 Tbit/s")), plan, model=model)
    assert capped.breakdown_s["pp_comm"] > 1.5 * free.breakdown_s["pp_comm"]
    assert loose.iteration_time_s == free.iteration_time_s


def test_search_prices_the_cap_as_evaluate_does(solved):
    assert solved.report.priced_vs_evaluated_rel <= 1e-9
