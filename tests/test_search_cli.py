"""`planner plan`: writes a schema-valid plan that `planner evaluate` reproduces exactly;
stdout stays JSON with --json; bad flags exit 2, an infeasible job exits 1 with numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli.main import main
from planner.cost import evaluate
from planner.plan import Plan
from planner.plan.schema import validate_plan_json
from planner.spec import load_cluster

CLUSTER = "cluster_specs/tiny-2gpu.yaml"
BASE = ["plan", CLUSTER, "--model", "opt-350m", "--global-batch-size", "4", "--seq-len", "256",
        "--time-limit", "60"]


def test_plan_writes_a_valid_plan_that_evaluate_reproduces(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(BASE + ["-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tokens/s" in text and "solver: optimal" in text
    # the answer against the baselines, from the plan's own report
    assert f"baseline: as good as the best baseline layout ({json.loads(out.read_text())['solver']['baseline']})" \
        in " ".join(text.split())
    data = json.loads(out.read_text())
    validate_plan_json(data)
    plan = Plan.from_json(data)
    assert out.read_text() == plan.dumps()                  # canonical, sorted keys
    ev = evaluate(load_cluster(CLUSTER), plan)
    assert ev.iteration_time_s == plan.predicted.iteration_time_s
    assert ev.tokens_per_s == plan.predicted.tokens_per_s
    assert plan.solver.status == "optimal" and plan.launch is not None
    # and through the evaluate command
    assert main(["evaluate", CLUSTER, str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] == plan.predicted.iteration_time_s


def test_json_output_is_clean(capfd):
    assert main(BASE + ["--json"]) == 0
    out = capfd.readouterr().out
    assert json.loads(out)["schema"] == "planner.plan/v1"   # no solver banner on stdout


@pytest.mark.parametrize("extra", [
    ["--time-limit", "0"], ["--objective", "fastest"], ["--objective", "cost", "--budget-usd-per-hour", "5"],
    ["--objective", "throughput", "--min-tokens-per-s", "10"], ["--top", "0"], ["--training", "cluster_specs/tiny-2gpu.yaml"],
    ["--time-limit", "nan"], ["--time-limit", "inf"], ["--budget-usd-per-hour", "nan"],
    ["--global-batch-size", "0"], ["--global-batch-size", "99999999999999999999"],
])
def test_bad_flags_exit_2(extra, capsys):
    assert main(BASE + extra) == 2
    assert "error:" in capsys.readouterr().err


def test_missing_batch_exits_2(capsys):
    assert main(["plan", CLUSTER, "--model", "opt-350m"]) == 2


def test_infeasible_exits_1_with_the_numbers(capsys):
    code = main(["plan", CLUSTER, "--model", "llama3-70b", "--global-batch-size", "2", "--seq-len", "4096",
                 "--time-limit", "60", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1
    assert "GiB" in err and "over by" in err and "would fit" in err


def test_precision_that_contradicts_the_training_file_exits_2(tmp_path, capsys):
    t = tmp_path / "t.yaml"
    t.write_text("global_batch_size: 4\nseq_len: 256\nprecision: bf16\n")
    args = ["plan", CLUSTER, "--model", "opt-350m", "--training", str(t), "--time-limit", "60", "--quiet"]
    assert main(args + ["--precision", "fp16"]) == 2
    assert "contradicts" in capsys.readouterr().err
    assert main(args + ["--precision", "bf16"]) == 0       # the same as the file's: no contradiction


def test_kernel_flags_reach_the_plan_and_may_not_contradict_the_file(tmp_path, capsys):
    """--attention and --cross-entropy go into the plan's inputs.training (evaluate prices what
    they say); against a training file they follow --precision's rule."""
    out = tmp_path / "plan.json"
    assert main(["plan", CLUSTER, "--model", "opt-350m", "--global-batch-size", "4", "--seq-len", "256",
                 "--attention", "flash", "--cross-entropy", "plain", "--time-limit", "60", "--quiet",
                 "-o", str(out)]) == 0
    training = json.loads(out.read_text())["inputs"]["training"]
    assert training["attention"] == "flash" and training["cross_entropy"] == "plain"
    assert "attention" not in capsys.readouterr().err     # stated: no note
    assert main(["plan", CLUSTER, "--model", "opt-350m", "--global-batch-size", "4", "--seq-len", "256",
                 "--time-limit", "60", "--quiet", "-o", str(out)]) == 0
    assert "attention" not in capsys.readouterr().err     # the default (flash): no note either
    assert json.loads(out.read_text())["inputs"]["training"]["attention"] == "flash"   # written all the same
    t = tmp_path / "t.yaml"
    t.write_text("global_batch_size: 4\nseq_len: 256\n")
    args = ["plan", CLUSTER, "--model", "opt-350m", "--training", str(t), "--time-limit", "60", "--quiet"]
    assert main(args + ["--attention", "unfused"]) == 2
    assert "--attention unfused contradicts attention: flash" in capsys.readouterr().err
    assert main(args + ["--cross-entropy", "fused"]) == 0      # the file's own (default) value

