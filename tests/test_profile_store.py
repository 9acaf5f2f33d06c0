"""Reading profiles: lookups, interpolation, usage records, and located errors (no torch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner.errors import InputError
from planner.profile import ProfileSet, load_profiles
from planner.spec import load_model

MODEL = {"name": "toy", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
         "num_kv_heads": 4, "ffn_hidden_size": 1024, "mlp": "gelu", "vocab_size": 1024,
         "tied_embeddings": False}


def profile_data(device=None, entries=None, **top) -> dict:
    data = {
        "schema": "planner.profile/v1",
        "device": device or {"kind": "cuda", "name": "NVIDIA A100-SXM4-80GB"},
        "torch_version": "2.13.0", "dtype": "bf16", "created": "2026-12-02T00:00:00+00:00",
        "seq_len": 128, "model": dict(MODEL),
        "settings": {"warmup": 1, "repeats": 3, "timer": "cuda-events", "memory": "test"},
        "entries": entries if entries is not None else [
            {"layer": "block", "micro_batch": 1, "tp": 1, "forward_s": 0.010, "backward_s": 0.020,
             "peak_memory_bytes": 1000},
            {"layer": "block", "micro_batch": 4, "tp": 1, "forward_s": 0.040, "backward_s": 0.080,
             "peak_memory_bytes": 4000},
            {"layer": "block", "micro_batch": 8, "tp": 1, "fits": False},
            {"layer": "head", "micro_batch": 1, "tp": 2, "forward_s": 0.003, "backward_s": 0.005,
             "peak_memory_bytes": 10},
        ],
    }
    data.update(top)
    return data


def write(tmp_path: Path, data: dict, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_exact_interpolated_and_missing_lookups(tmp_path):
    ps = ProfileSet.load(write(tmp_path, profile_data()))
    model = load_model(MODEL)
    # Catalog aliases: the device name maps to A100-SXM4-80GB, any alias finds it.
    assert ps.lookup("A100-SXM4-80GB", "block", 1, 1, 128, model) == (0.010, 0.020)
    assert ps.lookup("a100-80gb", "block", 4, 1, 128, model) == (0.040, 0.080)
    fwd, bwd = ps.lookup("A100_80GB", "block", 2, 1, 128, model)
    assert fwd == pytest.approx(0.020) and bwd == pytest.approx(0.040)
    # Beyond the measured range (8 did not fit): no extrapolation.
    assert ps.lookup("A100-SXM4-80GB", "block", 6, 1, 128, model) is None
    # Other tp, seq_len, GPU type or block shape: a miss.
    assert ps.lookup("A100-SXM4-80GB", "block", 1, 2, 128, model) is None
    assert ps.lookup("A100-SXM4-80GB", "block", 1, 1, 256, model) is None
    assert ps.lookup("H100-SXM5-80GB", "block", 1, 1, 128, model) is None
    other = load_model({**MODEL, "hidden_size": 512})
    assert ps.lookup("A100-SXM4-80GB", "block", 1, 1, 128, other) is None
    # A deeper model with the same blocks reuses the measurement.
    deeper = load_model({**MODEL, "num_layers": 32})
    assert ps.lookup("A100-SXM4-80GB", "block", 4, 1, 128, deeper) == (0.040, 0.080)
    usage = ps.usage()
    assert (usage["measured"], usage["interpolated"], usage["estimated"]) == (2, 1, 5)
    assert usage["files"][0]["gpu_type"] == "A100-SXM4-80GB"
    assert {"gpu_type": "A100_80GB", "layer": "block", "micro_batch": 2, "tp": 1, "seq_len": 128,
            "source": "interpolated"} in usage["lookups"]
    ps.reset_usage()
    assert ps.usage()["lookups"] == []


def test_lookup_accepts_mapping_and_catalog_name(tmp_path):
    ps = ProfileSet.load(write(tmp_path, profile_data()))
    assert ps.lookup("A100-SXM4-80GB", "head", 1, 2, 128, dict(MODEL)) == (0.003, 0.005)


def test_directory_cpu_default_and_gpu_type_override(tmp_path):
    write(tmp_path, profile_data(device={"kind": "cpu", "name": "Some CPU"}), "a.yaml")
    write(tmp_path, profile_data(device={"kind": "cuda", "name": "Mystery GPU", "gpu_type": "mygpu"},
                                 seq_len=256), "b.yml")
    ps = ProfileSet.load(tmp_path)
    assert ps.gpu_types == ["cpu", "mygpu"]
    assert ps.lookup("cpu", "block", 1, 1, 128, MODEL) == (0.010, 0.020)
    assert ps.lookup("mygpu", "block", 1, 1, 256, MODEL) == (0.010, 0.020)
    # --gpu-type on load overrides what the file says.
    forced = ProfileSet.load(tmp_path / "a.yaml", gpu_type="L4")
    assert forced.lookup("L4-24GB", "block", 1, 1, 128, MODEL) == (0.010, 0.020)


def located(exc: InputError) -> str:
    return str(exc)


@pytest.mark.parametrize("mutate, where, words", [
    (lambda d: d.update(schema="planner.profile/v0"), ":1:9: schema", "planner.profile/v1"),
    (lambda d: d["device"].update(name="Voodoo 5"), ": device.name", "gpu_type"),
    (lambda d: d["entries"][0].update(forward_s=-1.0), ": entries[0].forward_s", "positive"),
    (lambda d: d["entries"][1].update(backward_s=0), ": entries[1].backward_s", "positive"),
    (lambda d: d["entries"][0].pop("peak_memory_bytes"), ": entries[0]", "peak_memory_bytes"),
    (lambda d: d.pop("seq_len"), ": seq_len", "missing"),
    (lambda d: d["entries"][0].update(layer="mlp"), ": entries[0].layer", "embedding"),
])
def test_bad_files_name_file_line_column(tmp_path, mutate, where, words):
    data = profile_data()
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(InputError) as err:
        ProfileSet.load(path)
    text = located(err.value)
    assert str(path) in text and where in text and words in text
    assert err.value.exit_code == 2
    # Every message carries a line number right after the file name.
    assert text.split(str(path) + ":")[1].split(":")[0].isdigit()


def test_conflicting_files_and_missing_paths(tmp_path):
    write(tmp_path, profile_data(), "a.yaml")
    write(tmp_path, profile_data(), "b.yaml")
    with pytest.raises(InputError, match="already measured in .*a.yaml"):
        ProfileSet.load(tmp_path)
    with pytest.raises(InputError, match="not found"):
        ProfileSet.load(tmp_path / "nope.yaml")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no profile files"):
        ProfileSet.load(empty)


CLUSTER = """\
name: local
nodes:
  - name: box
    gpu: {name: cpu, memory: 4 GB, peak_tflops: 0.1, memory_bandwidth: 10 GB/s,
          intra_node_bandwidth: 1 GB/s}
    gpus_per_node: 2
    network_bandwidth: 8 Gbit/s
