"""planner diff: what changed between two plans."""

from __future__ import annotations

import json

from planner import api
from planner.cli.main import main

MODEL = {"name": "small", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000}
CLUSTER = """\
name: two
nodes:
  - {name: a100, count: 2, gpu: A100-SXM4-80GB, gpus_per_node: 2, network_bandwidth: 100 Gbit/s}
"""


def _plans(tmp_path):
    (tmp_path / "c.yaml").write_text(CLUSTER)
    cluster = api.load_cluster(tmp_path / "c.yaml")
    a = api.plan(cluster, api.load_model(MODEL), api.Training(global_batch_size=8, seq_len=256), time_limit_s=20).plan
    # B: the same devices split into two stages (half the replicas each), shares re-spread
    assert len(a.stages) == 1 and len(a.stages[0].replicas) >= 2, "this small job is pure data parallel"
    st = a.stages[0]
    reps = st.replicas
    half = len(reps) // 2

    def spread(group):
        n, mbs = len(group), a.micro_batch_size
        return tuple(r.model_copy(update={"micro_batch_share": mbs // n + (i < mbs % n)}) for i, r in enumerate(group))

    stages = (st.model_copy(update={"blocks": (0, 2), "head": False, "replicas": spread(reps[:half])}),
              st.model_copy(update={"index": 1, "blocks": (2, 4), "embedding": False, "replicas": spread(reps[half:])}))
    return cluster, a, stages


def test_diff_lists_stages_devices_and_predictions(tmp_path, capsys):
    cluster, a, stages = _plans(tmp_path)
    b = a.model_copy(update={"stages": stages, "launch": None})
    ev = api.evaluate(cluster, b)
    b = b.model_copy(update={"predicted": ev.predicted()})
    (tmp_path / "a.json").write_text(a.dumps())
    (tmp_path / "b.json").write_text(b.dumps())
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["same"] is False
    fields = {r["field"]: r for r in data["settings"]}
    assert fields["pipeline_stages"]["a"] == 1 and fields["pipeline_stages"]["b"] == 2
    assert {"stage": 0, "field": "blocks", "a": [0, 4], "b": [0, 2]} in data["stages"]
    assert {"stage": 1, "field": "blocks", "a": None, "b": [2, 4]} in data["stages"]
    moved = {r["device"] for r in data["devices_moved"]}
    assert moved == {d for r in stages[1].replicas for d in r.devices}
    assert data["devices_added"] == [] and data["devices_removed"] == []
    tps = next(r for r in data["predicted"] if r["field"] == "tokens_per_s")
    assert tps["ratio"] == ev.tokens_per_s / a.predicted.tokens_per_s
    # the table names the changes
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    table = capsys.readouterr().out
    assert "predicted tokens_per_s" in table and "stage 1 blocks" in table and "pipeline_stages" in table


def test_diff_of_a_plan_with_itself_is_empty(tmp_path, capsys):
    _, a, _ = _plans(tmp_path)
    (tmp_path / "a.json").write_text(a.dumps())
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["same"] is True and not data["settings"] and not data["stages"] and not data["devices_moved"]
    assert data["inputs"] == [] and data["comparable"] is True and data["warnings"] == []
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "a.json")]) == 0
    assert "the plans are the same" in capsys.readouterr().out


