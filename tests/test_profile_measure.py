"""Measuring with torch on CPU: entries, memory, OOM handling, the command, calibration."""

from __future__ import annotations

import pytest
import yaml

torch = pytest.importorskip("torch")

from planner.cli.main import main  # noqa: E402
from planner.errors import InputError  # noqa: E402
from planner.profile import ProfileSet  # noqa: E402
from planner.profile import measure  # noqa: E402
from planner.spec import load_model  # noqa: E402

TINY = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "vocab_size": 128, "mlp": "gelu"}
GQA = {"name": "tiny-gqa", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
       "num_kv_heads": 1, "vocab_size": 128, "mlp": "swiglu", "ffn_hidden_size": 96}


def by_key(profile):
    return {(e.layer, e.micro_batch, e.tp): e for e in profile.entries}


def test_measures_every_entry_and_sharding_shrinks_memory():
    prof = measure.measure_profile(load_model(TINY), "cpu", [1, 4], [1, 2], 16, "fp32",
                                   warmup=1, repeats=2)
    assert prof.device.kind == "cpu" and prof.device.gpu_type == "cpu"
    assert prof.device.threads == 1 and prof.settings.timer == "thread-cpu-time"
    entries = by_key(prof)
    assert len(entries) == 3 * 2 * 2
    for e in entries.values():
        assert e.fits and e.forward_s > 0 and e.backward_s > 0 and e.peak_memory_bytes > 0
    # Activations grow with the micro-batch; a TP rank holds half the block's weights.
    assert entries[("block", 4, 1)].activation_bytes > 3 * entries[("block", 1, 1)].activation_bytes
    assert entries[("block", 1, 2)].peak_memory_bytes < entries[("block", 1, 1)].peak_memory_bytes
    assert entries[("head", 1, 2)].peak_memory_bytes < entries[("head", 1, 1)].peak_memory_bytes


def test_gqa_swiglu_block_shards_per_rank():
    model = load_model(GQA)
    s = measure.RankShape.of(model, 2)
    assert (s.heads, s.kv_heads, s.ffn) == (2, 1, 48)  # one KV head kept (replicated) per rank
    block = measure.Block(s)
    x = torch.randn(2, 8, 64, requires_grad=True)
    y = block(x)
    y.sum().backward()
    assert y.shape == x.shape and x.grad is not None
    assert block.qkv.out_features == (2 + 2 * 1) * 16 and block.fc1.out_features == 2 * 48
    assert isinstance(block.norm1, torch.nn.RMSNorm)
    assert measure.check_tp(model, 3) is not None and measure.check_tp(model, 2) is None


def test_out_of_memory_is_recorded_and_larger_batches_skipped(monkeypatch):
    real = measure._make_case

    def fake(kind, s, mb, *args):
        if kind == "block" and mb >= 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(kind, s, mb, *args)

    monkeypatch.setattr(measure, "_make_case", fake)
    tried = []
    prof = measure.measure_profile(load_model(TINY), "cpu", [1, 2, 4], [1], 8, "fp32", warmup=0,
                                   repeats=1, progress=tried.append)
    entries = by_key(prof)
    assert entries[("block", 1, 1)].fits
    assert not entries[("block", 2, 1)].fits and not entries[("block", 4, 1)].fits
    assert entries[("head", 4, 1)].fits  # other layers go on
    assert len(tried) == 9
    # Other errors are not swallowed.
    monkeypatch.setattr(measure, "_make_case", lambda *a: (_ for _ in ()).throw(ValueError("bug")))
    with pytest.raises(ValueError):
        measure.measure_profile(load_model(TINY), "cpu", [1], [1], 8, "fp32", warmup=0, repeats=1)


def test_cuda_without_gpu_is_an_input_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(InputError, match="--device cuda"):
        measure.measure_profile(load_model(TINY), "cuda", [1], [1], 8, "bf16")


