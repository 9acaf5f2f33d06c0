"""Expert parallelism as a search knob (issue 20): the solver equals the brute-force oracle on
small MoE cases where EP competes with plain data parallelism, default searches are unchanged,
and the search's expert groups stay inside a zone."""

from __future__ import annotations

import random

import pytest
from test_oracle import check_case, make_case

from planner.cost import topology_for
from planner.search.classes import class_infos
from planner.search.knobs import enumerate_knobs
from planner.spec import Training, load_model


def moe_case(seed: int):
    """The oracle's random cluster and training (tests/test_oracle.py), its dense model turned
    into a 4-expert MoE with wide experts (so that EP's memory saving can decide a fit), EP
    degrees 1, 2 and 4 searched."""
    rng = random.Random(seed)
    cluster, dense, training = make_case(seed)
    mapping = dense.to_mapping()
    mapping.update(num_experts=4, moe_top_k=rng.choice([1, 2]),
                   moe_ffn_hidden_size=rng.choice([256, 1024, 4096]))
    if rng.random() < 0.5:
        mapping["num_shared_experts"] = 1
    return cluster, load_model(mapping), training.model_copy(update={"expert_parallel_degrees": (1, 2, 4)})


# seeds 3, 8, 9, 11, 14, 16, 25 pick ep = 2; the others ep = 1 or nothing fits
@pytest.mark.parametrize("seed", [0, 3, 5, 8, 9, 11, 14, 16, 22, 25])
def test_the_search_agrees_with_brute_force_on_moe(seed):
    check_case(*moe_case(seed))


def test_some_cases_are_won_by_expert_parallelism():
    """Else the equalities above would prove nothing about EP."""
    from planner.search.oracle import oracle
    wins = [s for s in (3, 8, 11) if (ref := oracle(*moe_case(s))).plan is not None
            and ref.plan.expert_parallel > 1]
    assert wins


def test_ep_is_searched_only_where_asked_and_possible():
    cluster, model, training = moe_case(3)
    classes = class_infos(topology_for(cluster), training.precision)
    default = training.model_copy(update={"expert_parallel_degrees": (1,)})
    assert {k.expert_parallel for k in enumerate_knobs(model, default, classes)} == {1}
    assert {k.expert_parallel for k in enumerate_knobs(model, training, classes)} == {1, 2, 4}
    # 3 does not divide 4 experts; DeepSpeed has no EP config; dense models have no experts
    three = training.model_copy(update={"expert_parallel_degrees": (1, 3)})
    assert {k.expert_parallel for k in enumerate_knobs(model, three, classes)} == {1}
    assert {k.expert_parallel for k in enumerate_knobs(model, training, classes, "deepspeed")} == {1}
    dense = load_model({k: v for k, v in model.to_mapping().items()
                        if not k.startswith(("num_experts", "moe_", "num_shared", "shared_"))})
    assert {k.expert_parallel for k in enumerate_knobs(dense, training, classes)} == {1}


def test_the_searched_expert_groups_stay_inside_a_zone():
    from planner import api
    cluster = api.load_cluster("cluster_specs/tiny-2zone.yaml")
    model = load_model({"name": "moe", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                        "vocab_size": 4096, "mlp": "swiglu", "num_experts": 4, "moe_top_k": 2,
                        "moe_ffn_hidden_size": 1024})
    training = Training(global_batch_size=8, seq_len=256, expert_parallel_degrees=(2, 4), max_stages=2)
    plan = api.plan(cluster, model, training, time_limit_s=60).plan
    topo = topology_for(cluster)
    ep = plan.expert_parallel
    assert ep > 1
    for st in plan.stages:
        for g in range(0, len(st.replicas), ep):
            zones = {topo.node_of(r.devices[0]).zone for r in st.replicas[g:g + ep]}
            assert len(zones) == 1, (st.index, zones)


def test_plan_expert_parallel_flag(capsys, tmp_path):
    import json

    import yaml

    from planner.cli.main import main
    model = tmp_path / "moe.yaml"
    model.write_text(yaml.safe_dump({"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8,
                                     "vocab_size": 4096, "mlp": "swiglu", "num_experts": 4, "moe_top_k": 2}))
    base = ["plan", "cluster_specs/tiny-2gpu.yaml", "--model", str(model), "--global-batch-size", "8",
            "--seq-len", "256", "--time-limit", "60", "--json", "--quiet"]
    assert main([*base, "--expert-parallel", "2"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["expert_parallel"] == 2
    assert plan["inputs"]["training"]["expert_parallel_degrees"] == [2]
    assert main([*base, "--expert-parallel", "0"]) == 2
    assert "expert-parallel degrees of 1 or more" in capsys.readouterr().err


def test_ep_degrees_none_of_which_the_model_takes_are_refused():
    # found by scripts/fuzz_plans.py: --expert-parallel 3 on 4 (or Mixtral's 8) experts, and EP 2
    # with --launcher deepspeed, searched EP 1, which the user had not allowed, without a word
    from planner import api
    from planner.errors import InputError

    cluster, model, training = moe_case(3)
    with pytest.raises(InputError, match=r"none divides the number of experts \(\S+ has 4\); choose among 1, 2, 4"):
        api.plan(cluster, model, training.model_copy(update={"expert_parallel_degrees": (3,)}), time_limit_s=10)
    with pytest.raises(InputError, match="--launcher deepspeed runs expert_parallel_degrees 1; the training allows "
                                         "only 2"):
        api.plan(cluster, model, training.model_copy(update={"expert_parallel_degrees": (2,)}), time_limit_s=10,
                 launcher="deepspeed")


def test_expert_parallel_on_a_dense_model_is_warned_about(capsys):
    """A dense model runs EP 1 whatever the flag says: the plan is made, and stderr says the
    degrees were ignored (before, not a word: often the wrong model was named)."""
    import json

    from planner.cli.main import main
    base = ["plan", "cluster_specs/tiny-2gpu.yaml", "--model", "opt-350m", "--global-batch-size", "8",
            "--seq-len", "256", "--time-limit", "30", "--json", "--quiet"]
    assert main([*base, "--expert-parallel", "2,4"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out).get("expert_parallel", 1) == 1      # the key is written above 1 only
    assert "warning: opt-350m has no experts; expert-parallel degrees 2,4 are ignored" in out.err
    assert main(base) == 0
    assert "no experts" not in capsys.readouterr().err


def test_code_users_get_the_same_warnings_on_the_result():
    """planner.api.plan carries the CLI's input warnings on ``result.warnings``: a script that
    names a dense model with EP degrees is told, as the shell user is."""
    from planner import api

    cluster = api.load_cluster("cluster_specs/tiny-2gpu.yaml")
    training = api.Training(global_batch_size=8, seq_len=256, expert_parallel_degrees=(1, 2))
    result = api.plan(cluster, "opt-350m", training, time_limit_s=30)
    assert any("opt-350m has no experts; expert-parallel degrees 1,2 are ignored" in w for w in result.warnings)
    plain = api.plan(cluster, "opt-350m", training.model_copy(update={"expert_parallel_degrees": (1,)}),
                     time_limit_s=30)
    assert not any("no experts" in w for w in plain.warnings)
    model = api.load_model("opt-350m")
    longer = api.input_warnings(cluster, model, training.model_copy(update={"seq_len": 2 * model.max_seq_len}))
    assert any("a longer context than it was trained with" in w for w in longer)
