"""Precisions fp32 and tf32 end to end: the training spec, the GPUs' fp32 / TF32 peaks and their
stand-ins, model-state and activation memory, plan checks, the search and the CLI."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from planner import api, catalog
from planner.cli.main import main
from planner.cost import CostContext
from planner.cost.context import element_bytes, grad_bytes
from planner.cost.memory import block_activation_bytes, bytes_per_param, replica_memory
from planner.plan import Plan
from planner.plan.schema import validate_plan_json
from planner.spec import cluster_from_dict, load_cluster, load_model
from planner.spec.gpu import GpuType

SPECS = Path(__file__).parent.parent / "cluster_specs"

V100_ONLY = {"name": "v100s", "nodes": [
    {"name": "v", "count": 2, "gpu": "V100-SXM2-32GB", "gpus_per_node": 4,
     "network_bandwidth": "100 Gbit/s"}]}
INLINE = """\
name: inline
nodes:
  - name: x
    gpu: {name: mygpu, memory: 24 GB, peak_tflops: 160, memory_bandwidth: 900 GB/s,
          intra_node_bandwidth: 32 GB/s%s}
    gpus_per_node: 4
    network_bandwidth: 100 Gbit/s
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# -- training spec ------------------------------------------------------------------------------
def test_fp32_and_tf32_are_training_precisions():
    for prec in ("bf16", "fp16", "fp32", "tf32"):
        assert api.Training(global_batch_size=8, seq_len=128, precision=prec).precision == prec


def test_fp8_in_a_training_file_is_an_input_error_naming_the_field_and_the_valid_values(tmp_path, capsys):
    training = write(tmp_path, "t.yaml", "global_batch_size: 8\nseq_len: 128\nprecision: fp8\n")
    code = main(["plan", str(SPECS / "tiny-mixed.yaml"), "--model", "opt-350m", "--training", str(training)])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{training}:3:12" in err and "precision" in err and "fp8" in err
    for valid in ("bf16", "fp16", "fp32", "tf32"):
        assert valid in err
    assert "Traceback" not in err


