"""A profile prices only plans trained in its dtype, unless it says it stands in for another
(docs/profiles.md, "Precision"); a skipped profile is recorded and warned about, never a crash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_profile_e2e import CASES, MODEL_FILE, ROOT, SEQ_LEN, pipeline_plan

from planner.cost import evaluate
from planner.errors import InputError
from planner.plan import Plan
from planner.profile import ProfileSet, load_profiles
from planner.profile.schema import ProfileFile
from planner.spec import load_cluster, load_model

BLOCK_S = {1: (0.004, 0.008), 2: (0.008, 0.016)}
MISMATCH = "profile dtype fp32 != plan precision bf16"


def profile_data(dtype: str, scale: float = 1.0, **extra) -> dict:
    entries = []
    for mb, (f, b) in BLOCK_S.items():
        for layer in ("embedding", "block", "head"):
            entries.append({"layer": layer, "micro_batch": mb, "tp": 1, "forward_s": f * scale,
                            "backward_s": b * scale, "peak_memory_bytes": 1})
    return {"schema": "planner.profile/v1",
            "device": {"kind": "cpu", "name": "test cpu", "gpu_type": "cpu"},
            "torch_version": "x", "dtype": dtype, **extra, "created": "2026-12-02T00:00:00+00:00",
            "seq_len": SEQ_LEN, "model": load_model(MODEL_FILE).to_mapping(),
            "settings": {"warmup": 0, "repeats": 1, "timer": "wall-clock", "memory": "none"},
            "entries": entries}


def write(tmp_path, data: dict, name: str) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def cluster_without_profiles(tmp_path):
    """cpu-local without its profiles: mapping, so only the files a test names are used."""
    data = yaml.safe_load((ROOT / "cluster_specs" / "cpu-local.yaml").read_text())
    data.pop("profiles")
    path = tmp_path / "cpu-local.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def with_precision(plan: Plan, precision: str) -> Plan:
    data = plan.to_json()
    data["inputs"]["training"]["precision"] = precision
    return Plan.from_json(data)


def test_fp32_profile_does_not_price_a_bf16_plan(tmp_path):
    cluster = load_cluster(cluster_without_profiles(tmp_path))
    plan = pipeline_plan(2)  # bf16
    profiles = ProfileSet.load(write(tmp_path, profile_data("fp32"), "fp32.yaml"))
    ev = evaluate(cluster, plan, profiles=profiles)
    roofline = evaluate(cluster, plan)
    assert ev.iteration_time_s == pytest.approx(roofline.iteration_time_s)
    assert set(ev.sources.values()) == {"estimated"}
    usage = profiles.usage()
    assert usage["measured"] == usage["interpolated"] == 0 and usage["estimated"] == 3
    assert {lk["reason"] for lk in usage["lookups"]} == {MISMATCH}
    assert usage["files"][0]["skipped"] == MISMATCH
    assert profiles.skipped("bf16") == [(usage["files"][0]["path"], MISMATCH)]
    assert profiles.skipped("fp32") == []


def test_matching_dtype_is_measured(tmp_path):
    cluster = load_cluster(cluster_without_profiles(tmp_path))
    profiles = ProfileSet.load(write(tmp_path, profile_data("bf16"), "bf16.yaml"))
    ev = evaluate(cluster, pipeline_plan(2), profiles=profiles)
    assert set(ev.sources.values()) == {"measured"}
    usage = profiles.usage()
    assert usage["estimated"] == 0
    assert all("reason" not in lk and "profile_dtype" not in lk for lk in usage["lookups"])
    assert "skipped" not in usage["files"][0]
    # fp16 is its own precision: a bf16 profile does not price it.
    profiles.reset_usage()
    fp16 = evaluate(cluster, with_precision(pipeline_plan(2), "fp16"), profiles=profiles)
    assert set(fp16.sources.values()) == {"estimated"}
    assert profiles.usage()["files"][0]["skipped"] == "profile dtype bf16 != plan precision fp16"


def test_stands_in_for_is_an_explicit_opt_in(tmp_path):
    cluster = load_cluster(cluster_without_profiles(tmp_path))
    path = write(tmp_path, profile_data("fp32", stands_in_for=["bf16"]), "fp32.yaml")
    profiles = ProfileSet.load(path)
    ev = evaluate(cluster, pipeline_plan(2), profiles=profiles)
    assert set(ev.sources.values()) == {"measured"}
    usage = profiles.usage()
    assert {lk.get("profile_dtype") for lk in usage["lookups"]} == {"fp32"}
    assert usage["files"][0]["stands_in_for"] == ["bf16"] and "skipped" not in usage["files"][0]
    # Only for the precisions it names.
    profiles.reset_usage()
    evaluate(cluster, with_precision(pipeline_plan(2), "fp16"), profiles=profiles)
    assert profiles.usage()["estimated"] == 3
    assert profiles.usage()["files"][0]["skipped"] == "profile dtype fp32 != plan precision fp16"


def test_profiles_of_two_dtypes_coexist_and_the_plans_own_wins(tmp_path):
    model = load_model(MODEL_FILE)
    profiles = ProfileSet.load([write(tmp_path, profile_data("bf16"), "a.yaml"),
                                write(tmp_path, profile_data("fp32", 3.0, stands_in_for=["bf16"]),
                                      "b.yaml")])
    assert profiles.lookup("cpu", "block", 1, 1, SEQ_LEN, model, precision="bf16") == BLOCK_S[1]
    assert profiles.lookup("cpu", "block", 1, 1, SEQ_LEN, model, precision="fp32") == \
        pytest.approx((0.012, 0.024))
    # Beyond the bf16 file's range, and the stand-in's too: a plain miss, no reason.
    assert profiles.lookup("cpu", "block", 4, 1, SEQ_LEN, model, precision="bf16") is None
    assert "reason" not in profiles.usage()["lookups"][-1]
    # Callers that pass no precision keep the old behaviour: any dtype answers.
    only_fp32 = ProfileSet.load(write(tmp_path, profile_data("fp32"), "c.yaml"))
    assert only_fp32.lookup("cpu", "block", 2, 1, SEQ_LEN, model) == BLOCK_S[2]


def test_stands_in_for_is_checked_and_written_after_dtype(tmp_path):
    with pytest.raises(InputError, match="own dtype"):
        ProfileSet.load(write(tmp_path, profile_data("fp32", stands_in_for=["fp32"]), "a.yaml"))
    with pytest.raises(InputError, match="twice"):
        ProfileSet.load(write(tmp_path, profile_data("fp32", stands_in_for=["bf16", "bf16"]), "b.yaml"))
    with pytest.raises(InputError, match="stands_in_for"):
        ProfileSet.load(write(tmp_path, profile_data("fp32", stands_in_for=["int8"]), "c.yaml"))
    written = ProfileFile.model_validate(profile_data("fp32", stands_in_for=["bf16"])).to_yaml_data()
    keys = list(written)
    assert written["stands_in_for"] == ["bf16"] and keys.index("stands_in_for") == keys.index("dtype") + 1
    assert "stands_in_for" not in ProfileFile.model_validate(profile_data("fp32")).to_yaml_data()


@pytest.mark.parametrize("name", sorted(CASES))
def test_committed_cpu_setup_stays_measured(name):
    """The CPU end-to-end check plans in bf16 with fp32 CPU profiles; those files stand in for
    bf16 (the reference runner trains in fp32), so every layer cost stays measured."""
    make, cluster_name = CASES[name]
    spec = ROOT / "cluster_specs" / f"{cluster_name}.yaml"
    cluster = load_cluster(spec)
    profiles = load_profiles(cluster=cluster, cluster_path=spec)
    evaluate(cluster, make(), profiles=profiles, grad_reduce_overlap=False)
    usage = profiles.usage()
    assert usage["estimated"] == 0, usage
    assert all(f["dtype"] == "fp32" and f["stands_in_for"] == ["bf16"] for f in usage["files"])


def test_cli_warns_on_one_stderr_line(tmp_path, capsys):
    from planner.cli.main import main
    cluster = cluster_without_profiles(tmp_path)
    prof = write(tmp_path, profile_data("fp32"), "fp32.yaml")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(pipeline_plan(2).to_json()))
    capsys.readouterr()
    assert main(["evaluate", str(cluster), str(plan_file), "--profiles", prof, "--json"]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    expected = f"warning: profile {prof} skipped ({MISMATCH}); its layers are estimated by the roofline"
    assert warnings == [expected]
    json.loads(out)  # stdout stays machine-readable

    out_plan = tmp_path / "best.json"
    assert main(["plan", str(cluster), "--model", str(MODEL_FILE), "--global-batch-size", "4",
                 "--seq-len", str(SEQ_LEN), "--time-limit", "20", "--profiles", prof,
                 "-o", str(out_plan), "--quiet"]) == 0
    _, err = capsys.readouterr()
    assert [line for line in err.splitlines() if line.startswith("warning:")] == warnings
    record = json.loads(out_plan.read_text())["inputs"]["profiles"]
    assert record["measured"] == [] and record["estimated"]
    assert record["files"][0]["skipped"] == MISMATCH


def test_an_entry_listed_twice_is_located_at_its_second_listing(tmp_path):
    """It was reported at the file's 1:1 (a whole-file check): now at the second entry's line,
    naming the first."""
    data = profile_data("bf16")
    data["entries"].append(dict(data["entries"][1]))
    path = write(tmp_path, data, "dup.yaml")
    with pytest.raises(InputError) as err:
        ProfileSet.load(path)
    text = str(err.value)
    rows = Path(path).read_text().splitlines()
    starts = [i for i, row in enumerate(rows, 1) if row.startswith("- layer")]
    assert f"{path}:{starts[-1]}:" in text and f"entries[{len(starts) - 1}]" in text, text
    assert "twice (first as entries[1])" in text