def test_command_writes_a_profile_that_store_reads(tmp_path, capsys):
    model_file = tmp_path / "tiny.yaml"
    model_file.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "p.yaml"
    rc = main(["profile", "--model", str(model_file), "--device", "cpu", "--micro-batch", "1,2",
               "--tp", "1,2", "--seq-len", "16", "--repeats", "2", "--warmup", "0", "-o", str(out),
               "--quiet"])
    assert rc == 0
    text = out.read_text()
    assert text.startswith("schema: planner.profile/v1")
    data = yaml.safe_load(text)
    assert data["seq_len"] == 16 and data["dtype"] == "fp32" and data["device"]["gpu_type"] == "cpu"
    ps = ProfileSet.load(out)
    entry = next(e for e in data["entries"] if e["layer"] == "block" and e["micro_batch"] == 2
                 and e["tp"] == 2)
    assert ps.lookup("cpu", "block", 2, 2, 16, TINY) == (entry["forward_s"], entry["backward_s"])
    # Bad flags: exit 2 with a message naming the flag.
    assert main(["profile", "--model", str(model_file), "--tp", "3", "-o", str(out)]) == 2
    assert "--tp" in capsys.readouterr().err
    assert main(["profile", "--model", str(model_file), "--micro-batch", "0", "-o", str(out)]) == 2
    assert main(["profile", "--model", str(model_file)]) == 2


def test_calibration_recovers_a_synthetic_device(tmp_path):
    """A profile generated by the roofline itself with known parameters fits back to them."""
    from dataclasses import replace

    from planner.cost.calibration import default_calibration
    from planner.profile.calibrate import _total_s, calibrate_file
    from planner.spec import load_cluster
    cluster_file = tmp_path / "c.yaml"
    cluster_file.write_text(
        "name: c\nnodes:\n  - name: n\n    gpu: {name: fake, memory: 4 GB, peak_tflops: 0.1,\n"
        "          memory_bandwidth: 10 GB/s, intra_node_bandwidth: 1 GB/s}\n"
        "    gpus_per_node: 2\n    network_bandwidth: 8 Gbit/s\n")
    cluster = load_cluster(cluster_file)
    gpu = cluster.node_list[0].gpu
    model = load_model({**TINY, "hidden_size": 256})
    truth = replace(default_calibration().for_gpu(gpu), eff_max=0.5, tokens_half=300.0,
                    width_half=50.0, layer_overhead_s=0.0)
    entries = []
    for tp in (1, 2):
        for mb in (1, 2, 4, 8):
            t = _total_s(model, 64, gpu, truth, mb, tp)
            entries.append({"layer": "block", "micro_batch": mb, "tp": tp, "forward_s": t / 3,
                            "backward_s": 2 * t / 3, "peak_memory_bytes": 1})
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "schema": "planner.profile/v1", "device": {"kind": "cuda", "name": "x", "gpu_type": "fake"},
        "torch_version": "x", "dtype": "bf16", "created": "2026-12-02", "seq_len": 64,
        "model": model.to_mapping(),
        "settings": {"warmup": 0, "repeats": 1, "timer": "t", "memory": "m"}, "entries": entries}))
    result = calibrate_file(path, cluster=cluster)
    assert result.error_after < 0.02 < result.error_before
    assert result.fitted.eff_max == pytest.approx(0.5, rel=0.15)
    data = result.to_yaml_data()
    assert data["gpus"]["fake"]["eff_max"] == result.fitted.eff_max
    assert "profile-fit:fake" in data["provenance"]
    # Through the command, with -o.
    out = tmp_path / "cal.yaml"
    assert main(["profile", "--calibrate", str(path), "--cluster", str(cluster_file), "-o", str(out),
                 "--quiet"]) == 0
    assert yaml.safe_load(out.read_text())["gpus"]["fake"]["tokens_half"] > 0
    # An inline type unknown without --cluster: exit 2.
    assert main(["profile", "--calibrate", str(path), "--quiet"]) == 2
