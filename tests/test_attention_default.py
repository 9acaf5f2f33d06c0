"""Flash attention is the training spec's default, and plans written before it keep their meaning:
a plan without ``inputs.training.attention`` was priced unfused and is read so by every command
(evaluate, replan, diff, the launchers); new plans always write the key."""

from __future__ import annotations

import json

import pytest

from planner import api
from planner.cli.main import main
from planner.diff import diff_plans
from planner.launch import render
from planner.plan import Plan
from planner.plan.check import plan_training
from planner.spec.training import Training

CLUSTER = "cluster_specs/tiny-2gpu.yaml"
JOB = ["--model", "opt-350m", "--global-batch-size", "8", "--seq-len", "2048", "--time-limit", "60", "--quiet"]


def test_flash_is_the_default_and_plans_always_write_attention():
    t = Training(global_batch_size=8, seq_len=2048)
    assert t.attention == "flash"
    assert t.io_mapping()["attention"] == "flash"
    assert t.model_copy(update={"attention": "unfused"}).io_mapping()["attention"] == "unfused"
    # cross_entropy keeps the rule of before: written only off its (unchanged) default
    assert "cross_entropy" not in t.io_mapping()
    assert t.model_copy(update={"cross_entropy": "plain"}).io_mapping()["cross_entropy"] == "plain"


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A plan `planner plan` writes by default, and the same plan as written before flash's default
    (no attention key), loaded back."""
    out = tmp_path_factory.mktemp("attention") / "plan.json"
    assert main(["plan", CLUSTER, *JOB, "-o", str(out)]) == 0
    new = json.loads(out.read_text())
    old = json.loads(out.read_text())
    del old["inputs"]["training"]["attention"]
    return new, Plan.model_validate(new), Plan.model_validate(old)


def test_a_new_default_plan_is_flash_and_an_old_one_without_the_key_unfused(planned):
    data, new, old = planned
    assert data["inputs"]["training"]["attention"] == "flash"
    assert new.training_choice("attention") == "flash" and old.training_choice("attention") == "unfused"
    assert old.training_choice("cross_entropy") == new.training_choice("cross_entropy") == "fused"
    cluster = api.load_cluster(CLUSTER)
    flash, legacy = api.evaluate(cluster, new), api.evaluate(cluster, old)
    unfused = api.evaluate(cluster, Plan.model_validate(
        {**data, "inputs": {**data["inputs"], "training": {**data["inputs"]["training"], "attention": "unfused"}}}))
    assert flash.tokens_per_s == pytest.approx(data["predicted"]["tokens_per_s"], rel=1e-9)  # as searched
    assert legacy.tokens_per_s == unfused.tokens_per_s < flash.tokens_per_s
    assert legacy.peak_memory_bytes == unfused.peak_memory_bytes
    assert all(flash.peak_memory_bytes[d] < unfused.peak_memory_bytes[d] for d in flash.peak_memory_bytes)


def test_round_trips_keep_the_key_or_its_absence(planned):
    _, new, old = planned
    assert json.loads(new.dumps())["inputs"]["training"]["attention"] == "flash"
    assert "attention" not in json.loads(old.dumps())["inputs"]["training"]   # its bytes kept, still unfused
    assert plan_training(old).attention == "unfused" and plan_training(new).attention == "flash"  # replan's job


def test_replan_of_an_old_plan_keeps_it_unfused_and_says_so(planned):
    """Same cluster: the old plan (no key: unfused) is re-searched as priced, the fresh plan
    states attention: unfused, and the old plan kept is priced unfused, not as flash."""
    _, new, old = planned
    cluster = api.load_cluster(CLUSTER)
    result = api.replan(cluster, old, time_limit_s=30)
    assert result.fresh.plan.inputs.training["attention"] == "unfused"
    assert result.old_evaluation.tokens_per_s == pytest.approx(api.evaluate(cluster, old).tokens_per_s, rel=1e-9)
    assert result.old_evaluation.tokens_per_s < api.evaluate(cluster, new).tokens_per_s
    assert api.replan(cluster, new, time_limit_s=30).fresh.plan.inputs.training["attention"] == "flash"


def test_diff_compares_the_kernels_as_priced(planned):
    data, new, old = planned
    rows = {r["field"]: (r["a"], r["b"]) for r in diff_plans(old, new).settings}
    assert rows["attention"] == ("unfused", "flash")
    stated = Plan.model_validate({**data, "inputs": {**data["inputs"], "training": {
        **data["inputs"]["training"], "attention": "unfused"}}})
    assert "attention" not in {r["field"] for r in diff_plans(old, stated).settings}


def test_launchers_run_the_kernel_as_priced(planned):
    _, new, old = planned
    def megatron(plan):
        return json.loads(render(plan, "megatron", master_addr="h")["megatron_args.json"])
    args = megatron(new)["args"]
    assert args[args.index("--attention-backend") + 1] == "flash"
    assert "--attention-backend" not in megatron(old)["args"]
    def torchtitan_text(plan):
        return "\n".join(render(plan, "torchtitan", master_addr="h").values())
    assert "priced the unfused core" in torchtitan_text(old)
    assert "priced the unfused core" not in torchtitan_text(new)
