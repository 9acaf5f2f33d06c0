"""The MoE fidelity rows (tests/fidelity/moe-megatron-bridge): read as their source states them,
planned as Megatron lays them out, priced without fitting (planner.cost.fidelity_moe)."""

from __future__ import annotations

from planner import catalog
from planner.cost.fidelity_moe import SET_DIR, build_plan, load_rows, measured_iteration_s, predict_rows
from planner.cost.flops import active_params, embedding_params, total_params
from planner.plan.check import check_plan
from planner.spec import load_cluster


def test_gpt_oss_120b_has_its_published_116_8b_total_and_5_1b_active():
    m = catalog.model("gpt-oss-120b")
    assert round(total_params(m) / 1e9, 1) == 116.8
    assert round((active_params(m) - embedding_params(m)) / 1e9, 1) == 5.1   # the card's, without the embedding


def test_rows_become_megatron_layouts_with_expert_groups_inside_a_node():
    rows = load_rows()
    assert [r["id"] for r in rows] == ["gpt-oss-120b-h100-26.02", "gpt-oss-120b-h100-25.11"]
    cluster = load_cluster(SET_DIR / rows[0]["cluster"])
    for row in rows:
        plan = build_plan(row)
        check_plan(cluster, plan)
        assert plan.expert_parallel == 8 and plan.num_stages == 4
        assert plan.micro_batch_size * plan.num_micro_batches == row["global_batch_size"]
        for st in plan.stages:
            for g in range(0, len(st.replicas), 8):
                assert len({r.node for r in st.replicas[g:g + 8]}) == 1
    # 1280 x 4096 tokens at 5993 tokens/s on each of 64 GPUs
    assert measured_iteration_s(rows[0]) == 1280 * 4096 / (5993 * 64)


def test_rows_are_priced_with_their_all_to_alls():
    for r in predict_rows():
        assert r.predicted_s > r.ep_comm_s > 0