def test_fp8_as_a_flag_is_refused_with_the_valid_choices(capsys):
    code = main(["plan", str(SPECS / "tiny-mixed.yaml"), "--model", "opt-350m", "--global-batch-size", "8",
                 "--seq-len", "128", "--precision", "fp8"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--precision" in err and all(v in err for v in ("bf16", "fp16", "fp32", "tf32"))


# -- GPU peaks ------------------------------------------------------------------------------------
def test_every_catalog_gpu_has_an_fp32_peak_and_a_tf32_entry_with_sources():
    for gid, gpu in catalog.gpus().items():
        assert gpu.fp32_tflops is not None and 0 < gpu.fp32_tflops < gpu.peak_tflops, gid
        assert gpu.sources.get("fp32_tflops"), gid
        assert gpu.sources.get("tf32_tflops"), gid   # the figure or why it is null
        if gpu.tf32_tflops is None:
            assert gpu.sources["tf32_tflops"].startswith("null"), gid
        else:
            assert gpu.fp32_tflops <= gpu.tf32_tflops <= gpu.peak_tflops, gid
        assert gpu.precision_note("fp32") is None, gid


def test_catalog_fp32_and_tf32_figures():
    want = {"V100-SXM2-32GB": (15.7, None), "A100-SXM4-80GB": (19.5, 156), "H100-SXM5-80GB": (66.9, 494.7),
            "H100-PCIE-80GB": (51, 378), "L40S-48GB": (91.6, 183), "T4-16GB": (8.1, None),
            "RTX3090-24GB": (35.6, 35.6), "RTX4090-24GB": (82.6, 82.6), "TITANRTX-24GB": (16.3, None),
            "RTX2080TI-11GB": (13.4, None), "MI250X-128GB": (95.7, None), "MI300X-192GB": (163.4, 653.7)}
    for gid, (fp32, tf32) in want.items():
        gpu = catalog.gpu(gid)
        assert (gpu.fp32_tflops, gpu.tf32_tflops) == (fp32, tf32), gid


def test_peak_flops_for_each_precision():
    a100, v100 = catalog.gpu("A100-SXM4-80GB"), catalog.gpu("V100-SXM2-32GB")
    assert a100.peak_flops_for("bf16") == a100.peak_flops_for("fp16") == a100.peak_flops == 312e12
    assert a100.peak_flops_for("fp32") == pytest.approx(19.5e12)
    assert a100.peak_flops_for("tf32") == pytest.approx(156e12)
    assert a100.precision_note("tf32") is None and a100.precision_note("bf16") is None
    # no TF32 tensor cores: PyTorch runs fp32 GEMMs on CUDA cores, priced at the fp32 peak, said so
    assert v100.peak_flops_for("tf32") == v100.peak_flops_for("fp32") == pytest.approx(15.7e12)
    note = v100.precision_note("tf32")
    assert "V100-SXM2-32GB" in note and "TF32" in note and "15.7" in note
    with pytest.raises(ValueError, match="fp8"):
        a100.peak_flops_for("fp8")


def test_a_gpu_without_fp32_figures_falls_back_to_a_sixteenth_of_its_peak_with_a_warning():
    gpu = GpuType(name="mygpu", memory="24 GB", peak_tflops=160, memory_bandwidth="900 GB/s",
                  intra_node_bandwidth="32 GB/s")
    for prec in ("fp32", "tf32"):
        assert gpu.peak_flops_for(prec) == pytest.approx(10e12)
        note = gpu.precision_note(prec)
        assert "mygpu" in note and prec in note and "peak_tflops / 16" in note
    only_fp32 = gpu.model_copy(update={"fp32_tflops": 20.0})
    assert only_fp32.peak_flops_for("tf32") == pytest.approx(20e12)
    assert "no TF32 tensor cores" in only_fp32.precision_note("tf32")


def test_inline_gpus_take_fp32_and_tf32_figures(tmp_path):
    cluster = load_cluster(write(tmp_path, "c.yaml", INLINE % ", fp32_tflops: 40, tf32_tflops: 80"))
    gpu = cluster.nodes[0].gpu
    assert (gpu.fp32_tflops, gpu.tf32_tflops) == (40, 80)
    assert cluster.precision_notes("tf32") == [] and cluster.precision_notes("fp32") == []
    with pytest.raises(api.InputError, match=r"c\.yaml:\d+:\d+: nodes\[0\]\.gpu\.fp32_tflops"):
        load_cluster(write(tmp_path, "c.yaml", INLINE % ", fp32_tflops: -1"))


def test_an_inline_copy_of_a_catalog_gpu_takes_its_fp32_peak(tmp_path):
    a100 = catalog.gpu("A100-SXM4-80GB")
    text = INLINE.replace("name: mygpu, memory: 24 GB, peak_tflops: 160, memory_bandwidth: 900 GB/s",
                          "name: A100-SXM4-80GB, memory: 80 GB, peak_tflops: 312, memory_bandwidth: 2039 GB/s")
    text = text.replace("intra_node_bandwidth: 32 GB/s", "intra_node_bandwidth: 300 GB/s")
    gpu = load_cluster(write(tmp_path, "c.yaml", text % "")).nodes[0].gpu
    assert (gpu.fp32_tflops, gpu.tf32_tflops) == (a100.fp32_tflops, a100.tf32_tflops)
    with pytest.raises(api.InputError, match="catalog's A100-SXM4-80GB with other figures"):
        load_cluster(write(tmp_path, "c.yaml", text % ", fp32_tflops: 40"))


def test_catalog_gpus_command_shows_the_fp32_and_tf32_columns(capsys):
    assert main(["catalog", "gpus", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["A100-SXM4-80GB"]["fp32_tflops"] == 19.5 and data["A100-SXM4-80GB"]["tf32_tflops"] == 156
    assert data["V100-SXM2-32GB"]["tf32_tflops"] is None
    assert main(["catalog", "gpus"]) == 0
    out = capsys.readouterr().out
    assert "FP32" in out and "TF32" in out


# -- memory ---------------------------------------------------------------------------------------
def test_fp32_and_tf32_keep_16_bytes_of_model_state_per_parameter():
    for prec in ("fp32", "tf32"):
        assert bytes_per_param(prec) == (4.0, 4.0, 8.0) and sum(bytes_per_param(prec)) == 16
        assert element_bytes(prec) == 4 and grad_bytes(prec) == 4
    assert sum(bytes_per_param("bf16")) == 18 and sum(bytes_per_param("fp16")) == 20
    assert element_bytes("bf16") == element_bytes("fp16") == 2
    assert (grad_bytes("bf16"), grad_bytes("fp16")) == (4, 2)


def _ctx(precision: str, **kw) -> CostContext:
    return CostContext(model=load_model("opt-350m"), seq_len=1024, precision=precision, **kw)


def test_fp32_replica_memory_weights_grads_and_zero1_optimizer():
    gpu = catalog.gpu("A100-SXM4-80GB")
    ctx = _ctx("fp32", zero_stage=1)
    assert ctx.activation_bytes == 4 and ctx.grad_bytes_per_param == 4
    mem = replica_memory(ctx, gpu, tp=1, share=1, blocks=4, embedding=False, head=False,
                         num_replicas_in_stage=4, in_flight_micro_batches=1)
    params = mem.weights_bytes / 4
    assert mem.grads_bytes == 4 * params and mem.optimizer_bytes == 8 * params / 4   # ZeRO-1 over 4


def test_fp32_activations_double_the_tensors_but_not_the_dropout_masks():
    for recompute in ("none", "selective", "full"):
        for tp, sp in ((1, False), (2, True)):
            half = block_activation_bytes(_ctx("bf16", sequence_parallel=sp), tp, 2, recompute)
            full = block_activation_bytes(_ctx("fp32", sequence_parallel=sp), tp, 2, recompute)
            assert full == pytest.approx(block_activation_bytes(_ctx("tf32", sequence_parallel=sp), tp, 2, recompute))
            if recompute == "full":
                assert full == pytest.approx(2 * half)     # the block input only
            else:
                assert half < full < 2 * half               # 1-byte masks stay 1 byte
    # Korthikanti Table 2, no parallelism: s b h (34 + 5 a s / h) in 16 bits; in fp32 the 2-byte
    # tensors double (32 of the 34, 4 of the 5), the masks (2 and 1) do not: 66 and 9.
    m = load_model("opt-350m")
    s, b, h, a = 1024, 2, m.hidden_size, m.num_attention_heads
    assert block_activation_bytes(_ctx("fp32"), 1, b, "none") == pytest.approx(s * b * h * (66 + 9 * a * s / h))


# -- plans: checks, search, CLI -------------------------------------------------------------------
def v100_plan(precision: str) -> Plan:
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": "v100s", "model": "opt-350m",
                   "training": {"global_batch_size": 16, "seq_len": 1024, "precision": precision}},
        "micro_batch_size": 2, "num_micro_batches": 8, "schedule": "1f1b",
        "stages": [{"index": 0, "blocks": [0, 12], "embedding": True, "head": False, "replicas": [
                       {"gpu_type": "V100-SXM2-32GB", "tp": 2, "micro_batch_share": 1, "devices": ["v-0:0", "v-0:1"]},
                       {"gpu_type": "V100-SXM2-32GB", "tp": 2, "micro_batch_share": 1, "devices": ["v-0:2", "v-0:3"]}]},
                   {"index": 1, "blocks": [12, 24], "embedding": False, "head": True, "replicas": [
                       {"gpu_type": "V100-SXM2-32GB", "tp": 4, "micro_batch_share": 2,
                        "devices": ["v-1:0", "v-1:1", "v-1:2", "v-1:3"]}]}],
    })


def test_bf16_on_v100_is_refused_and_fp32_tf32_fp16_are_not():
    from planner.plan.check import check_plan

    cluster = cluster_from_dict(V100_ONLY)
    with pytest.raises(api.InputError, match="V100-SXM2-32GB has no bf16, but inputs.training.precision is bf16"):
        check_plan(cluster, v100_plan("bf16"))
    for prec in ("fp16", "fp32", "tf32"):
        check_plan(cluster, v100_plan(prec))
        validate_plan_json(v100_plan(prec).to_json())


def test_tf32_on_v100_is_priced_as_fp32():
    cluster = cluster_from_dict(V100_ONLY)
    fp32, tf32 = api.evaluate(cluster, v100_plan("fp32")), api.evaluate(cluster, v100_plan("tf32"))
    assert tf32.iteration_time_s == pytest.approx(fp32.iteration_time_s, rel=1e-12)
    assert tf32.peak_memory_bytes == fp32.peak_memory_bytes
    fp16 = api.evaluate(cluster, v100_plan("fp16"))
    # 16 bytes of model state per parameter against fp16's 20, but twice the activation bytes
    assert max(fp32.peak_memory_bytes.values()) != max(fp16.peak_memory_bytes.values())


def test_fp32_on_v100_plans_and_tf32_warns():
    cluster = cluster_from_dict(V100_ONLY)
    training = api.Training(global_batch_size=8, seq_len=256, precision="fp32")
    result = api.plan(cluster, "opt-350m", training, time_limit_s=30)
    assert result.plan.devices() and all(d.startswith("v-") for d in result.plan.devices())
    assert result.plan.inputs.training["precision"] == "fp32"
    assert result.warnings == [] and not any("bf16" in line for line in result.idle)
    validate_plan_json(result.plan.to_json())
    tf32 = api.plan(cluster, "opt-350m", training.model_copy(update={"precision": "tf32"}), time_limit_s=30)
    assert len(tf32.warnings) == 1 and "V100-SXM2-32GB has no TF32 tensor cores" in tf32.warnings[0]


def test_cli_tf32_on_v100_warns_on_stderr_and_plans(tmp_path, capsys):
    spec = write(tmp_path, "v.yaml", json.dumps(V100_ONLY))
    out = tmp_path / "plan.json"
    code = main(["plan", str(spec), "--model", "opt-350m", "--global-batch-size", "8", "--seq-len", "256",
                 "--precision", "tf32", "--time-limit", "30", "--quiet", "-o", str(out)])
    assert code == 0
    err = capsys.readouterr().err
    assert "warning: V100-SXM2-32GB has no TF32 tensor cores" in err and "fp32" in err
    assert json.loads(out.read_text())["inputs"]["training"]["precision"] == "tf32"
    assert main(["evaluate", str(spec), str(out)]) == 0
    assert "warning: V100-SXM2-32GB has no TF32 tensor cores" in capsys.readouterr().err


def test_cli_inline_gpu_without_fp32_figures_warns_and_does_not_crash(tmp_path, capsys):
    spec = write(tmp_path, "c.yaml", INLINE % "")
    code = main(["plan", str(spec), "--model", "opt-350m", "--global-batch-size", "8", "--seq-len", "256",
                 "--precision", "fp32", "--time-limit", "30", "--quiet"])
    assert code == 0
    err = capsys.readouterr().err
    assert "warning: mygpu gives no fp32_tflops" in err and "peak_tflops / 16" in err
    assert "Traceback" not in err
