"""The Python API's arguments (planner.api_inputs): a wrong one is planner's InputError (the
CLI's exit 2) naming the parameter and what it may be, never an AttributeError or TypeError
from inside; a cluster, model, training or plan may also come as a path or a mapping.
Found by a robustness sweep: ``api.plan(None, ...)`` was an AttributeError, ``top_k="2"`` a
TypeError, ``api.resolve_profiles(c, 5)`` returned 5."""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest
from test_launch_formats import make_plan, rep

from planner import api
from planner.errors import InputError

ROOT = Path(__file__).parent.parent
TINY = ROOT / "cluster_specs" / "tiny-2gpu.yaml"
SMALL = ROOT / "profiles" / "models" / "cpu-small.yaml"
TRAINING = {"global_batch_size": 4, "seq_len": 128}
NODE = {"name": "a", "gpu": "A100-SXM4-80GB", "gpus_per_node": 8, "network_bandwidth": "100 Gbit/s"}


@pytest.fixture(scope="module")
def cluster():
    return api.load_cluster(TINY)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """One search, its cluster a path, its model a path and its training a mapping."""
    result = api.plan(str(TINY), SMALL, TRAINING, time_limit_s=30)
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(result.plan.dumps())
    return result, path


def raises_naming(*words):
    """An InputError whose message holds every one of ``words``."""
    class Check:
        def __enter__(self):
            self.ctx = pytest.raises(InputError)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self.ctx.__exit__(*exc)
            for word in words:
                assert word in str(self.info.value), (word, str(self.info.value))
            return handled
    return Check()


# -- loading -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [None, 5, "", [TINY]])
def test_load_cluster_refuses_what_is_no_spec(value):
    with raises_naming("must be a Cluster, the path of a cluster spec (YAML) or the spec as a mapping"):
        api.load_cluster(value)


def test_load_cluster_takes_a_mapping_with_errors_naming_the_field():
    cluster = api.load_cluster({"name": "x", "nodes": [NODE]})
    assert cluster.num_gpus == 8
    with raises_naming("<cluster>: nodes[0].gpu: unknown GPU type 'Z9000'"):
        api.load_cluster({"name": "x", "nodes": [{**NODE, "gpu": "Z9000"}]})
    with raises_naming("<cluster>: nodes[0].gpus_per_node"):
        api.load_cluster({"name": "x", "nodes": [{**NODE, "gpus_per_node": -2}]})
    assert api.load_cluster(api.load_cluster(TINY)).name == "tiny-2gpu"


@pytest.mark.parametrize("value, words", [
    ({"name": 5}, ["<model>: name: a model's name is a string", "int 5"]),
    (None, ["must be a ModelSpec, a catalog model name", "llama3-8b", "got None"]),
    (7, ["must be a ModelSpec", "got int 7"]),
    ("", ["must be a ModelSpec"]),
])
def test_load_model_refuses_what_is_no_model(value, words):
    with raises_naming(*words):
        api.load_model(value)


def test_load_model_takes_a_name_path_mapping_or_model():
    model = api.load_model("llama3-8b")
    assert api.load_model(model) is model
    assert api.load_model({"name": "llama3-8b"}) == model
    assert api.load_model(SMALL).name == "cpu-small"


@pytest.mark.parametrize("load, what", [(api.load_training, "training spec"), (api.load_plan, "plan file")])
@pytest.mark.parametrize("value", [None, 3])
def test_loaders_of_files_want_a_path(load, what, value):
    with raises_naming("path must be the path of a", what):
        load(value)


def test_summarize_cluster_takes_what_load_cluster_takes():
    with raises_naming("cluster must be a Cluster"):
        api.summarize_cluster(None)
    assert api.summarize_cluster(TINY)["num_gpus"] == api.summarize_cluster(api.load_cluster(TINY))["num_gpus"]


def test_resolve_profiles_refuses_other_things(cluster):
    with raises_naming("profiles must be a ProfileSet, the path of a profile file or folder", "int 5"):
        api.resolve_profiles(cluster, 5)
    assert api.resolve_profiles(cluster, None) is None


# -- training ----------------------------------------------------------------------------------

def test_training_factory_raises_input_error_naming_the_field():
    assert api.training(**TRAINING) == api.Training(**TRAINING)
    with raises_naming("<training>: global_batch_size"):
        api.training(global_batch_size=-8, seq_len=128)
    with raises_naming("<training>: gbs: unknown key 'gbs'"):
        api.training(gbs=8, seq_len=128)
    assert "training" in api.__all__


def test_constructing_the_pydantic_model_directly_raises_pydantics_error():
    """As the README says: ``api.Training(...)`` is the pydantic model itself."""
    with pytest.raises(pydantic.ValidationError):
        api.Training(global_batch_size=-8, seq_len=128)


# -- plan: refused before the search starts ----------------------------------------------------

