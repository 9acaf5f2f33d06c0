"""``planner profile --from-run`` on hand-built measurements (no processes): the profiles it
writes price each replica at what it measured, keep the cost model's layer ratio, leave the
warm-up steps out, and bad files exit 2 naming the field. The real run is
tests/test_profile_from_run_slow.py."""

from __future__ import annotations

import json
import statistics

import pytest

from planner import api
from planner.cli.main import main
from planner.cost.compute import block_timing, head_timing, replica_compute
from planner.cost.evaluate import context_for_plan
from planner.launch.measurements import build, trained_record
from planner.launch.runner import RankInfo, model_shape
from planner.plan import Plan
from planner.profile import ProfileSet

# Two GPU types of identical specs: the cost model cannot tell them apart, a run can.
CLUSTER = """\
name: two-cpus
nodes:
  - name: fast
    gpu: {name: cpu-a, memory: 4 GB, peak_tflops: 0.078, memory_bandwidth: 12.5 GB/s, intra_node_bandwidth: 1 GB/s}
    gpus_per_node: 1
    network_bandwidth: 8 Gbit/s
  - name: slow
    gpu: {name: cpu-b, memory: 4 GB, peak_tflops: 0.078, memory_bandwidth: 12.5 GB/s, intra_node_bandwidth: 1 GB/s}
    gpus_per_node: 1
    network_bandwidth: 8 Gbit/s
"""
MODEL = {"name": "fr", "num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "vocab_size": 256}
PER_SEQ_S = {"cpu-a": 0.004, "cpu-b": 0.012}   # measured compute per sequence (the 2nd 3x slower)
ALLREDUCE_S = 0.003
MICRO_BATCHES = 2


def make_plan(precision: str = "bf16", seq_len: int = 64) -> Plan:
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "two-cpus", "model": MODEL,
                   "training": {"global_batch_size": 8 * MICRO_BATCHES, "seq_len": seq_len,
                                "precision": precision,
                                # what the runner computes, so its profiles answer as timed
                                "attention": "unfused", "cross_entropy": "plain"}},
        "micro_batch_size": 8, "num_micro_batches": MICRO_BATCHES, "schedule": "1f1b",
        "stages": [{"index": 0, "blocks": [0, 2], "embedding": True, "head": True, "replicas": [
            {"gpu_type": "cpu-a", "tp": 1, "micro_batch_share": 4, "devices": ["fast:0"]},
            {"gpu_type": "cpu-b", "tp": 1, "micro_batch_share": 4, "devices": ["slow:0"]}]}]})


def measurements(plan: Plan, steps: int = 5, first_step_x: float = 10.0) -> dict:
    """A run whose replica on type g computes ``PER_SEQ_S[g]`` per sequence (step 0, the
    warm-up, ``first_step_x`` times that) and all-reduces for ``ALLREDUCE_S``."""
    reps = plan.stages[0].replicas
    ranks = [RankInfo(j, r.devices[0], 0, j, 0) for j, r in enumerate(reps)]
    per_rank, step_time = {j: [] for j in range(len(reps))}, []
    for i in range(steps):
        x = first_step_x if i == 0 else 1.0
        compute = [x * MICRO_BATCHES * r.micro_batch_share * PER_SEQ_S[r.gpu_type] for r in reps]
        for j, c in enumerate(compute):
            per_rank[j].append({"share": reps[j].micro_batch_share, "forward_s": c / 3,
                                "backward_s": 2 * c / 3, "recv_wait_s": 0.0,
                                "sync_wait_s": max(compute) - c + ALLREDUCE_S})
        step_time.append(max(compute) + ALLREDUCE_S)
    return build(plan, ranks, per_rank, step_time, None,
                 trained_record(model_shape(plan), "float32", "gloo", False, None))


@pytest.fixture
def files(tmp_path):
    plan = make_plan()
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "plan.json").write_text(plan.dumps())
    (tmp_path / "m.json").write_text(json.dumps(measurements(plan)))
    return tmp_path, plan


def convert(tmp, *extra) -> int:
    return main(["profile", "--from-run", str(tmp / "m.json"), "--plan", str(tmp / "plan.json"),
                 "--cluster", str(tmp / "cluster.yaml"), "-o", str(tmp / "prof"), *extra])


def test_profiles_price_each_replica_at_its_measured_time(files, capsys):
    tmp, plan = files
    assert convert(tmp, "--json") == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert sorted(summary["files"]) == [str(tmp / "prof" / "cpu-a.yaml"), str(tmp / "prof" / "cpu-b.yaml")]
    profiles = ProfileSet.load(tmp / "prof")   # the files load as any profile does
    cluster = api.load_cluster(tmp / "cluster.yaml")
    ctx = context_for_plan(plan, profiles=profiles)
    for node in cluster.node_list:
        per_mb = replica_compute(ctx, node.gpu, node.group.intra_Bps, 1, 4, 2, True, True)
        want = 4 * PER_SEQ_S[node.gpu.name]
        assert per_mb.total_s == pytest.approx(want, rel=1e-5), node.gpu.name
        assert set(ctx.sources.values()) == {"measured"}
    # the run computed in fp32; the file says it stands in for the plan's bf16
    text = (tmp / "prof" / "cpu-b.yaml").read_text()
    assert "dtype: fp32" in text and "- bf16" in text and "memory: not measured" in text
    assert "peak_memory_bytes" not in text and "median of steps 1..4" in text