def test_diff_of_a_missing_file_is_bad_input(tmp_path, capsys):
    assert main(["diff", str(tmp_path / "nope.json"), str(tmp_path / "nope.json")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def _with_inputs(plan, **changes):
    """``plan`` made for other inputs (its layout and predictions kept)."""
    return plan.model_copy(update={"inputs": plan.inputs.model_copy(update=changes)})


def test_diff_lists_the_inputs_first_and_warns_when_the_jobs_differ(tmp_path, capsys):
    # found by a robustness sweep: seq_len 128 vs 131072 and global batch 4096 vs 16 were not
    # listed, and the tokens_per_s ratio read as if one job had two layouts
    _, a, _ = _plans(tmp_path)
    training = {**a.inputs.training, "seq_len": 4096, "global_batch_size": 16}
    b = _with_inputs(a, training=training)
    (tmp_path / "a.json").write_text(a.dumps())
    (tmp_path / "b.json").write_text(b.dumps())
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["inputs"] == [{"field": "training.global_batch_size", "a": 8, "b": 16},
                              {"field": "training.seq_len", "a": 256, "b": 4096}]
    assert data["same"] is False and data["comparable"] is False
    assert "training.global_batch_size, training.seq_len differ" in data["warnings"][0]
    assert captured.err.startswith("warning: the plans are for different jobs")
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    captured = capsys.readouterr()
    assert "compare different jobs" in captured.err
    rows = [line for line in captured.out.splitlines() if line.startswith("│")]
    assert "input training.global_batch_size" in rows[0] and "input training.seq_len" in rows[1]


def test_diff_names_another_model_or_the_fields_of_an_edited_one(tmp_path, capsys):
    _, a, _ = _plans(tmp_path)
    (tmp_path / "a.json").write_text(a.dumps())
    other = _with_inputs(a, model={**a.inputs.model, "name": "other"})
    edited = _with_inputs(a, model={**a.inputs.model, "num_layers": 8})
    precision = _with_inputs(a, training={**a.inputs.training, "precision": "fp32"})
    for plan, rows in ((other, [{"field": "model", "a": "small", "b": "other"}]),
                       (edited, [{"field": "model.num_layers", "a": 4, "b": 8}]),
                       (precision, [{"field": "training.precision", "a": "bf16", "b": "fp32"}])):
        (tmp_path / "b.json").write_text(plan.dumps())
        assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"]) == 0
        captured = capsys.readouterr()
        data = json.loads(captured.out)
        assert data["inputs"] == rows and data["comparable"] is False
        assert f"({rows[0]['field']} differ)" in captured.err


def test_diff_of_plans_for_two_clusters_lists_them_without_a_warning(tmp_path, capsys):
    # the same job on other hardware is what diff is for: its ratios compare like with like
    _, a, _ = _plans(tmp_path)
    b = _with_inputs(a, cluster="other", cluster_sha256="f" * 64)
    (tmp_path / "a.json").write_text(a.dumps())
    (tmp_path / "b.json").write_text(b.dumps())
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert [r["field"] for r in data["inputs"]] == ["cluster", "cluster_sha256"]
    assert data["comparable"] is True and data["warnings"] == [] and captured.err == ""
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    table = capsys.readouterr().out
    assert "input cluster_sha256" in table and "ffffffffffff " in table and "f" * 13 not in table
    # a plan from before fingerprints has none: not listed as a change
    (tmp_path / "b.json").write_text(_with_inputs(a, cluster_sha256=None).dumps())
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"] == []


def test_diff_resolves_a_catalog_model_name_against_a_mapping(tmp_path, capsys):
    """Found in review: a plan naming "llama2-7b" and one with the model's mapping under that
    name but num_layers 40 were "the same"; the name is read through the catalog, as the
    planner loads a model, and the edited field is listed."""
    _, a, _ = _plans(tmp_path)
    mapping = api.load_model("llama2-7b").to_mapping()
    named = _with_inputs(a, model="llama2-7b")
    (tmp_path / "a.json").write_text(named.dumps())
    for model, rows in (({**mapping, "num_layers": 40}, [{"field": "model.num_layers", "a": 32, "b": 40}]),
                        (mapping, []),      # the catalog's own mapping: the same model
                        ({"name": "llama2-7b"}, [])):
        (tmp_path / "b.json").write_text(_with_inputs(a, model=model).dumps())
        assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["inputs"] == rows and data["same"] is (not rows)
    (tmp_path / "b.json").write_text(_with_inputs(a, model={**mapping, "num_layers": 40}).dumps())
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    captured = capsys.readouterr()
    assert "the plans are the same" not in captured.out and "input model.num_layers" in captured.out
    assert "(model.num_layers differ)" in captured.err
    # a name the catalog does not know is never the same as a mapping under that name
    (tmp_path / "a.json").write_text(_with_inputs(a, model="small").dumps())
    (tmp_path / "b.json").write_text(a.dumps())
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["same"] is False and data["inputs"] == [{"field": "model", "a": "small", "b": a.inputs.model}]
