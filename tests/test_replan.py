"""replan: an old plan checked against a changed cluster, and a fresh search beside it."""

from __future__ import annotations

import json

import pytest

from planner import api
from planner.cli.main import main

MODEL = {"name": "small", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000}
TRAINING = api.Training(global_batch_size=8, seq_len=256)

BIG = """\
name: shrinking
nodes:
  - {name: a100, count: 2, gpu: A100-SXM4-80GB, gpus_per_node: 2, network_bandwidth: 100 Gbit/s}
"""
SMALL = BIG.replace("count: 2", "count: 1")


def _old_plan(tmp_path):
    (tmp_path / "big.yaml").write_text(BIG)
    (tmp_path / "small.yaml").write_text(SMALL)
    cluster = api.load_cluster(tmp_path / "big.yaml")
    result = api.plan(cluster, api.load_model(MODEL), TRAINING, time_limit_s=30)
    (tmp_path / "plan.json").write_text(result.plan.dumps())
    return result


def test_replan_after_losing_a_node(tmp_path, capsys):
    old = _old_plan(tmp_path)
    assert any(d.startswith("a100-1:") for d in old.plan.devices()), "the old plan should use both nodes"
    small = api.load_cluster(tmp_path / "small.yaml")
    result = api.replan(small, old.plan, time_limit_s=30)
    assert not result.old_valid
    assert any("a100-1" in line for line in result.old_problems)
    assert result.old_evaluation is None and result.speedup is None
    assert all(d.startswith("a100-0:") for d in result.plan.devices())
    # The CLI is a CI gate: exit 4 when the old plan no longer runs, the new plan written.
    out = tmp_path / "new.json"
    code = main(["replan", str(tmp_path / "small.yaml"), str(tmp_path / "plan.json"), "--json",
                 "-o", str(out), "--time-limit", "30"])
    assert code == 4
    summary = json.loads(capsys.readouterr().out)
    assert summary["old_plan_valid"] is False and summary["new_tokens_per_s"] > 0
    assert api.Plan.from_json(json.loads(out.read_text())).devices() == result.plan.devices()


def test_replan_on_the_same_cluster_keeps_the_plan(tmp_path):
    old = _old_plan(tmp_path)
    cluster = api.load_cluster(tmp_path / "big.yaml")
    result = api.replan(cluster, old.plan, time_limit_s=30)
    assert result.old_valid and result.old_problems == []
    assert result.speedup is not None and abs(result.speedup - 1.0) < 1e-9
    assert result.kept_devices == len(old.plan.devices())


def test_replan_without_training_is_bad_input(tmp_path, capsys):
    old = _old_plan(tmp_path)
    data = old.plan.to_json()
    data["inputs"]["training"] = {"seq_len": 256}
    (tmp_path / "broken.json").write_text(json.dumps(data))
    assert main(["replan", str(tmp_path / "small.yaml"), str(tmp_path / "broken.json")]) == 2
    err = capsys.readouterr().err
    assert "broken.json" in err and "global_batch_size" in err and "Traceback" not in err


def test_old_plan_that_no_longer_fits_memory_is_invalid(tmp_path):
    from planner.replan import old_plan_status

    old = _old_plan(tmp_path)
    tight = BIG.replace("gpu: A100-SXM4-80GB", "gpu: {name: tiny-mem, memory: 1 MB, peak_tflops: 312, "
                        "memory_bandwidth: 2039 GB/s, intra_node_bandwidth: 300 GB/s}")
    (tmp_path / "tight.yaml").write_text(tight)
    data = old.plan.to_json()
    for stage in data["stages"]:
        for rep in stage["replicas"]:
            rep["gpu_type"] = "tiny-mem"
    cluster = api.load_cluster(tmp_path / "tight.yaml")
    problems, evaluation = old_plan_status(cluster, api.Plan.from_json(data))
    assert evaluation is None
    assert problems and all("a100-" in p for p in problems)
    same, ev = old_plan_status(api.load_cluster(tmp_path / "big.yaml"), old.plan)
    assert same == [] and ev.tokens_per_s == pytest.approx(old.evaluation.tokens_per_s, rel=1e-12)