def test_layer_ratio_is_the_cost_models(files):
    tmp, plan = files
    cluster = api.load_cluster(tmp / "cluster.yaml")
    result = api.profile_from_run(cluster, plan, tmp / "m.json")
    # no profiles: the roofline's ratio, computed as the runner ran it (fp32, unfused, plain loss)
    ctx0 = context_for_plan(plan, precision="fp32", flash_attention=False, cross_entropy="plain")
    node = cluster.node_by_name["slow"]
    block = block_timing(ctx0, node.gpu, node.group.intra_Bps, 1, 4)
    head = head_timing(ctx0, node.gpu, node.group.intra_Bps, 1, 4)
    entries = {e.layer: e for e in result.profiles["cpu-b"].entries}
    assert entries["block"].forward_s / entries["head"].forward_s == pytest.approx(block.forward_s / head.forward_s)
    assert entries["block"].backward_s / entries["block"].forward_s == pytest.approx(block.backward_s / block.forward_s)
    # the slow type's layers take 3x the fast type's once the fixed per-micro-batch cost is out
    overhead = ctx0.calibration.for_gpu(node.gpu).microbatch_overhead_s
    fast = {e.layer: e for e in result.profiles["cpu-a"].entries}
    assert entries["block"].forward_s / fast["block"].forward_s == pytest.approx(
        (4 * PER_SEQ_S["cpu-b"] - overhead) / (4 * PER_SEQ_S["cpu-a"] - overhead))


def test_a_flash_plans_run_is_split_and_labelled_as_the_runner_computed_it(tmp_path):
    """The runner computes attention unfused whatever the plan priced: a flash plan's profiles
    take the unfused core's layer ratio and say attention: unfused."""
    base = make_plan(seq_len=512)
    plan = base.model_copy(update={"inputs": base.inputs.model_copy(update={
        "training": {**base.inputs.training, "attention": "flash"}})})
    (tmp_path / "m.json").write_text(json.dumps(measurements(plan)))
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    cluster = api.load_cluster(tmp_path / "cluster.yaml")
    result = api.profile_from_run(cluster, plan, tmp_path / "m.json")
    node = cluster.node_by_name["slow"]
    entries = {e.layer: e for e in result.profiles["cpu-b"].entries}
    assert result.profiles["cpu-b"].attention == "unfused"
    ratios = {}
    for flash in (False, True):
        ctx = context_for_plan(plan, precision="fp32", flash_attention=flash, cross_entropy="plain")  # the run's
        b, h = (f(ctx, node.gpu, node.group.intra_Bps, 1, 4) for f in (block_timing, head_timing))
        ratios[flash] = b.forward_s / h.forward_s
    assert ratios[False] != pytest.approx(ratios[True])      # the kernels price apart at this length
    assert entries["block"].forward_s / entries["head"].forward_s == pytest.approx(ratios[False])


def test_the_runs_head_is_split_as_the_plain_loss_the_runner_computed(files):
    """The runner's head is F.cross_entropy on fp32 logits (tiny_model.head_loss_sum), the plain
    loss, whatever the plan priced (device_report prices its runs so): a fused-loss plan's
    profiles take the plain loss's head ratio, not the fused kernel's."""
    tmp, runners = files
    plan = runners.model_copy(update={"inputs": runners.inputs.model_copy(update={
        "training": {**runners.inputs.training, "cross_entropy": "fused"}})})
    assert plan.training_choice("cross_entropy") == "fused"
    (tmp / "m-fused.json").write_text(json.dumps(measurements(plan)))
    cluster = api.load_cluster(tmp / "cluster.yaml")
    result = api.profile_from_run(cluster, plan, tmp / "m-fused.json")
    node = cluster.node_by_name["slow"]
    entries = {e.layer: e for e in result.profiles["cpu-b"].entries}
    ratios = {}
    for loss in ("fused", "plain"):
        ctx = context_for_plan(plan, precision="fp32", flash_attention=False, cross_entropy=loss)
        b, h = (f(ctx, node.gpu, node.group.intra_Bps, 1, 4) for f in (block_timing, head_timing))
        ratios[loss] = (b.forward_s / h.forward_s, h.backward_s / h.forward_s)
    assert ratios["fused"][0] != pytest.approx(ratios["plain"][0])    # the kernels price apart
    head = entries["head"]
    assert entries["block"].forward_s / head.forward_s == pytest.approx(ratios["plain"][0])
    assert head.backward_s / head.forward_s == pytest.approx(ratios["plain"][1])