profiles:
  %s: prof/p.yaml
"""


def test_cluster_mapping_relative_to_spec(tmp_path):
    from planner.spec import load_cluster
    (tmp_path / "prof").mkdir()
    write(tmp_path / "prof", profile_data(device={"kind": "cpu", "name": "x"}))
    spec = tmp_path / "c.yaml"
    spec.write_text(CLUSTER % "cpu")
    cluster = load_cluster(spec)
    ps = load_profiles(cluster=cluster, cluster_path=spec)
    assert ps.lookup("cpu", "block", 4, 1, 128, MODEL) == (0.040, 0.080)
    # The same file also named by --profiles counts once (no conflict).
    both = load_profiles(tmp_path / "prof", cluster=cluster, cluster_path=spec)
    assert len(both.profiles) == 1
    assert load_profiles() is None
    spec.write_text(CLUSTER % "H100")
    with pytest.raises(InputError, match=r"c.yaml:9:9: profiles.H100: no node .* GPU type"):
        load_profiles(cluster=load_cluster(spec), cluster_path=spec)


def test_reading_profiles_does_not_import_torch():
    code = ("import sys, planner.profile, planner.profile.store, planner.profile.calibrate, "
            "planner.cli.main, planner.cli.profile; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("torch_name, gpu_type", [
    ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA H100 PCIe", "H100-PCIE-80GB"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
    ("Tesla T4", "T4-16GB"),
    ("NVIDIA GeForce RTX 4090", "RTX4090-24GB"),
    ("NVIDIA L4", "L4-24GB"),
    ("NVIDIA H200", "H200-SXM-141GB"),
    ("AMD Instinct MI300X", "MI300X-192GB"),
    ("NVIDIA Imaginary 9000", None),
])
def test_torch_device_names_map_to_catalog_ids(torch_name, gpu_type):
    from planner.profile import gpu_type_for_device
    assert gpu_type_for_device(torch_name) == gpu_type