# -- warm start, migration, --max-moved-fraction (issue 18) ---------------------------------
DP_MODEL = {"name": "small", "num_layers": 8, "hidden_size": 512, "num_attention_heads": 8, "vocab_size": 1000}
DP_TRAINING = api.Training(global_batch_size=16, seq_len=512)


def _named(names: list[str]) -> str:
    return "name: c\nnodes:\n" + "".join(
        f"  - {{name: {n}, gpu: A100-SXM4-80GB, gpus_per_node: 2, network_bandwidth: 100 Gbit/s}}\n" for n in names)


@pytest.fixture(scope="module")
def four_node_plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("four")
    (d / "old.yaml").write_text(_named(["n0", "n1", "n2", "n3"]))
    old = api.plan(api.load_cluster(d / "old.yaml"), api.load_model(DP_MODEL), DP_TRAINING, time_limit_s=20)
    assert {dev.split(":")[0] for dev in old.plan.devices()} == {"n0", "n1", "n2", "n3"}
    return d, old


def test_unchanged_cluster_gives_the_old_plan_back_and_moves_nothing(four_node_plan):
    d, old = four_node_plan
    # a short limit: the old plan is the first candidate, so the answer is never worse
    result = api.replan(api.load_cluster(d / "old.yaml"), old.plan, time_limit_s=2)
    assert result.chosen.source == "old plan"
    assert result.evaluation.tokens_per_s >= old.evaluation.tokens_per_s * (1 - 1e-12)
    assert result.migration.moved_bytes == 0 and result.migration.time_s == 0
    assert result.plan.devices() == old.plan.devices()


def test_lost_node_moves_only_its_state_to_a_spare(four_node_plan, tmp_path):
    from planner.cost import topology_for
    from planner.migrate import shards

    _d, old = four_node_plan
    (tmp_path / "new.yaml").write_text(_named(["n0", "n2", "n3", "n4"]))
    cluster = api.load_cluster(tmp_path / "new.yaml")
    result = api.replan(cluster, old.plan, time_limit_s=20)
    assert not result.old_valid
    # n1's replicas went to the spare n4, every other device kept its place: n4 is new, not
    # moved (it was counted as moved, against `planner diff`'s added)
    assert result.moved_devices == [] and result.kept_devices == len(old.plan.devices()) - 2
    assert result.added_devices == ["n4:0", "n4:1"] and result.removed_devices == ["n1:0", "n1:1"]
    changes = api.diff(old.plan, result.plan)
    assert changes.devices_added == result.added_devices and changes.devices_removed == result.removed_devices
    assert [m["device"] for m in changes.devices_moved] == result.moved_devices
    lost = shards(old.plan, api.load_model(DP_MODEL))
    lost_bytes = sum(s.weights_bytes + s.optimizer_bytes for dev in ("n1:0", "n1:1") for s in lost[dev])
    assert result.migration.moved_bytes == pytest.approx(lost_bytes, rel=1e-12)
    # the repaired plan was the search's first incumbent and nothing beat it: the search's
    # answer is that plan, its devices as named (a plan found again would have moved more)
    assert result.search.report.model_extra["answer_is_given"]
    assert result.fresh_as_named.moved_bytes == result.migration.moved_bytes
    assert result.migration.from_checkpoint_bytes == 0       # the DP twins still hold everything
    # priced on the new cluster's links: one device's share of 100 Gbit/s NICs
    path = topology_for(cluster).p2p("n0:0", "n4:0")
    per_device = lost_bytes / 2
    assert result.migration.time_s == pytest.approx(path.latency_s + per_device / path.bandwidth_Bps, rel=1e-9)