def test_the_runs_layers_are_split_in_the_dtype_it_computed(files):
    """The runner computes a bf16 plan in float32 (its measurements' trained.dtype; the profiles
    say dtype fp32): the layers are split in the fp32 pricing's proportions, where the GEMMs run
    at the FP32 peak and every tensor is 4 bytes, not in the bf16 plan's."""
    tmp, plan = files
    assert plan.inputs.training["precision"] == "bf16"
    cluster = api.load_cluster(tmp / "cluster.yaml")
    result = api.profile_from_run(cluster, plan, tmp / "m.json")
    assert result.profiles["cpu-b"].dtype == "fp32"
    node = cluster.node_by_name["slow"]
    entries = {e.layer: e for e in result.profiles["cpu-b"].entries}
    ratios = {}
    for precision in ("bf16", "fp32"):
        ctx = context_for_plan(make_plan(precision=precision), flash_attention=False, cross_entropy="plain")
        b, h = (f(ctx, node.gpu, node.group.intra_Bps, 1, 4) for f in (block_timing, head_timing))
        ratios[precision] = b.forward_s / h.forward_s
    assert ratios["bf16"] != pytest.approx(ratios["fp32"])
    assert entries["block"].forward_s / entries["head"].forward_s == pytest.approx(ratios["fp32"])


def test_warmup_steps_are_left_out(files):
    tmp, plan = files
    cluster = api.load_cluster(tmp / "cluster.yaml")
    base = api.profile_from_run(cluster, plan, tmp / "m.json")
    (tmp / "m2.json").write_text(json.dumps(measurements(plan, first_step_x=50.0)))
    other = api.profile_from_run(cluster, plan, tmp / "m2.json")
    assert base.profiles["cpu-b"].entries == other.profiles["cpu-b"].entries
    assert base.steps_used == (1, 4)
    # two steps: with the warm-up counted the median is halfway to its 50x time
    (tmp / "m3.json").write_text(json.dumps(measurements(plan, steps=2, first_step_x=50.0)))
    kept = api.profile_from_run(cluster, plan, tmp / "m3.json", warmup=0)
    assert kept.steps_used == (0, 1)
    block = {r.steps_used: next(e for e in r.profiles["cpu-b"].entries if e.layer == "block")
             for r in (base, kept)}
    assert block[(0, 1)].forward_s > 20 * block[(1, 4)].forward_s


def test_evaluate_with_the_profile_predicts_the_measured_step_closer(files):
    tmp, plan = files
    cluster = api.load_cluster(tmp / "cluster.yaml")
    assert convert(tmp, "--quiet") == 0
    doc = json.loads((tmp / "m.json").read_text())
    measured = statistics.median(s["step_time_s"] for s in doc["steps"][1:])
    # the runner all-reduces gradients after the last backward (docs/profiles.md)
    before = api.evaluate(cluster, plan, grad_reduce_overlap=False).iteration_time_s
    after = api.evaluate(cluster, plan, profiles=tmp / "prof", grad_reduce_overlap=False).iteration_time_s
    err_before, err_after = abs(before / measured - 1), abs(after / measured - 1)
    assert err_after < err_before, f"error without the profile {err_before:+.1%}, with it {err_after:+.1%}"


def _drop_replica(d):
    d["steps"][2]["replicas"].pop(1)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(plan_sha256="0" * 64), "plan_sha256"),
    (_drop_replica, "steps[2].replicas"),
    (lambda d: d["steps"][1]["replicas"][0].update(compute_s=0.0), "steps[1].replicas[0].compute_s"),
    (lambda d: d["steps"][3]["replicas"][1].update(compute_s=-0.5), "steps[3].replicas[1].compute_s"),
    (lambda d: d["steps"][2].update(step_time_s=0), "steps[2].step_time_s"),
    (lambda d: d.pop("trained"), "trained"),
    (lambda d: d["trained"]["shape"].update(hidden_size=64), "trained.shape.hidden_size"),
    (lambda d: d["trained"]["shape"].update(seq_len=16), "trained.shape.seq_len"),
    (lambda d: d["trained"].update(dtype="float64"), "trained.dtype"),
    (lambda d: d.update(steps=d["steps"][:1]), "steps"),
    # less measured than the cost model's fixed per-micro-batch overhead: nothing to split
    (lambda d: d["steps"][2]["replicas"][0].update(compute_s=1e-4), "steps[2] stage 0 replica 0 compute_s"),
])
def test_bad_measurements_exit_2_naming_the_field(files, capsys, mutate, field):
    tmp, _ = files
    doc = json.loads((tmp / "m.json").read_text())
    mutate(doc)
    (tmp / "m.json").write_text(json.dumps(doc))
    assert convert(tmp) == 2
    err = capsys.readouterr().err
    assert f"{field}:" in err, err
    assert not (tmp / "prof").exists()


@pytest.mark.parametrize("drop, flag", [("--plan", "--plan"), ("--cluster", "--cluster"), ("-o", "-o/--output")])
def test_missing_options_exit_2(files, capsys, drop, flag):
    tmp, _ = files
    args = {"--plan": str(tmp / "plan.json"), "--cluster": str(tmp / "cluster.yaml"), "-o": str(tmp / "prof")}
    args.pop(drop)
    rc = main(["profile", "--from-run", str(tmp / "m.json"), *[x for kv in args.items() for x in kv]])
    assert rc == 2 and flag in capsys.readouterr().err
