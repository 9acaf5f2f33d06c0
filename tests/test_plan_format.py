"""Plan files: reading, the JSON Schema, cross-checks against cluster and model, rank map."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from planner.errors import InputError, InputErrors
from planner.plan import Plan
from planner.plan.check import check_plan, load_plan, plan_from_data
from planner.plan.rankmap import build_launch
from planner.plan.schema import plan_schema, validate_plan_json
from planner.spec import load_cluster

SPECS = Path(__file__).resolve().parent.parent / "cluster_specs"


@pytest.fixture(scope="module")
def mixed():
    return load_cluster(SPECS / "tiny-mixed.yaml")


def hand_plan() -> dict:
    """A hand-written plan on tiny-mixed: opt-350m (24 layers, 16 heads) in two stages,
    stage 0 on one A100 pair (tp 2) plus two single V100s with uneven shares."""
    return {
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "tiny-mixed", "model": "opt-350m",
                   "training": {"global_batch_size": 32, "seq_len": 2048, "precision": "fp16"}},
        "micro_batch_size": 4, "num_micro_batches": 8, "schedule": "1f1b",
        "stages": [
            {"index": 0, "blocks": [0, 14], "embedding": True, "head": False, "replicas": [
                {"gpu_type": "A100-SXM4-80GB", "tp": 2, "micro_batch_share": 2,
                 "devices": ["a100:0", "a100:1"]},
                {"gpu_type": "v100-32gb", "tp": 1, "micro_batch_share": 1, "devices": ["v100:0"]},
                {"gpu_type": "V100-SXM2-32GB", "tp": 1, "micro_batch_share": 1, "devices": ["v100:1"]}]},
            {"index": 1, "blocks": [14, 24], "embedding": False, "head": True, "replicas": [
                {"gpu_type": "a100-sxm4-80gb", "tp": 2, "micro_batch_share": 4,
                 "devices": ["a100:3", "a100:2"]}]},
        ],
    }


def errors_of(exc: InputErrors) -> dict[str, str]:
    return {e.location.field: e.message for e in exc.errors}


def check(cluster, data):
    check_plan(cluster, Plan.from_json(data), file="p.json")


def test_hand_plan_is_valid(mixed):
    data = hand_plan()
    validate_plan_json(data)
    check(mixed, data)


def test_to_json_passes_schema_with_outputs(mixed):
    plan = Plan.from_json(hand_plan())
    plan = plan.model_copy(update={"launch": build_launch(mixed, plan)})
    full = plan.to_json()
    full["predicted"] = {"iteration_time_s": 1.5, "tokens_per_s": 4e4, "samples_per_s": 21.3, "mfu": 0.4,
                         "usd_per_hour": None, "breakdown_s": {"compute": 1.0, "bubble": 0.5},
                         "peak_memory_bytes": {"a100:0": 3e10}}
    full["solver"] = {"method": "milp", "status": "optimal", "gap": 0.0, "candidates": 12}
    validate_plan_json(full)
    assert Plan.from_json(full).dumps() == Plan.from_json(json.loads(Plan.from_json(full).dumps())).dumps()


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.pop("stages"), None),
    (lambda d: d.update(schema="planner.plan/v2"), "schema"),
    (lambda d: d.update(schedule="chimera"), "schedule"),
    (lambda d: d["stages"][0]["replicas"][0].update(tp=0), "stages[0].replicas[0].tp"),
    (lambda d: d["stages"][1]["replicas"][0]["devices"].append("a100-2"), "stages[1].replicas[0].devices[2]"),
    (lambda d: d["stages"][0].update(color="red"), "stages[0]"),
    (lambda d: d["inputs"]["training"].pop("seq_len"), "inputs.training"),
    (lambda d: d.update(zero_stage=4), "zero_stage"),
    (lambda d: d.update(reshard_after_forward="yes"), "reshard_after_forward"),
])
def test_broken_plans_fail_schema(mutate, field):
    data = hand_plan()
    mutate(data)
    with pytest.raises(InputErrors) as exc:
        validate_plan_json(data, file="p.json")
    fields = [e.location.field for e in exc.value.errors]
    assert field in fields
    assert all(e.location.file == "p.json" for e in exc.value.errors)


def test_schema_is_draft_2020_12_and_lists_required():
    schema = plan_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    assert schema["required"] == ["schema", "inputs", "micro_batch_size", "num_micro_batches", "stages"]


def test_load_plan_reports_bad_json_position(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text('{\n  "schema": "planner.plan/v1",\n  "stages": [,]\n}\n')
    with pytest.raises(InputError) as exc:
        load_plan(path)
    assert exc.value.location.line == 3 and exc.value.location.column == 14
    assert str(path) in str(exc.value)


def test_load_plan_schema_version_and_missing_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**hand_plan(), "schema": "planner.plan/v0"}))
    with pytest.raises(InputError, match="reads \"planner.plan/v1\""):
        load_plan(path)
    with pytest.raises(InputError, match="not found"):
        load_plan(tmp_path / "nope.json")
    with pytest.raises(InputError, match="JSON object"):
        plan_from_data([1, 2])
    path.write_text('{"schema": "planner.plan/v1", "micro_batch_size": 1, "micro_batch_size": 2}')
    with pytest.raises(InputError, match="duplicate key.*micro_batch_size"):
        load_plan(path)


def test_load_plan_maps_pydantic_errors_to_paths(tmp_path):
    data = hand_plan()
    data["stages"][1]["replicas"][0]["tp"] = 3
    data["recompute"] = "sometimes"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputErrors) as exc:
        load_plan(path)
    fields = errors_of(exc.value)
    assert "stages[1].replicas[0]" in fields and "needs 3 devices" in fields["stages[1].replicas[0]"]
    assert "recompute" in fields and "sometimes" in fields["recompute"]
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(hand_plan()))
    assert load_plan(ok).num_stages == 2


def test_device_problems(mixed):
    data = hand_plan()
    reps0 = data["stages"][0]["replicas"]
    reps0[1]["devices"] = ["h100:0"]                 # no such node
    reps0[2]["devices"] = ["v100:7"]                 # no such GPU index
    data["stages"][1]["replicas"][0]["devices"] = ["a100:1", "v100:2"]  # reused, and two nodes
    with pytest.raises(InputErrors) as exc:
        check(mixed, data)
    f = errors_of(exc.value)
    assert "no node 'h100'" in f["stages[0].replicas[1].devices[0]"]
    assert "a100 (4x A100-SXM4-80GB)" in f["stages[0].replicas[1].devices[0]"]
    assert "0..3" in f["stages[0].replicas[2].devices[0]"]
    assert "used twice" in f["stages[1].replicas[0].devices[0]"]
    assert "stages[0].replicas[0].devices[1]" in f["stages[1].replicas[0].devices[0]"]
    assert "a100, v100" in f["stages[1].replicas[0].devices"]
    assert all(e.location.file == "p.json" for e in exc.value.errors)


def test_gpu_type_mismatch_and_aliases(mixed):
    data = hand_plan()
    data["stages"][0]["replicas"][1]["gpu_type"] = "A100-80GB"  # an alias, but the node has V100s
    data["stages"][0]["replicas"][2]["gpu_type"] = "V100-32"     # alias of the right type: fine
    with pytest.raises(InputErrors) as exc:
        check(mixed, data)
    f = errors_of(exc.value)
    assert list(f) == ["stages[0].replicas[1].gpu_type"]
    assert "V100-SXM2-32GB" in f["stages[0].replicas[1].gpu_type"]


def test_stage_structure_problems(mixed):
    data = hand_plan()
    s0, s1 = data["stages"]
    s0["index"], s1["index"] = 1, 0
    s1["blocks"] = [15, 23]
    s0["head"], s1["embedding"] = True, True
    s1["replicas"][0]["micro_batch_share"] = 3
    with pytest.raises(InputErrors) as exc:
        check(mixed, data)
    f = errors_of(exc.value)
    assert "0..1 in order" in f["stages[0].index"]
    assert "start at block 14" in f["stages[1].blocks"] or "[0, 24)" in f["stages[1].blocks"]
    msgs = [e.message for e in exc.value.errors if e.location.field == "stages[1].blocks"]
    assert any("start at block 14" in m for m in msgs) and any("[0, 24)" in m for m in msgs)
    assert "stage 0 only" in f["stages[1].embedding"]
    assert "last stage (1) only" in f["stages[0].head"]
    assert "sums to 3" in f["stages[1].replicas"]


def test_batch_and_tp_problems(mixed):
    data = hand_plan()
    data["num_micro_batches"] = 6
    data["inputs"]["model"] = {"num_layers": 24, "hidden_size": 1536, "num_attention_heads": 12,
                               "num_kv_heads": 3, "vocab_size": 50000}
    data["stages"][1]["replicas"][0]["tp"] = 2  # 2 divides 12 heads but not 3 kv heads
    with pytest.raises(InputErrors) as exc:
        check(mixed, data)
    f = errors_of(exc.value)
    assert "4 * 6 = 24" in f["num_micro_batches"] and "32" in f["num_micro_batches"]
    assert "num_kv_heads (3)" in f["stages[1].replicas[0].tp"]
    assert "valid: 1, 3" in f["stages[1].replicas[0].tp"]


def test_bad_model_and_training_are_located(mixed):
    data = hand_plan()
    data["inputs"]["model"] = "no-such-model"
    data["inputs"]["training"] = {"global_batch_size": 32}
    with pytest.raises(InputErrors) as exc:
        check(mixed, data)
    f = errors_of(exc.value)
    assert "no-such-model" in f["inputs.model"]
    assert "seq_len" in f["inputs.training.seq_len"]


def test_zb_h1_plans(mixed):
    data = hand_plan()
    data["schedule"] = "zb-h1"
    validate_plan_json(data)
    check(mixed, data)
    assert Plan.from_json(data).schedule == "zb-h1"
    data["virtual_stages"] = 2
    with pytest.raises(InputErrors) as exc:
        check(mixed, data)
    assert "zb-h1 runs one stage per rank: virtual_stages must be 1" in errors_of(exc.value)["virtual_stages"]
    # an old plan file (no schedule key) still reads as 1f1b
    data = hand_plan()
    del data["schedule"]
    validate_plan_json(data)
    assert Plan.from_json(data).schedule == "1f1b"


@pytest.mark.parametrize("schedule", ["zb-v", "dualpipev"])
def test_v_schedule_plans(mixed, schedule):
    data = hand_plan()
    data["schedule"], data["virtual_stages"] = schedule, 2
    validate_plan_json(data)
    check(mixed, data)   # 14 and 10 blocks halve; 8 micro-batches >= 2 x 2 stages
    assert Plan.from_json(data).schedule == schedule
    data["virtual_stages"] = 1
    with pytest.raises(InputErrors) as exc:
        check(mixed, data)
    assert f"{schedule} runs two chunks per rank in a V: virtual_stages must be 2, not 1" in \
        errors_of(exc.value)["virtual_stages"]
    data["virtual_stages"] = 2
    data["stages"][0]["blocks"], data["stages"][1]["blocks"] = [0, 13], [13, 24]
    with pytest.raises(InputErrors) as exc:
        check(mixed, data)
    f = errors_of(exc.value)
    assert set(f) == {"stages[0].blocks", "stages[1].blocks"}
    assert "13 blocks do not split into the two equal chunks" in f["stages[0].blocks"]


def test_dualpipev_needs_twice_the_stages_in_micro_batches(mixed):
    data = hand_plan()
    data["schedule"], data["virtual_stages"] = "dualpipev", 2
    data["num_micro_batches"], data["micro_batch_size"] = 2, 16
    for stage in data["stages"]:
        for rep in stage["replicas"]:
            rep["micro_batch_share"] *= 4
    with pytest.raises(InputErrors) as exc:
        check(mixed, data)
    assert errors_of(exc.value) == {"num_micro_batches": "dualpipev needs num_micro_batches >= 2 x stages = 4 "
                                                         "(torch's ScheduleDualPipeV), got 2"}
    data["schedule"] = "zb-v"   # ZB-V takes any number (torch pads and drops)
    check(mixed, data)


def test_schedule_knobs(mixed):
    data = hand_plan()
    data["virtual_stages"] = 2
    with pytest.raises(InputErrors) as exc:
        check(mixed, data)
    assert "interleaved-1f1b" in errors_of(exc.value)["virtual_stages"]

    data = hand_plan()
    data["schedule"] = "interleaved-1f1b"
    with pytest.raises(InputErrors) as exc:
        check(mixed, data)
    assert ">= 2" in errors_of(exc.value)["virtual_stages"]

    data["virtual_stages"] = 4  # 14 and 10 blocks do not split into 4 chunks
    with pytest.raises(InputErrors) as exc:
        check(mixed, data)
    f = errors_of(exc.value)
    assert set(f) == {"stages[0].blocks", "stages[1].blocks"}

    data["virtual_stages"] = 2
    check(mixed, data)  # 14 and 10 blocks split in 2; 8 micro-batches over 2 stages
    data["num_micro_batches"], data["micro_batch_size"] = 4, 8
    for stage in data["stages"]:
        stage["replicas"][0]["micro_batch_share"] += 4
    check(mixed, data)


def test_sequence_parallel_with_tp_one_is_allowed(mixed):
    data = hand_plan()
    data["sequence_parallel"] = True
    for stage in data["stages"]:
        for rep in stage["replicas"]:
            rep["tp"], rep["devices"] = 1, rep["devices"][:1]
    check(mixed, data)


def test_explicit_model_overrides_inputs(mixed):
    plan = Plan.from_json(hand_plan())
    with pytest.raises(InputErrors) as exc:
        check_plan(mixed, plan, model="llama3-8b", file="p.json")  # 32 layers
    assert "[0, 32)" in errors_of(exc.value)["stages[1].blocks"]


def test_rank_map(mixed):
    data = hand_plan()
    launch = build_launch(mixed, Plan.from_json(data))
    assert [(n.node, n.node_rank, n.nproc_per_node) for n in launch.nodes] == [("a100", 0, 4), ("v100", 1, 2)]
    got = [(r.rank, r.device, r.stage, r.replica, r.tp_rank) for r in launch.ranks]
    assert got == [
        (0, "a100:0", 0, 0, 0), (1, "a100:1", 0, 0, 1),
        (2, "a100:2", 1, 0, 1), (3, "a100:3", 1, 0, 0),   # listed as [a100:3, a100:2]
        (4, "v100:0", 0, 1, 0), (5, "v100:1", 0, 2, 0)]
    assert build_launch(mixed, Plan.from_json(copy.deepcopy(data))) == launch


def test_rank_map_node_order_follows_plan():
    cluster = load_cluster(SPECS / "tiny-2zone.yaml")
    data = {**hand_plan(), "micro_batch_size": 2, "num_micro_batches": 16,
            "inputs": {"cluster": "tiny-2zone", "model": "opt-350m",
                       "training": {"global_batch_size": 32, "seq_len": 1024, "precision": "fp16"}}}
    data["stages"] = [
        {"index": 0, "blocks": [0, 12], "embedding": True, "replicas": [
            {"gpu_type": "L4", "tp": 2, "micro_batch_share": 2, "devices": ["l4-1:0", "l4-1:1"]}]},
        {"index": 1, "blocks": [12, 24], "head": True, "replicas": [
            {"gpu_type": "A100-SXM4-80GB", "tp": 1, "micro_batch_share": 1, "devices": ["a100-1:1"]},
            {"gpu_type": "A100-SXM4-80GB", "tp": 1, "micro_batch_share": 1, "devices": ["a100-0:0"]}]}]
    plan = Plan.from_json(data)
    check_plan(cluster, plan)
    launch = build_launch(cluster, plan)
    assert [n.node for n in launch.nodes] == ["l4-1", "a100-1", "a100-0"]
    assert [r.device for r in launch.ranks] == ["l4-1:0", "l4-1:1", "a100-1:1", "a100-0:0"]
    with pytest.raises(InputError, match="does not have"):
        build_launch(load_cluster(SPECS / "tiny-2gpu.yaml"), plan)


def test_schema_and_pydantic_model_name_the_same_fields():
    from planner.plan.model import LaunchNode, LaunchRank, Objective, PlanInputs, Replica, Stage

    def names(model):
        return {(f.alias or n) for n, f in model.model_fields.items()}

    schema = plan_schema()
    defs = schema["$defs"]
    assert set(schema["properties"]) == names(Plan)
    assert set(defs["stage"]["properties"]) == names(Stage)
    assert set(defs["replica"]["properties"]) == names(Replica)
    assert set(defs["inputs"]["properties"]) == names(PlanInputs)
    assert set(defs["objective"]["properties"]) == names(Objective)
    launch = defs["launch"]["properties"]
    assert set(launch["nodes"]["items"]["properties"]) == names(LaunchNode)
    assert set(launch["ranks"]["items"]["properties"]) == names(LaunchRank)
    enum = schema["properties"]["schedule"]["enum"]
    assert set(enum) == set(Plan.model_fields["schedule"].annotation.__args__)


@pytest.mark.parametrize("device", ["a100:00", "a100:\u00b2", "a100: 1", "a100", ":0", "a100:-1"])
def test_device_ids_are_canonical(device):
    # One GPU, one id: "a100:00" beside "a100:0" would put two ranks on one GPU.
    from planner.plan.model import parse_device

    with pytest.raises(ValueError, match="is not '<node name>:<local GPU index>'"):
        parse_device(device)
    assert parse_device("a100-0:12") == ("a100-0", 12)


def test_plan_from_json_errors_are_input_errors():
    from planner.errors import InputError

    with pytest.raises(InputError, match="micro_batch_size"):
        Plan.from_json({"schema": "planner.plan/v1", "inputs": {"cluster": "c", "model": "opt-350m",
                        "training": {}}, "num_micro_batches": 1, "stages": []})


def test_bf16_on_a_gpu_without_bf16_is_refused():
    from planner.errors import InputError
    from planner.plan.check import check_plan

    data = hand_plan()
    data["inputs"]["training"]["precision"] = "bf16"
    cluster = load_cluster(SPECS / "tiny-mixed.yaml")
    with pytest.raises(InputError, match="V100-SXM2-32GB has no bf16, but inputs.training.precision is bf16"):
        check_plan(cluster, Plan.from_json(data))


def test_many_problems_are_summarised_after_the_first_dozen():
    """A plan checked against the wrong cluster has one problem per device: the first dozen
    are shown, then how many more, not a hundred lines."""
    many = InputErrors([InputError(f"plan.json: stages[0].replicas[0].devices[{i}]: unknown device") for i in range(96)])
    lines = str(many).splitlines()
    assert len(lines) == InputErrors.SHOWN + 1 and lines[-1] == "... and 84 more problems"
    assert len(many.errors) == 96
    few = InputErrors([InputError("a"), InputError("b")])
    assert str(few) == "a\nb"


def test_solver_report_counters_from_numpy_write_as_json():
    """A counter added up from numpy values (a numpy bool summed into an int) is a numpy
    integer: the report must still write (a sweep's --report died on one with exit 3)."""
    import numpy as np

    from planner.plan.model import SolverReport
    rep = SolverReport(method="milp", status="feasible", objective=1.0, support_plans=0 + np.bool_(True),
                       baseline_objective=np.float64(2.0))
    stats = rep.run_stats()
    assert type(stats["support_plans"]) is int and stats["support_plans"] == 1
    assert json.loads(json.dumps({**rep.for_plan().model_dump(exclude_none=True), **stats}))["support_plans"] == 1
    # the whole report too, numpy values nested in a dict included (a plan straight from solve)
    nested = SolverReport(method="milp", status="feasible", by_rule={"megatron": np.float64(1.5), "n": np.int64(2)})
    assert json.loads(json.dumps(nested.model_dump(mode="json")))["by_rule"] == {"megatron": 1.5, "n": 2}