@pytest.mark.parametrize("change, words", [
    ({"cluster": None}, ["cluster must be a Cluster", "got None"]),
    ({"cluster": 5}, ["cluster must be a Cluster", "got int 5"]),
    ({"model": None}, ["model must be a ModelSpec", "got None"]),
    ({"training": None}, ["training must be a Training", "or a mapping of its fields", "got None"]),
    ({"training": {"global_batch_size": -8, "seq_len": 128}}, ["<training>: global_batch_size"]),
    ({"top_k": "2"}, ["top_k must be a whole number", "str '2'"]),
    ({"time_limit_s": "5"}, ["time_limit_s must be a positive number of seconds", "str '5'"]),
    ({"profiles": 5}, ["profiles must be a ProfileSet", "int 5"]),
    ({"progress": 5}, ["progress must be a function", "int 5"]),
    ({"watch": 5}, ["watch must be what api.search_watch() returns"]),
    ({"gap_rel": -0.1}, ["gap_rel must be a number from 0"]),
    ({"calibration": 5}, ["calibration must be the path of a calibration file", "int 5"]),
    ({"work_budget": 1.5}, ["work_budget must be a whole number"]),
])
def test_plan_refuses_bad_arguments(cluster, change, words):
    kwargs = {"cluster": cluster, "model": SMALL, "training": TRAINING, "time_limit_s": 30, **change}
    with raises_naming(*words):
        api.plan(**kwargs)


def test_unknown_keywords_are_pythons_type_error_naming_the_api_function(cluster, planned):
    _, path = planned
    with pytest.raises(TypeError, match=r"^plan\(\) got an unexpected keyword argument 'foo'"):
        api.plan(cluster, SMALL, TRAINING, foo=1)
    with pytest.raises(TypeError, match=r"^evaluate\(\) got an unexpected keyword argument 'foo'"):
        api.evaluate(cluster, path, foo=1)
    with pytest.raises(TypeError, match=r"^launch\(\) got an unexpected keyword argument 'foo'"):
        api.launch(path, "torchrun", foo=1)
    with pytest.raises(TypeError, match=r"^replan\(\) got an unexpected keyword argument 'objective'.*gap_rel"):
        api.replan(cluster, path, objective="cost")
    with pytest.raises(TypeError, match=r"^run\(\) got an unexpected keyword argument 'foo'.*seed"):
        api.run(path, foo=1)


# -- a plan given as a path, or not at all -----------------------------------------------------

def test_a_search_takes_paths_and_mappings(planned):
    result, _ = planned
    again = api.plan(api.load_cluster(TINY), api.load_model(SMALL), api.training(**TRAINING), time_limit_s=30)
    assert again.plan.dumps() == result.plan.dumps()


def test_plan_arguments_may_be_plan_file_paths(cluster, planned):
    result, path = planned
    assert api.evaluate(cluster, path).iteration_time_s == result.evaluation.iteration_time_s
    assert api.evaluate(str(TINY), str(path), check=False).iteration_time_s == result.evaluation.iteration_time_s
    assert api.simulate(cluster, path).evaluation.iteration_time_s == result.evaluation.iteration_time_s
    assert api.diff(path, result.plan).stages == []


@pytest.mark.parametrize("call, param", [
    (lambda c: api.evaluate(c, None), "plan"),
    (lambda c: api.simulate(c, 5), "plan"),
    (lambda c: api.replan(c, None), "old_plan"),
    (lambda c: api.diff(None, None), "a"),
    (lambda c: api.rebalance(c, None, "m.json"), "plan_"),
    (lambda c: api.profile_from_run(c, None, "m.json"), "plan_"),
    (lambda c: api.launch(None, "torchrun"), "plan"),
    (lambda c: api.run(None), "plan"),
    (lambda c: api.latency_schedule(c, None), "plan_"),
])
def test_a_missing_plan_is_named(cluster, call, param):
    with raises_naming(f"{param} must be a Plan (api.load_plan) or the path of a plan file"):
        call(cluster)


def test_a_plan_path_names_itself_in_errors(cluster, tmp_path):
    data = make_plan().to_json()
    data["num_micro_batches"] += 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with raises_naming(f"{bad}: num_micro_batches"):
        api.simulate(cluster, bad)


def test_measurements_and_calibration_want_paths(cluster, planned):
    _, path = planned
    with raises_naming("measurements_file must be the path of a measurements file", "got None"):
        api.rebalance(cluster, path, None)
    with raises_naming("measurements_file must be the path"):
        api.profile_from_run(cluster, path, 5)
    with raises_naming("calibration must be the path of a calibration file"):
        api.evaluate(cluster, path, calibration=5)


def test_replan_checks_its_numbers_types(cluster, planned):
    _, path = planned
    with raises_naming("migration_steps must be a whole number"):
        api.replan(cluster, path, migration_steps="2")
    with raises_naming("max_moved_fraction must be a number from 0 to 1"):
        api.replan(cluster, path, max_moved_fraction="half")


# -- launch with a cluster: the plan is checked as evaluate checks it --------------------------

