"""``--format torchtitan``: the TOML parses, every key is a torchtitan JobConfig field (the list
recorded from torchtitan/config/job_config.py), the batch and split are the plan's, and what
torchtitan cannot express is refused with the reason."""

from __future__ import annotations

import tomllib

import pytest
from test_launch_formats import make_plan, rep

from planner.cli.main import main
from planner.errors import InputError
from planner.launch import render
from planner.launch.schedule_csv import CSV_FILE, actions_csv
from planner.launch.torchtitan import CONFIG_FILE, JOB_CONFIG_FIELDS
from planner.simulate.actions import generate


def config(plan, **kw) -> tuple[dict, dict[str, str]]:
    files = render(plan, "torchtitan", master_addr="h", **kw)
    data = tomllib.loads(files[CONFIG_FILE])
    for section, fields in data.items():
        assert section in JOB_CONFIG_FIELDS, section
        unknown = set(fields) - set(JOB_CONFIG_FIELDS[section])
        assert not unknown, (section, unknown)
    return data, files


def layers_of(parts: list[list[str]]) -> list[str]:
    return [n for part in parts for n in part]


def test_even_1f1b():
    data, files = config(make_plan(blocks=((0, 4), (4, 8)), zero_stage=0))
    par, train = data["parallelism"], data["training"]
    assert par == {"pipeline_parallel_degree": 2, "tensor_parallel_degree": 2, "context_parallel_degree": 1,
                   "data_parallel_replicate_degree": 2, "data_parallel_shard_degree": 1,
                   "pipeline_parallel_schedule": "1F1B", "pipeline_parallel_layers_per_stage": 4,
                   "pipeline_parallel_first_stage_less_layers": 0,
                   "pipeline_parallel_last_stage_less_layers": 0, "pipeline_parallel_microbatch_size": 2}
    # local batch per data-parallel rank: share 2 x 16 micro-batches; global = 4 x 16
    assert train == {"seq_len": 2048, "global_batch_size": 64, "mixed_precision_param": "bfloat16",
                     "local_batch_size": 32}
    assert data["activation_checkpoint"] == {"mode": "full"}
    script = files["node0-a.sh"]
    assert "-m torchtitan.train" in script and '--job.config_file "$DIR/torchtitan.toml"' in script


def test_uneven_split_lists_every_module_once():
    data, _ = config(make_plan(blocks=((0, 3), (3, 8))))
    parts = data["parallelism"]["module_fqns_per_model_part"]
    assert "pipeline_parallel_layers_per_stage" not in data["parallelism"]
    assert parts[0] == ["tok_embeddings", "layers.0", "layers.1", "layers.2"]
    assert parts[1] == [f"layers.{i}" for i in range(3, 8)] + ["norm", "output"]


