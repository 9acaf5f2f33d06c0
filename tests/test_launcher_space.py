"""``plan --launcher deepspeed`` searches only what DeepSpeed's PipelineModule runs: the plan it
writes always passes ``launch --format deepspeed`` (issue 19)."""

from __future__ import annotations

import pytest

from planner import api
from planner.errors import InputError
from planner.launcher_space import LAUNCHER_CHOICES, narrow
from planner.spec import Training

CLUSTER = "cluster_specs/tiny-2gpu.yaml"


def test_deepspeed_narrows_recompute_and_schedules():
    t = narrow(Training(global_batch_size=8, seq_len=256), "deepspeed")
    assert t.recompute_modes == ("none", "full") and set(t.schedules) == {"1f1b", "gpipe"}
    assert narrow(Training(global_batch_size=8, seq_len=256), "megatron") == Training(global_batch_size=8, seq_len=256)
    with pytest.raises(InputError, match="--launcher deepspeed runs recompute_modes none, full; the training "
                                         "allows only selective"):
        narrow(Training(global_batch_size=8, seq_len=256, recompute_modes=("selective",)), "deepspeed")


@pytest.fixture(scope="module")
def ds_plan():
    cluster = api.load_cluster(CLUSTER)
    result = api.plan(cluster, "opt-350m", Training(global_batch_size=8, seq_len=256), time_limit_s=60,
                      launcher="deepspeed")
    return cluster, result.plan


def test_the_plan_it_writes_launches(ds_plan):
    cluster, plan = ds_plan
    assert plan.recompute in LAUNCHER_CHOICES["deepspeed"]["recompute_modes"]
    assert api.launch(plan, "deepspeed", cluster=cluster, master_addr="10.0.0.1")       # no refusal


@pytest.mark.parametrize("update, refusal", [({"recompute": "selective"}, "recompute selective"),
                                             ({"schedule": "interleaved-1f1b", "virtual_stages": 2},
                                              "interleaved-1f1b")])
def test_each_choice_left_out_is_one_deepspeed_refuses(ds_plan, update, refusal):
    """The table agrees with launch/deepspeed.py: what it leaves out, ``launch`` refuses."""
    cluster, plan = ds_plan
    field = "recompute_modes" if "recompute" in update else "schedules"
    value = update.get("recompute") or update.get("schedule")
    assert value not in LAUNCHER_CHOICES["deepspeed"][field]
    with pytest.raises(InputError, match=refusal):
        api.launch(plan.model_copy(update=update), "deepspeed", cluster=cluster, master_addr="10.0.0.1")


def test_megatron_searches_no_per_op_recompute():
    # found by scripts/fuzz_plans.py: --launcher megatron --recompute op wrote a plan with
    # recompute op, which launch --format megatron refuses
    training = Training(global_batch_size=8, seq_len=256, recompute_modes=("op", "full"))
    assert narrow(training, "megatron").recompute_modes == ("full",)
    with pytest.raises(InputError, match="--launcher megatron runs recompute_modes none, selective, full"):
        narrow(Training(global_batch_size=8, seq_len=256, recompute_modes=("op",)), "megatron")
    cluster = api.load_cluster(CLUSTER)
    plan = api.plan(cluster, "opt-350m", training, time_limit_s=60, launcher="megatron").plan
    assert plan.recompute == "full"
    assert api.launch(plan, "megatron", cluster=cluster, master_addr="10.0.0.1")           # no refusal
    with pytest.raises(InputError, match="recompute op"):       # the mode left out is one it refuses
        api.launch(plan.model_copy(update={"recompute": "op"}), "megatron", cluster=cluster,
                   master_addr="10.0.0.1")


@pytest.mark.parametrize("field, asked, runs", [("expert_parallel_degrees", (2,), "1"),
                                                ("context_parallel_degrees", (2,), "1"),
                                                ("zero_shard_degrees", (2,), "all")])
def test_deepspeed_refuses_degrees_it_has_no_config_for(field, asked, runs):
    # found by scripts/fuzz_plans.py: the search dropped these for DeepSpeed and searched what was
    # left (EP 1, "all") or nothing ("no split fits in memory"), though the training allowed neither
    training = Training(global_batch_size=8, seq_len=256, **{field: asked})
    with pytest.raises(InputError, match=f"--launcher deepspeed runs {field} {runs}; the training allows only 2"):
        narrow(training, "deepspeed")
    both = Training(global_batch_size=8, seq_len=256, **{field: (1 if runs == "1" else "all", 2)})
    assert getattr(narrow(both, "deepspeed"), field) == (1 if runs == "1" else "all",)