@pytest.mark.parametrize("gpu, words", [
    ("H100-SXM5-80GB", ["stages[1].replicas[0].gpu_type: gpu_type 'H100-SXM5-80GB' does not match node 'b'"]),
    ("Z9000", ["stages[1].replicas[0].gpu_type: gpu_type 'Z9000' does not match node 'b'"]),
])
def test_launch_with_a_cluster_checks_gpu_types(gpu, words):
    plan = make_plan([[rep(["a:0", "a:1"]), rep(["a:2", "a:3"])],
                      [rep(["b:0", "b:1"], gpu=gpu), rep(["b:2", "b:3"])]])
    cluster = {"name": "t", "nodes": [NODE, {**NODE, "name": "b", "gpus_per_node": 4}]}
    with raises_naming("<plan>: ", *words):
        api.launch(plan, "torchrun", cluster=cluster, master_addr="h")
    assert api.launch(plan, "torchrun", master_addr="h")      # without a cluster: nothing to check against


# -- evaluate's overrides: checked as a plan file's inputs.training is ------------------------

@pytest.mark.parametrize("change, words", [
    ({"elementwise": "bogus"}, ["elementwise: Input should be 'fused' or 'eager'", "str 'bogus'"]),
    ({"elementwise": 1}, ["elementwise: Input should be 'fused' or 'eager'", "int 1"]),
    ({"precision": "fp8"}, ["precision: Input should be 'bf16', 'fp16', 'fp32' or 'tf32'", "str 'fp8'"]),
    ({"cross_entropy": "foo"}, ["cross_entropy: Input should be 'fused' or 'plain'", "str 'foo'"]),
    ({"flash_attention": "yes"}, ["flash_attention must be True or False", "str 'yes'"]),
    ({"grad_reduce_overlap": 0}, ["grad_reduce_overlap must be True or False", "int 0"]),
    ({"check": "no"}, ["check must be True or False", "str 'no'"]),
])
def test_evaluate_refuses_bad_overrides_naming_the_keyword(cluster, planned, change, words):
    _, path = planned
    with raises_naming(*words):
        api.evaluate(cluster, path, **change)


def test_evaluate_takes_every_choice_a_training_spec_takes(cluster, planned):
    _, path = planned
    ev = api.evaluate(cluster, path, precision="fp32", cross_entropy="plain", elementwise="eager",
                      flash_attention=False, grad_reduce_overlap=False, tp_comm_overlap=True)
    assert ev.iteration_time_s > api.evaluate(cluster, path).iteration_time_s


# -- other keywords of the wrong type, refused before the work starts --------------------------

@pytest.mark.parametrize("change, words", [
    ({"master_addr": 5}, ["master_addr must be the host name or IP address", "int 5"]),
    ({"script": 3}, ["script must be the training script's path", "int 3"]),
    ({"fmt": ["torchrun"]}, ["fmt must be a launcher format name", "list"]),
    ({"schedule_csv": "yes"}, ["schedule_csv must be True or False"]),
])
def test_launch_refuses_keywords_of_the_wrong_type(planned, change, words):
    _, path = planned
    kwargs = {"fmt": "torchrun", "master_addr": "h", **change}
    with raises_naming(*words):
        api.launch(path, **kwargs)


@pytest.mark.parametrize("change, words", [
    ({"incumbents": [1]}, ["incumbents[0] must be a Plan (api.load_plan) or the path of a plan file", "int 1"]),
    ({"incumbents": 5}, ["incumbents must be a list of Plans", "int 5"]),
    ({"top_k": 0}, ["top_k must be at least 1", "got 0"]),
])
def test_plan_names_its_own_keywords(cluster, change, words):
    kwargs = {"cluster": cluster, "model": SMALL, "training": TRAINING, "time_limit_s": 30, **change}
    with raises_naming(*words) as info:
        api.plan(**kwargs)
    assert "--top" not in str(info.value)


def test_plan_takes_incumbents_as_plans_or_paths(cluster, planned):
    result, path = planned
    again = api.plan(cluster, SMALL, TRAINING, time_limit_s=30, incumbents=[path])
    assert again.plan.dumps() == result.plan.dumps()


def test_latency_schedule_checks_its_numbers_types(cluster, planned):
    _, path = planned
    with raises_naming("memory_cap must be a whole number", "str '2'"):
        api.latency_schedule(cluster, path, memory_cap="2")


# -- drawing what simulate returns -------------------------------------------------------------

def test_trace_and_timeline_take_what_simulate_returns(cluster, planned, tmp_path):
    _, path = planned
    sim = api.simulate(cluster, path)
    trace = json.loads(api.write_trace(sim, tmp_path / "t.json").read_text())
    assert trace["traceEvents"]
    assert json.loads(api.write_trace(api.plan_execution(sim), tmp_path / "t2.json").read_text()) == trace
    assert api.timeline_rows(sim, 10) == api.timeline_rows(sim.result, 10)
    with raises_naming("write_trace: run must be what api.simulate returns", "int 5"):
        api.write_trace(5, tmp_path / "t3.json")
    with raises_naming("write_timeline: run must be what api.simulate returns"):
        api.write_timeline(sim.result, tmp_path / "t.svg")
    with raises_naming("timeline_rows: result must be what api.simulate returns"):
        api.timeline_rows(None)