def test_the_old_plan_is_the_searchs_cutoff(four_node_plan):
    """The old plan enters the search before anything else: with a work budget too small to
    find or prove anything, the search still answers the old plan, moving nothing."""
    d, old = four_node_plan
    cluster = api.load_cluster(d / "old.yaml")
    tiny = api.replan(cluster, old.plan, time_limit_s=60, work_budget=1)
    assert tiny.search.report.model_extra["answer_is_given"]
    assert tiny.search.plan.devices() == old.plan.devices()
    assert tiny.search.evaluation.iteration_time_s == old.evaluation.iteration_time_s
    assert tiny.migration.moved_bytes == 0 and tiny.moved_devices == []
    # with time to search, its cutoff prunes: no tuple is solved that cannot beat the old plan,
    # and the answer is never slower than it
    full = api.replan(cluster, old.plan, time_limit_s=20)
    assert full.search.evaluation.iteration_time_s <= old.evaluation.iteration_time_s
    plain = api.plan(cluster, api.load_model(DP_MODEL), DP_TRAINING, time_limit_s=20)
    seeded, fresh = full.search.report.model_extra, plain.report.model_extra
    assert seeded["knob_tuples_solved"] <= fresh["knob_tuples_solved"]
    assert seeded["knob_tuples_pruned"] >= fresh["knob_tuples_pruned"]


def test_given_plan_of_another_batch_is_bad_input(four_node_plan):
    from planner.search import solve

    d, old = four_node_plan
    cluster = api.load_cluster(d / "old.yaml")
    bad = old.plan.model_copy(update={"micro_batch_size": old.plan.micro_batch_size * 2})
    with pytest.raises(api.InputError, match="global batch"):
        solve(cluster, api.load_model(DP_MODEL), DP_TRAINING, time_limit_s=5, incumbents=[bad])