def test_interleaved_even_and_uneven():
    data, _ = config(make_plan(blocks=((0, 4), (4, 8)), schedule="interleaved-1f1b", virtual_stages=2))
    assert data["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert data["parallelism"]["pipeline_parallel_layers_per_stage"] == 2
    data, _ = config(make_plan(blocks=((0, 2), (2, 8)), schedule="interleaved-1f1b", virtual_stages=2))
    parts = data["parallelism"]["module_fqns_per_model_part"]
    # loop order: chunk c of stage s is part c * p + s; stage 0 holds 2 blocks, stage 1 six
    assert [len([n for n in p if n.startswith("layers.")]) for p in parts] == [1, 3, 1, 3]
    assert layers_of(parts) == (["tok_embeddings"] + [f"layers.{i}" for i in range(8)] + ["norm", "output"])


def test_zb_h1_names_the_class_and_lists_one_part_per_rank():
    # InterleavedZeroBubble is a multi-stage class: torchtitan's layers_per_stage path would
    # demand 2 parts per rank, so the parts are listed
    data, _ = config(make_plan(blocks=((0, 4), (4, 8)), schedule="zb-h1"))
    par = data["parallelism"]
    assert par["pipeline_parallel_schedule"] == "InterleavedZeroBubble"
    assert len(par["module_fqns_per_model_part"]) == 2 and "pipeline_parallel_schedule_csv" not in par


@pytest.mark.parametrize("schedule,name", [("zb-v", "ZBVZeroBubble"), ("dualpipev", "DualPipeV")])
def test_v_schedules_name_torchtitans_class_and_list_parts_in_v_order(schedule, name):
    # torchtitan (pipeline_parallel.py at the pinned commit) gives rank r global stages r and
    # 2p - 1 - r of the parts listed: stages of 2 and 6 blocks are pieces of 1, 3 | 3, 1
    # dealt down and back, so rank 0 holds the embedding's piece and the head's
    data, _ = config(make_plan(blocks=((0, 2), (2, 8)), schedule=schedule, virtual_stages=2))
    par = data["parallelism"]
    assert par["pipeline_parallel_schedule"] == name and "pipeline_parallel_schedule_csv" not in par
    parts = par["module_fqns_per_model_part"]
    assert [len([n for n in p if n.startswith("layers.")]) for p in parts] == [1, 3, 3, 1]
    assert parts[0][0] == "tok_embeddings" and parts[3][-2:] == ["norm", "output"]
    assert layers_of(parts) == (["tok_embeddings"] + [f"layers.{i}" for i in range(8)] + ["norm", "output"])
    # even pieces: torchtitan's own even split in global stage order is the same V
    data, _ = config(make_plan(blocks=((0, 4), (4, 8)), schedule=schedule, virtual_stages=2))
    assert data["parallelism"]["pipeline_parallel_layers_per_stage"] == 2


def test_v_schedule_names_exist_in_installed_torch():
    pipelining = pytest.importorskip("torch.distributed.pipelining")
    for name in ("ZBVZeroBubble", "DualPipeV"):
        assert pipelining.schedules.get_schedule_class(name).__name__ == f"Schedule{name}"


def test_schedule_csv():
    data, files = config(make_plan(blocks=((0, 4), (4, 8)), schedule="zb-h1"), schedule_csv=True)
    par = data["parallelism"]
    assert par["pipeline_parallel_schedule"] == "PipelineScheduleSingle"
    assert par["pipeline_parallel_schedule_csv"] == CSV_FILE
    assert files[CSV_FILE] == actions_csv(generate("zb-h1", 2, 16))
    assert f'--parallelism.pipeline_parallel_schedule_csv "$DIR/{CSV_FILE}"' in files["node1-b.sh"]


def test_one_stage_has_no_pipeline_keys_and_accumulates():
    plan = make_plan([[rep(["a:0", "a:1"]), rep(["a:2", "a:3"])]], blocks=((0, 8),), zero_stage=0)
    data, _ = config(plan)
    assert not [k for k in data["parallelism"] if k.startswith("pipeline_parallel_") and k != "pipeline_parallel_degree"]
    assert data["training"]["local_batch_size"] == 2 and data["training"]["global_batch_size"] == 64
    # --schedule-csv on one stage: nothing to write, and the config says so (a review found it
    # passed over in silence, where the pipelining format writes a one-rank CSV)
    _, files = config(plan, schedule_csv=True)
    assert CSV_FILE not in files and "one stage, so there is no pipeline schedule" in files[CONFIG_FILE]
    assert "no pipeline schedule" not in config(plan)[1][CONFIG_FILE]


def test_zero_1_becomes_fsdp_with_a_note():
    data, files = config(make_plan())
    assert data["parallelism"]["data_parallel_shard_degree"] == 2
    assert data["parallelism"]["data_parallel_replicate_degree"] == 1
    assert "zero_stage 1: torchtitan has no optimizer-only sharding" in files[CONFIG_FILE]


def test_precision_and_recompute():
    data, _ = config(make_plan(recompute="selective", inputs={
        "cluster": "t", "model": make_plan().inputs.model,
        "training": {"global_batch_size": 64, "seq_len": 2048, "precision": "fp32"}}))
    assert data["training"]["mixed_precision_param"] == "float32"
    assert data["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}


def test_recompute_op_is_torchtitans_policy_and_selective_says_it_differs():
    data, files = config(make_plan(recompute="op"))
    assert data["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert "recompute op: torchtitan's per-op selective activation checkpointing, as priced" in files[CONFIG_FILE]
    _, files = config(make_plan(recompute="selective"))
    assert "re-plan with recompute op to price what torchtitan runs" in files[CONFIG_FILE]
    with pytest.raises(InputError, match="recompute op is torchtitan's per-op checkpointing"):
        render(make_plan(recompute="op"), "megatron", master_addr="h")
    with pytest.raises(InputError, match="recompute op: PipelineModule only checkpoints whole layers"):
        render(make_plan(recompute="op"), "deepspeed", master_addr="h")


def refusal(plan, **kw) -> str:
    with pytest.raises(InputError) as exc:
        render(plan, "torchtitan", master_addr="h", **kw)
    return str(exc.value)


def test_refusals():
    uneven_tp = make_plan([[rep(["a:0", "a:1"]), rep(["a:2", "a:3"])], [rep(["b:0"]), rep(["b:1"])]])
    assert "stage 1 replica 0 (and 1 more of its replicas) has tp 1" in refusal(uneven_tp)
    uneven_count = make_plan([[rep(["a:0", "a:1"]), rep(["a:2", "a:3"])],
                              [rep(["b:0", "b:1"], 1), rep(["b:2", "b:3"], 2), rep(["b:4", "b:5"], 1)]])
    assert "stage 1 has 3 replicas, stage 0 has 2: torchtitan" in refusal(uneven_count)
    shares = make_plan([[rep(["a:0", "a:1"], 3), rep(["a:2", "a:3"], 1)],
                        [rep(["b:0", "b:1"], 3), rep(["b:2", "b:3"], 1)]])
    assert "splits each micro-batch unevenly" in refusal(shares)
    fp16 = make_plan(inputs={"cluster": "t", "model": make_plan().inputs.model,
                             "training": {"global_batch_size": 64, "seq_len": 2048, "precision": "fp16"}})
    assert "precision fp16: torchtitan's training.mixed_precision_param is bfloat16 or float32" in refusal(fp16)
    rounds = make_plan(schedule="zb-h1", num_micro_batches=5)
    assert "multiple of its rounds" in refusal(rounds)
    assert render(rounds, "torchtitan", master_addr="h", schedule_csv=True)[CSV_FILE]


def test_cli(tmp_path, capsys):
    good, bad = tmp_path / "plan.json", tmp_path / "bad.json"
    good.write_text(make_plan().dumps())
    bad.write_text(make_plan(schedule="zb-h1", num_micro_batches=5).dumps())
    assert main(["launch", str(good), "--format", "torchtitan", "--master-addr", "h",
                 "-o", str(tmp_path / "out")]) == 0
    assert tomllib.loads((tmp_path / "out" / CONFIG_FILE).read_text())["parallelism"]
    assert main(["launch", str(bad), "--format", "torchtitan", "--master-addr", "h"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_plan_priced_with_the_fused_loss_is_told_torchtitans_is_plain():
    _, files = config(make_plan())
    assert "re-plan with training cross_entropy: plain" in files[CONFIG_FILE]
    plain = make_plan(inputs={"cluster": "t", "model": make_plan().inputs.model,
                              "training": {"global_batch_size": 64, "seq_len": 2048, "cross_entropy": "plain"}})
    _, files = config(plain)
    assert "cross_entropy: plain" not in files[CONFIG_FILE]


def _with_training(**choices):
    return make_plan(inputs={"cluster": "t", "model": make_plan().inputs.model,
                             "training": {"global_batch_size": 64, "seq_len": 2048, **choices}})


def test_compile_follows_the_plans_elementwise_choice():
    # fused (the default): each block compiled, the loss left eager as priced
    data, files = config(make_plan())
    assert data["compile"] == {"enable": True, "components": ["model"]}
    assert "Re-plan with elementwise: eager" in files[CONFIG_FILE]
    data, files = config(_with_training(elementwise="eager"))
    assert data["compile"] == {"enable": False}
    assert "torch.compile would run faster than priced" in files[CONFIG_FILE]


def test_megatron_and_deepspeed_note_an_eager_plan_without_refusing():
    eager = _with_training(elementwise="eager")
    for fmt, notes_of in (("megatron", lambda f: f["megatron_args.json"]),
                          ("deepspeed", lambda f: f["deepspeed_pipeline.json"])):
        fused_text = notes_of(render(make_plan(), fmt, master_addr="h"))
        eager_text = notes_of(render(eager, fmt, master_addr="h"))
        assert "elementwise: fused" in eager_text and "faster than priced" in eager_text, fmt
        assert "faster than priced" not in fused_text, fmt


def test_megatron_notes_a_plan_priced_with_the_plain_loss():
    """Megatron-LM runs its fused vocab-parallel loss whatever the plan priced: a plain-loss
    plan is launched with a note saying so, a fused one without."""
    plain = render(_with_training(cross_entropy="plain"), "megatron", master_addr="h")["megatron_args.json"]
    fused = render(make_plan(), "megatron", master_addr="h")["megatron_args.json"]
    assert "cross_entropy: the plan priced F.cross_entropy" in plain
    assert "cross_entropy: the plan priced" not in fused