def test_budget_below_every_plan_exits_1_at_once_with_the_price(capsys):
    """In bf16 tiny-mixed's V100 node sits out and its A100 node rents at 13.7236 USD/hour (4 x
    the catalog's 3.4309): a budget of 10 is out of reach, said from the price floors (no tuple solved; before, the search ran to its limit and
    blamed the time limit)."""
    code = main(["plan", "cluster_specs/tiny-mixed.yaml", "--model", "opt-350m", "--global-batch-size", "8",
                 "--seq-len", "256", "--budget-usd-per-hour", "10", "--time-limit", "60", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1
    assert "budget of 10 USD/hour" in err and "at least 13.7236 USD/hour" in err


def test_a_batch_no_allowed_share_splits_is_told_as_such(tmp_path, capsys):
    """8 sequences with shares of 3 need 3 replicas; the 2-GPU cluster holds 2.  The reason
    is the split, not memory."""
    t = tmp_path / "t.yaml"
    t.write_text("global_batch_size: 8\nseq_len: 256\nmicro_batch_sizes: [3]\n")
    code = main(["plan", CLUSTER, "--model", "opt-350m", "--training", str(t), "--time-limit", "60", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1
    assert "cannot be split" in err and "[3]" in err and "memory" not in err


def test_bf16_search_leaves_gpus_without_bf16_idle_and_says_why():
    from planner import api

    cluster = api.load_cluster(Path(__file__).parent.parent / "cluster_specs" / "tiny-mixed.yaml")
    model = api.load_model({"name": "small", "num_layers": 4, "hidden_size": 256,
                            "num_attention_heads": 4, "vocab_size": 1000})
    bf16 = api.plan(cluster, model, api.Training(global_batch_size=8, seq_len=256), time_limit_s=30)
    assert all(d.startswith("a100") for d in bf16.plan.devices())
    assert any("V100-SXM2-32GB has no bf16" in line for line in bf16.idle)
    fp16 = api.plan(cluster, model, api.Training(global_batch_size=8, seq_len=256, precision="fp16"),
                    time_limit_s=30)
    assert not any("no bf16" in line for line in fp16.idle)


def test_solver_banner_silenced():
    """HiGHS prints a banner on fd 1 at its first use; the MILP runs with fd 1 on /dev/null, so
    neither stdout (JSON) nor stderr (--quiet) carries it.  A fresh process: the banner comes
    once per process."""
    import subprocess
    import sys
    code = ("import random, sys; sys.path.insert(0, 'tests'); from test_search_core import random_problem;"
            "from planner.search.core.milp import solve_milp;"
            "prob = next(p for p in (random_problem(random.Random(s)) for s in range(100)) if p.num_stages == 3);"
            "print('status', solve_milp(prob)[0].status)")
    run = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in __import__("os").environ.items() if k != "PLANNER_DEBUG"})
    assert run.returncode == 0, run.stderr
    assert "status" in run.stdout
    assert "HiGHS" not in run.stdout and "HiGHS" not in run.stderr


def test_debug_switch_reads_off_values(monkeypatch):
    from planner.errors import debug_enabled
    for value, on in (("", False), ("0", False), ("false", False), ("off", False), ("1", True), ("yes", True)):
        monkeypatch.setenv("PLANNER_DEBUG", value)
        assert debug_enabled() is on, value
    monkeypatch.delenv("PLANNER_DEBUG")
    assert debug_enabled() is False


def test_idle_gpus_are_explained_under_the_objective_and_only_claimed_when_proved():
    """The reason for idle GPUs names what using them would not win under the objective, and
    an answer that is not proved does not claim that they would not help."""
    from planner import api
    from planner.cost import topology_for
    from planner.search.answer import idle_gpus
    from planner.search.classes import class_infos
    from planner.search.objectives import ObjectiveSpec

    cluster = api.load_cluster(Path(__file__).parent.parent / "cluster_specs" / "tiny-mixed.yaml")
    model = api.load_model({"name": "small", "num_layers": 4, "hidden_size": 256,
                            "num_attention_heads": 4, "vocab_size": 1000})
    training = api.Training(global_batch_size=8, seq_len=256, precision="fp16")
    cheap = api.plan(cluster, model, training, objective="cost", time_limit_s=30)
    assert cheap.report.status == "optimal" and cheap.idle
    assert all("does not lower the cost per token" in line for line in cheap.idle)
    assert not any("shorten the iteration" in line for line in cheap.idle)
    classes = class_infos(topology_for(cluster), "fp16")
    unproved = idle_gpus(classes, cheap.plan, cluster, ObjectiveSpec("cost"), proved=False)
    assert unproved and all("not proved" in line and "does not lower" not in line for line in unproved)


def test_output_goes_through_a_symlink_and_refuses_what_is_not_a_file(tmp_path, capsys):
    """-o renames a finished temp file into place: through a symlink it must land in the
    link's target (the link stays), and a FIFO or a device (not a regular file) is refused
    before the search, not replaced by a plan."""
    import os
    import stat

    target = tmp_path / "target.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert main(BASE + ["--quiet", "-o", str(link)]) == 0
    assert link.is_symlink() and json.loads(target.read_text())["schema"] == "planner.plan/v1"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert main(BASE + ["--quiet", "-o", str(fifo)]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_gpus_needed_for_the_weights_are_rounded_up():
    """'at least N GPUs' must hold the state: N x room >= need, rounded up, not to nearest
    (6803.72 GiB over 73.0 GiB per GPU is 93.2: 93 GPUs would not hold it)."""
    import re

    from planner import api
    from planner.errors import InfeasibleError

    cluster = api.load_cluster(Path(__file__).parent.parent / CLUSTER)
    with pytest.raises(InfeasibleError) as err:
        api.plan(cluster, api.load_model("llama3-405b"), api.Training(global_batch_size=32, seq_len=2048),
                 time_limit_s=30)
    text = str(err.value)
    need, gpus, room = (float(x) for x in re.search(
        r"need ([\d.]+) GiB even split .* the (\d+) GPUs hold ([\d.]+) GiB", text).groups())
    n = int(re.search(r"at least (\d+) GPUs of these types", text).group(1))
    per_gpu = room / gpus
    assert n * per_gpu >= need * (1 - 1e-4) and (n - 1) * per_gpu < need


def test_a_class_the_budget_cannot_rent_is_left_out_and_said_so():
    """Under a budget, options whose own rent is over it are out of the search (they kept the
    bound low: a 54% gap after 10 s on this 8-GPU cluster), and the idle reason says why.  At the
    catalog prices the V100 node rents at 15.61 USD/hour (4 x 3.9015), the A100 node at 13.72."""
    from planner import api

    cluster = api.load_cluster(Path(__file__).parent.parent / "cluster_specs" / "tiny-mixed.yaml")
    res = api.plan(cluster, api.load_model("opt-350m"),
                   api.Training(global_batch_size=32, seq_len=2048, precision="fp16"),
                   budget_usd_per_hour=15.0, time_limit_s=10)
    assert res.report.status == "optimal"
    assert res.evaluation.usd_per_hour <= 15.0
    assert any("V100" in line and "15.61 USD/hour, over the budget of 15" in line for line in res.idle)


def test_a_floor_out_of_reach_is_explained_without_contradiction(capsys):
    """The first bound allows ~243,500 tokens/s (flash attention, the default), above a floor of
    200,000 that no plan meets (the best is ~182,800): the reason must not quote that bound as if
    it explained anything."""
    code = main(["plan", "cluster_specs/tiny-mixed.yaml", "--model", "opt-350m", "--global-batch-size", "32",
                 "--seq-len", "2048", "--precision", "fp16", "--objective", "cost", "--min-tokens-per-s",
                 "200000", "--time-limit", "60", "--quiet"])
    err = capsys.readouterr().err
    assert code == 1
    assert "no plan reaches 200000 tokens/s" in err and "shown to take more than" in err
    assert "at most" not in err


def test_top_k_plans_are_written_beside_the_best(tmp_path, capsys):
    """-o with --top 3: the best plan in the file named, plans 2 and 3 beside it, each one
    distinct, schema-valid and reproduced by evaluate; the table tells them apart."""
    out = tmp_path / "plan.json"
    assert main(BASE + ["--top", "3", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    files = [out, tmp_path / "plan-2.json", tmp_path / "plan-3.json"]
    assert "plan-2.json" in text and "plan-3.json" in text
    plans = [Plan.from_json(json.loads(f.read_text())) for f in files]
    assert len({p.dumps() for p in plans}) == 3
    times = []
    for p in plans:
        validate_plan_json(p.to_json())
        times.append(evaluate(load_cluster(CLUSTER), p).iteration_time_s)
        assert times[-1] == p.predicted.iteration_time_s
    assert times == sorted(times)


def test_a_huge_global_batch_in_a_training_file_is_refused_with_its_line(tmp_path, capsys):
    """10^14 sequences would spend the run finding the batch's divisors; the file's line and
    field say what is allowed instead."""
    t = tmp_path / "t.yaml"
    t.write_text("seq_len: 128\nglobal_batch_size: 99999999999999\n")
    assert main(["plan", CLUSTER, "--model", "opt-350m", "--training", str(t), "--time-limit", "5"]) == 2
    err = capsys.readouterr().err
    assert f"{t}:2:" in err and "global_batch_size" in err and "1000000000" in err


def test_evaluate_warns_when_the_cluster_file_changed_since_the_plan(tmp_path, capfd):
    """The plan records its cluster file's sha256: evaluating it on an edited cluster (here a
    new price) warns on stderr; on the same file, or a byte-identical copy, it does not."""
    out = tmp_path / "plan.json"
    assert main(BASE + ["--quiet", "-o", str(out)]) == 0
    same = tmp_path / "same.yaml"
    same.write_text(Path(CLUSTER).read_text())
    edited = tmp_path / "edited.yaml"
    edited.write_text(Path(CLUSTER).read_text() + "\n# edited\n")
    capfd.readouterr()
    for path, warned in ((CLUSTER, False), (same, False), (edited, True)):
        assert main(["evaluate", str(path), str(out), "--json"]) == 0
        err = capfd.readouterr().err
        assert ("is not the cluster file" in err) == warned, path


def test_a_sequence_longer_than_the_model_takes_is_warned_about(capsys):
    """opt-350m is defined for 2,048 tokens: planning for 4,096 works but says so on stderr."""
    base = [a if a != "256" else "4096" for a in BASE]
    assert main(base + ["--quiet"]) == 0
    assert "at most 2048 tokens; planning for 4096" in capsys.readouterr().err
    assert main(BASE + ["--quiet"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_mixed_stages_give_a_stage_of_two_gpu_types_that_evaluate_reproduces(tmp_path, capsys):
    """tiny-mixed: one node of A100s and one of V100s in one zone.  With --mixed-stages the
    best plan runs both in one stage, the A100s on the larger share; it is written, passes
    the schema, and evaluate reproduces it.  Without the flag the plan is pure and slower."""
    base = ["plan", "cluster_specs/tiny-mixed.yaml", "--model", "opt-350m", "--global-batch-size", "32",
            "--seq-len", "1024", "--precision", "fp16", "--time-limit", "60", "--json"]
    assert main(base) == 0
    pure = Plan.from_json(json.loads(capsys.readouterr().out))
    out = tmp_path / "mixed.json"
    assert main([*base, "--mixed-stages", "-o", str(out)]) == 0
    capsys.readouterr()
    plan = Plan.from_json(json.loads(out.read_text()))
    assert plan.solver.status == "optimal"
    mixed = [st for st in plan.stages if len({r.gpu_type for r in st.replicas}) == 2]
    assert mixed
    share = {r.gpu_type: r.micro_batch_share for r in mixed[0].replicas}
    assert share["A100-SXM4-80GB"] > share["V100-SXM2-32GB"]
    assert plan.predicted.tokens_per_s > pure.predicted.tokens_per_s
    ev = evaluate(load_cluster("cluster_specs/tiny-mixed.yaml"), plan)
    assert ev.iteration_time_s == plan.predicted.iteration_time_s


def test_mixed_stages_contradict_a_uniform_launcher(capsys):
    assert main(BASE + ["--mixed-stages", "--launcher", "megatron"]) == 2
    assert "contradict --launcher megatron" in capsys.readouterr().err


def test_a_training_file_with_mixed_stages_contradicts_a_uniform_launcher(tmp_path, capsys):
    t = tmp_path / "t.yaml"
    t.write_text("global_batch_size: 4\nseq_len: 256\nmixed_stages: true\n")
    assert main(["plan", CLUSTER, "--model", "opt-350m", "--training", str(t), "--launcher", "megatron"]) == 2
    assert "contradict --launcher megatron" in capsys.readouterr().err


def test_replan_searches_mixed_stages_again_when_the_plan_did(tmp_path, capsys):
    """The plan carries ``mixed_stages`` in inputs.training, so replan on the same cluster
    finds the same mixed plan rather than a slower pure one."""
    from planner import api
    cluster = load_cluster("cluster_specs/tiny-mixed.yaml")
    training = api.Training(global_batch_size=32, seq_len=1024, precision="fp16", mixed_stages=True)
    old = api.plan(cluster, api.load_model("opt-350m"), training, time_limit_s=60).plan
    assert old.inputs.training["mixed_stages"] is True
    new = api.replan(cluster, Plan.from_json(json.loads(old.dumps())), time_limit_s=60).search.plan
    assert new.predicted.tokens_per_s == old.predicted.tokens_per_s


def test_idle_gpus_a_mixed_stage_could_use_are_not_claimed_proved_beyond_the_space():
    """Without --mixed-stages the proof that idle GPUs do not help holds in the pure space
    only; where two classes share a zone the message says so."""
    from planner import api
    from planner.spec import cluster_from_dict
    cluster = cluster_from_dict({"name": "t", "nodes": [
        {"name": "a", "gpu": "A100-SXM4-80GB", "gpus_per_node": 4, "network_bandwidth": "100 Gbit/s"},
        {"name": "v", "gpu": "V100-SXM2-32GB", "gpus_per_node": 1, "network_bandwidth": "10 Gbit/s"}]})
    model = api.load_model("opt-350m")
    for mixed in (False, True):
        res = api.plan(cluster, model, api.Training(global_batch_size=16, seq_len=1024, precision="fp16",
                                                    mixed_stages=mixed), time_limit_s=30)
        assert res.report.status == "optimal" and len(res.idle) == 1
        assert ("--mixed-stages also searches" in res.idle[0]) is not mixed


def test_elementwise_flag_reaches_the_plan_off_its_default_and_follows_the_file_rule(tmp_path, capsys):
    """--elementwise eager goes into the plan's inputs.training and slows it (every op's pass);
    fused, the default, is left out of the plan; against a training file it follows
    --precision's rule."""
    out, base = tmp_path / "eager.json", tmp_path / "fused.json"
    llama = tmp_path / "llama.yaml"   # a small Llama: RMSNorm, RoPE, GQA, SwiGLU (what eager prices)
    llama.write_text("name: small-llama\nnum_layers: 4\nhidden_size: 1024\nnum_attention_heads: 16\n"
                     "num_kv_heads: 4\nffn_hidden_size: 3584\nmlp: swiglu\nvocab_size: 32000\n"
                     "position_embedding: rope\nnormalization: rmsnorm\nlinear_bias: false\n")
    job = ["plan", CLUSTER, "--model", str(llama), "--global-batch-size", "4", "--seq-len", "256",
           "--time-limit", "60", "--quiet", "--deterministic"]
    assert main(job + ["--elementwise", "eager", "-o", str(out)]) == 0
    assert main(job + ["-o", str(base)]) == 0
    eager, fused = json.loads(out.read_text()), json.loads(base.read_text())
    assert eager["inputs"]["training"]["elementwise"] == "eager"
    assert "elementwise" not in fused["inputs"]["training"]
    assert eager["predicted"]["tokens_per_s"] < fused["predicted"]["tokens_per_s"]
    t = tmp_path / "t.yaml"
    t.write_text("global_batch_size: 4\nseq_len: 256\nelementwise: eager\n")
    args = ["plan", CLUSTER, "--model", "opt-350m", "--training", str(t), "--time-limit", "60", "--quiet"]
    assert main(args + ["--elementwise", "fused"]) == 2
    assert "--elementwise fused contradicts elementwise: eager" in capsys.readouterr().err
    assert main(args + ["--elementwise", "eager"]) == 0


def test_schedule_help_lists_every_searchable_schedule():
    """--schedule's help names every schedule the search can price (it listed three of six)."""
    from click.testing import CliRunner

    from planner.cli.main import cli
    from planner.search.schedules import SCHEDULES
    out = " ".join(CliRunner().invoke(cli, ["plan", "--help"]).output.split())
    for name in SCHEDULES:
        assert name in out.split("pipeline schedules to search:")[1].split("(default")[0], name


def test_the_summary_says_when_no_baseline_layout_fits(tmp_path, capsys, monkeypatch):
    """24 H100 in three nodes and llama3-70b: the baseline rules have no layout of whole nodes
    that fits (the sweep read the silence as a baseline never tried); the summary says so.  The
    per-node view is off here: with a node per class the Metis rule has a 20-stage layout."""
    import sys
    monkeypatch.setattr(sys.modules["planner.search.solve"], "per_node_view", lambda classes, training: False)
    spec = tmp_path / "h24.yaml"
    spec.write_text("name: h24\nnodes:\n  - {name: h, count: 3, gpu: H100-SXM5-80GB, gpus_per_node: 8, "
                    "network_bandwidth: 3200 Gbit/s}\n")
    assert main(["plan", str(spec), "--model", "llama3-70b", "--global-batch-size", "256", "--seq-len", "4096",
                 "--time-limit", "20"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "baseline: no baseline layout (the Megatron, Sailor and Metis rules) fits this cluster and job" in text