def test_max_moved_fraction_is_honoured(four_node_plan, tmp_path, capsys):
    from planner.cost.flops import total_params
    from planner.cost.memory import bytes_per_param

    _d, old = four_node_plan
    (tmp_path / "plan.json").write_text(old.plan.dumps())
    (tmp_path / "spare.yaml").write_text(_named(["n0", "n2", "n3", "n4"]))
    (tmp_path / "fewer.yaml").write_text(_named(["n0", "n2", "n3"]))
    # no spare: the repair drops n1's replicas; the rest keep their weights, and under ZeRO-1
    # only the optimizer ranges that change with 8 -> 6 replicas move
    fewer = api.replan(api.load_cluster(tmp_path / "fewer.yaml"), old.plan, time_limit_s=20)
    assert fewer.chosen.source == "old plan repaired"
    assert sum(r.micro_batch_share for r in fewer.plan.stages[0].replicas) == old.plan.micro_batch_size
    _, _, opt_per_param = bytes_per_param("bf16")
    if old.plan.zero_stage == 1:
        old_index = [0, 1, 4, 5, 6, 7]     # the surviving replicas' places among the old 8
        moved_share = sum(1 / 6 - max(0.0, min((j + 1) / 6, (o + 1) / 8) - max(j / 6, o / 8))
                          for j, o in enumerate(old_index))
    else:
        moved_share = 0.0
    expected = moved_share * total_params(api.load_model(DP_MODEL)) * opt_per_param
    assert fewer.migration.moved_bytes == pytest.approx(expected, rel=1e-9, abs=1e-6)
    assert fewer.migration.moved_bytes <= fewer.fresh_as_named.moved_bytes
    assert (fewer.migration.time_s > 0) == (expected > 0)     # resharding crosses the network
    at = fewer.migration.moved_fraction
    same = api.replan(api.load_cluster(tmp_path / "fewer.yaml"), old.plan, time_limit_s=20, max_moved_fraction=at)
    assert same.chosen.source == "old plan repaired"
    # with the spare, every plan moves n1's quarter of the state: 10% accepts none (exit 1)
    code = main(["replan", str(tmp_path / "spare.yaml"), str(tmp_path / "plan.json"), "--time-limit", "20",
                 "--max-moved-fraction", "0.1"])
    assert code == 1
    assert "max-moved-fraction" in capsys.readouterr().err
    code = main(["replan", str(tmp_path / "spare.yaml"), str(tmp_path / "plan.json"), "--time-limit", "20",
                 "--max-moved-fraction", "0.3", "--migration-steps", "100", "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 4 and summary["migration"]["moved_fraction"] == pytest.approx(0.25, rel=1e-6)
    assert summary["search_kept_old_plan"] is True     # the repaired plan, first incumbent, won
    assert main(["replan", str(tmp_path / "spare.yaml"), str(tmp_path / "plan.json"),
                 "--max-moved-fraction", "1.5"]) == 2


def test_migration_steps_weigh_the_move_against_the_speedup(tmp_path):
    # the old plan ran on three nodes; a fourth joins: the fresh plan on all four is a little
    # faster but moves state; spread over one step the move loses, over a million it wins
    (tmp_path / "three.yaml").write_text(_named(["n0", "n1", "n2"]))
    (tmp_path / "four.yaml").write_text(_named(["n0", "n1", "n2", "n3"]))
    old = api.plan(api.load_cluster(tmp_path / "three.yaml"), api.load_model(DP_MODEL), DP_TRAINING, time_limit_s=20)
    four = api.load_cluster(tmp_path / "four.yaml")
    plain = api.replan(four, old.plan, time_limit_s=20)
    assert plain.old_valid and plain.chosen.source == "fresh search"
    fresh_s, old_s = plain.fresh.evaluation.iteration_time_s, plain.repaired.evaluation.iteration_time_s
    assert fresh_s < old_s and plain.fresh.migration.time_s > 0
    one = api.replan(four, old.plan, time_limit_s=20, migration_steps=1)
    many = api.replan(four, old.plan, time_limit_s=20, migration_steps=10**6)
    assert fresh_s + one.fresh.migration.time_s > old_s      # the premise of the next line
    assert one.chosen.source == "old plan" and one.migration.moved_bytes == 0
    assert many.chosen.source == "fresh search"


def test_relabel_undoes_a_permutation_of_identical_nodes(four_node_plan):
    from planner.cost import topology_for
    from planner.migrate import migration
    from planner.repair import _renamed, relabel

    d, old = four_node_plan
    cluster = api.load_cluster(d / "old.yaml")
    topo, model = topology_for(cluster), api.load_model(DP_MODEL)
    shuffled = _renamed(old.plan, {"n0": "n2", "n1": "n3", "n2": "n1", "n3": "n0"})
    assert migration(old.plan, shuffled, model, topo).moved_bytes > 0
    back = relabel(shuffled, old.plan, model, topo)
    assert migration(old.plan, back, model, topo).moved_bytes == 0
    assert api.evaluate(cluster, back).iteration_time_s == api.evaluate(cluster, shuffled).iteration_time_s


def test_given_plan_is_keyed_under_a_cost_objective(tmp_path):
    """Under --objective cost the given plan is keyed by its node rent x time, as the search
    keys its own candidates: with no work to find anything else it is the answer, at its value."""
    from planner.search import solve

    priced = _named(["n0", "n1"]).replace("network_bandwidth: 100 Gbit/s", "network_bandwidth: 100 Gbit/s, price_per_hour: 8.0")
    (tmp_path / "priced.yaml").write_text(priced)
    cluster = api.load_cluster(tmp_path / "priced.yaml")
    model = api.load_model(DP_MODEL)
    old = api.plan(cluster, model, DP_TRAINING, objective="cost", time_limit_s=20)
    res = solve(cluster, model, DP_TRAINING, objective="cost", time_limit_s=60, work_budget=1, incumbents=[old.plan])
    assert res.report.model_extra["answer_is_given"] and res.plan.devices() == old.plan.devices()
    ev = res.evaluation
    assert res.report.objective == pytest.approx(ev.nodes_usd_per_hour * ev.iteration_time_s, rel=1e-12)


def test_a_given_plan_is_priced_with_the_searchs_training(tmp_path):
    """A plan handed to the search whole is priced as the answer it may become (given.as_answer
    writes the search's training into it): a plan written for flash attention, given to a search
    of the unfused core, is priced unfused, so the search's value is what evaluate says of the
    plan it returns, not the flash plan's faster time."""
    from planner.search import solve

    (tmp_path / "two.yaml").write_text(_named(["n0", "n1"]))
    cluster = api.load_cluster(tmp_path / "two.yaml")
    model = api.load_model(DP_MODEL)
    # 2048 tokens: long enough for the s x s scores to price the two kernels apart
    training = DP_TRAINING.model_copy(update={"seq_len": 2048})
    flash = api.plan(cluster, model, training, time_limit_s=20)   # flash: the default
    assert flash.plan.training_choice("attention") == "flash"
    unfused = training.model_copy(update={"attention": "unfused"})
    res = solve(cluster, model, unfused, time_limit_s=60, work_budget=1, incumbents=[flash.plan])
    assert res.plan.training_choice("attention") == "unfused"
    assert api.evaluate(cluster, res.plan).iteration_time_s > flash.evaluation.iteration_time_s   # kernels apart
    assert res.report.model_extra["priced_vs_evaluated_rel"] <= 1e-9
    assert res.report.objective == pytest.approx(api.evaluate(cluster, res.plan).iteration_time_s, rel=1e-9)


# -- an old plan inconsistent in itself is bad input (exit 2), not a cluster change (exit 4) --
def _hand_plan() -> dict:
    """A 2-stage plan of MODEL on BIG (no search): stage 0 on a100-0, stage 1 on a100-1."""
    def reps(node):
        return [{"gpu_type": "A100-SXM4-80GB", "tp": 1, "micro_batch_share": 1, "devices": [f"{node}:{k}"]}
                for k in range(2)]
    return {"schema": "planner.plan/v1",
            "inputs": {"cluster": "shrinking", "model": dict(MODEL),
                       "training": {"global_batch_size": 8, "seq_len": 256},
                       "profiles": {"estimated": ["A100-SXM4-80GB/block/mb1/tp1"], "measured": [],
                                    "interpolated": []}},
            "micro_batch_size": 2, "num_micro_batches": 4, "schedule": "1f1b",
            "stages": [{"index": 0, "blocks": [0, 2], "embedding": True, "head": False, "replicas": reps("a100-0")},
                       {"index": 1, "blocks": [2, 4], "embedding": False, "head": True, "replicas": reps("a100-1")}],
            "solver": {"method": "milp", "status": "optimal", "objective": 1.0}}


def _set(path, value):
    def mutate(d):
        *head, last = path
        for key in head:
            d = d[key]
        d[last] = value
    return mutate


INCONSISTENT = [
    ("blocks_short", _set(("stages", 1, "blocks"), [2, 3]), "stages[1].blocks", "cover blocks [0, 4) of small"),
    ("blocks_beyond", _set(("stages", 1, "blocks"), [2, 6]), "stages[1].blocks", "they end at 6"),
    ("blocks_gap", _set(("stages", 1, "blocks"), [3, 4]), "stages[1].blocks", "contiguous"),
    ("blocks_overlap", _set(("stages", 1, "blocks"), [1, 4]), "stages[1].blocks", "contiguous"),
    ("dev_dup", _set(("stages", 1, "replicas", 0, "devices"), ["a100-0:0"]), "stages[1].replicas[0].devices[0]",
     "used twice"),
    ("emb_twice", _set(("stages", 1, "embedding"), True), "stages[1].embedding", "stage 0 only"),
    ("no_head", _set(("stages", 1, "head"), False), "stages[1].head", "must hold the head"),
    ("share_sum_wrong", _set(("stages", 1, "replicas", 0, "micro_batch_share"), 3), "stages[1].replicas",
     "sums to 4"),
    ("stage_index_wrong", _set(("stages", 1, "index"), 7), "stages[1].index", "position 1 has index 7"),
    ("mbs_mismatch_gbs", _set(("num_micro_batches",), 3), "num_micro_batches", "global_batch_size is 8"),
    ("gpu_type_unknown", _set(("stages", 1, "replicas", 0, "gpu_type"), "Z9000"),
     "stages[1].replicas[0].gpu_type", "'Z9000' is no GPU type"),
    # a model of other layers under the same name: not a model to search for
    ("model_layers", _set(("inputs", "model", "num_layers"), 6), "stages[1].blocks", "cover blocks [0, 6) of small"),
    ("model_other", _set(("inputs", "model"), "llama3-70b"), "stages[1].blocks",
     "cover blocks [0, 80) of llama3-70b; they end at 4"),
]


@pytest.mark.parametrize("mutate, field, why", [c[1:] for c in INCONSISTENT], ids=[c[0] for c in INCONSISTENT])
def test_inconsistent_old_plan_is_bad_input_not_a_cluster_change(tmp_path, capsys, mutate, field, why):
    (tmp_path / "big.yaml").write_text(BIG)
    data = _hand_plan()
    mutate(data)
    (tmp_path / "plan.json").write_text(json.dumps(data))
    out = tmp_path / "new.json"
    code = main(["replan", str(tmp_path / "big.yaml"), str(tmp_path / "plan.json"), "--time-limit", "5",
                 "-o", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert f"plan.json: {field}: " in captured.err and why in captured.err
    assert "not a cluster change" in captured.err and "Traceback" not in captured.err
    assert captured.out == "" and not out.exists()
    from planner.replan import InconsistentPlan

    with pytest.raises(InconsistentPlan) as exc:     # the API alike, each problem naming its field
        api.replan(api.load_cluster(tmp_path / "big.yaml"), api.load_plan(tmp_path / "plan.json"), time_limit_s=5)
    assert any(e.location.field == field for e in exc.value.errors)


def test_consistent_plan_on_a_changed_cluster_is_still_exit_4(tmp_path, capsys):
    """What a cluster change explains stays exit 4: a node gone, a node now of another (known)
    GPU type, a GPU type of the plan's own cost records that the cluster no longer has."""
    (tmp_path / "small.yaml").write_text(SMALL)
    (tmp_path / "h100.yaml").write_text(BIG.replace("A100-SXM4-80GB", "H100-SXM5-80GB"))
    custom = _hand_plan()
    for stage in custom["stages"]:
        for rep in stage["replicas"]:
            rep["gpu_type"] = "my-gpu"
    custom["inputs"]["profiles"]["estimated"] = ["my-gpu/block/mb1/tp1"]
    for cluster, data in (("small.yaml", _hand_plan()), ("h100.yaml", _hand_plan()), ("h100.yaml", custom)):
        (tmp_path / "plan.json").write_text(json.dumps(data))
        code = main(["replan", str(tmp_path / cluster), str(tmp_path / "plan.json"), "--time-limit", "5", "--json"])
        captured = capsys.readouterr()
        assert code == 4, captured.err
        assert json.loads(captured.out)["old_plan_valid"] is False


def test_replan_prints_a_rounding_noise_gap_as_0_as_plan_does():
    from planner.cli.replan import gap_text

    assert gap_text(1.67e-16) == "0%" and gap_text(0.0) == "0%" and gap_text(None) == "n/a"
    assert gap_text(0.0177) == "1.77%"


def test_replan_json_on_no_plan_prints_the_reason_on_stdout(four_node_plan, tmp_path, capsys):
    """A CI gate reading --json got an empty stdout on exit 1 (a robustness sweep)."""
    _d, old = four_node_plan
    (tmp_path / "plan.json").write_text(old.plan.dumps())
    # n1 lost with no spare: no repair, and the fresh plan moves state, over a fraction of 0
    (tmp_path / "new.yaml").write_text(_named(["n0", "n2", "n3"]))
    code = main(["replan", str(tmp_path / "new.yaml"), str(tmp_path / "plan.json"), "--json",
                 "--time-limit", "10", "--max-moved-fraction", "0"])
    assert code == 1
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["status"] == "no-plan" and summary["exit_code"] == 1
    assert "--max-moved-fraction" in summary["reason"] and "--max-moved-fraction" in captured.err


def test_replan_on_gpus_without_bf16_advises_what_replan_can_do(tmp_path, capsys):
    """replan has no --precision: it told the user to "train with --precision fp16"."""
    _old_plan(tmp_path)
    (tmp_path / "v100.yaml").write_text(BIG.replace("A100-SXM4-80GB", "V100-SXM2-32GB"))
    assert main(["replan", str(tmp_path / "v100.yaml"), str(tmp_path / "plan.json"), "--time-limit", "5"]) == 1
    err = capsys.readouterr().err
    assert "computes in bf16" in err and "`planner plan CLUSTER --model MODEL.yaml" in err, err
    assert "--precision fp16`" in err and "inputs.training.precision to fp16" in err
    assert "train with --precision" not in err
