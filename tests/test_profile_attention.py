"""A profile's block timed with one attention kernel prices a plan of the other by the
roofline's ratio between the two (profile/store.py ``attention_of``, cost/compute.py), and a
file of the plan's own kernel answers first and as timed."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from test_profile_e2e import MODEL_FILE, SEQ_LEN

from planner.cost.compute import block_timing, gemm_curve_for
from planner.cost.context import CostContext
from planner.cost.roofline import block_work
from planner.profile import ProfileSet
from planner.spec import load_model

FWD_S, BWD_S = 0.008, 0.016     # the synthetic block at micro-batch 2


def _profile(tmp_path, attention: str, scale: float = 1.0):
    entries = [{"layer": "block", "micro_batch": 2, "tp": 1, "forward_s": FWD_S * scale,
                "backward_s": BWD_S * scale, "peak_memory_bytes": 1}]
    data = {"schema": "planner.profile/v1", "device": {"kind": "cpu", "name": "test cpu"},
            "torch_version": "x", "dtype": "bf16", "attention": attention,
            "created": "2026-12-04T00:00:00+00:00", "seq_len": SEQ_LEN,
            "model": load_model(MODEL_FILE).to_mapping(),
            "settings": {"warmup": 0, "repeats": 1, "timer": "wall-clock", "memory": "none"},
            "entries": entries}
    path = tmp_path / f"{attention}-{scale}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _context(profiles, flash: bool) -> CostContext:
    return CostContext(model=load_model(MODEL_FILE), seq_len=SEQ_LEN, precision="bf16",
                       flash_attention=flash, profiles=profiles)


def _roofline(ctx: CostContext, gpu, flash: bool):
    other = dataclasses.replace(ctx, flash_attention=flash, cache={}, sources={}, profiles=None)
    return block_work(other, gemm_curve_for(other, gpu), 1, 2)


@pytest.fixture
def gpu():
    from test_profile_e2e import ROOT

    from planner.spec import load_cluster
    return load_cluster(ROOT / "cluster_specs" / "cpu-local.yaml").node_list[0].gpu


@pytest.mark.parametrize("timed_with, plan_flash", [("fused", False), ("unfused", True)])
def test_a_block_timed_with_the_other_kernel_is_repriced_by_the_rooflines_ratio(tmp_path, gpu, timed_with, plan_flash):
    profiles = ProfileSet.load(_profile(tmp_path, timed_with))
    ctx = _context(profiles, plan_flash)
    t = block_timing(ctx, gpu, gpu.intra_node_bandwidth_Bps, 1, 2)
    mine, theirs = _roofline(ctx, gpu, plan_flash), _roofline(ctx, gpu, timed_with == "fused")
    assert t.forward_s == pytest.approx(FWD_S * mine.forward_s / theirs.forward_s)
    assert t.backward_s == pytest.approx(BWD_S * mine.backward_s / theirs.backward_s)
    # the roofline's kernels differ on this block, so the check above is not the identity
    assert mine.forward_s != pytest.approx(theirs.forward_s)
    lookup = next(row for row in profiles.usage()["lookups"] if row["layer"] == "block")
    assert lookup["source"] == "measured" and lookup["profile_attention"] == timed_with


def test_a_file_of_the_plans_kernel_answers_as_timed_and_first(tmp_path, gpu):
    # both kernels measured for the same shape: each plan takes its own, unadjusted
    profiles = ProfileSet.load([_profile(tmp_path, "fused", 1.0), _profile(tmp_path, "unfused", 3.0)])
    fused = block_timing(_context(profiles, True), gpu, gpu.intra_node_bandwidth_Bps, 1, 2)
    assert (fused.forward_s, fused.backward_s) == pytest.approx((FWD_S, BWD_S))
    unfused = block_timing(_context(profiles, False), gpu, gpu.intra_node_bandwidth_Bps, 1, 2)
    assert (unfused.forward_s, unfused.backward_s) == pytest.approx((3 * FWD_S, 3 * BWD_S))
    assert not any("profile_attention" in row for row in profiles.usage()["lookups"])


def test_attention_does_not_split_layers_without_one(tmp_path):
    """Heads and embeddings have no attention core: a file's kernel does not key them, so two
    files of different kernels timing the same head still conflict."""
    from planner.errors import InputError
    model = load_model(MODEL_FILE).to_mapping()

    def head_file(attention):
        data = {"schema": "planner.profile/v1", "device": {"kind": "cpu", "name": "test cpu"},
                "torch_version": "x", "dtype": "bf16", "attention": attention,
                "created": "2026-12-04T00:00:00+00:00", "seq_len": SEQ_LEN, "model": model,
                "settings": {"warmup": 0, "repeats": 1, "timer": "wall-clock", "memory": "none"},
                "entries": [{"layer": "head", "micro_batch": 2, "tp": 1, "forward_s": 0.002,
                             "backward_s": 0.004, "peak_memory_bytes": 1}]}
        path = tmp_path / f"head-{attention}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path
    with pytest.raises(InputError, match="already measured"):
        ProfileSet.load([head_file("fused"), head_file("unfused")])


def test_a_measured_head_is_repriced_for_a_fused_loss_plan(tmp_path, gpu):
    """Every profile times the head with F.cross_entropy on fp32 logits (the plain loss): a
    plain-loss plan takes it as timed, a fused-loss plan by the roofline's ratio."""
    from planner.cost.compute import head_timing
    from planner.cost.roofline import head_work
    model = load_model(MODEL_FILE).to_mapping()
    data = {"schema": "planner.profile/v1", "device": {"kind": "cpu", "name": "test cpu"},
            "torch_version": "x", "dtype": "bf16", "created": "2026-12-04T00:00:00+00:00",
            "seq_len": SEQ_LEN, "model": model,
            "settings": {"warmup": 0, "repeats": 1, "timer": "wall-clock", "memory": "none"},
            "entries": [{"layer": "head", "micro_batch": 2, "tp": 1, "forward_s": 0.002,
                         "backward_s": 0.004, "peak_memory_bytes": 1}]}
    path = tmp_path / "head.yaml"
    path.write_text(yaml.safe_dump(data))
    profiles = ProfileSet.load(path)
    timings = {}
    for loss in ("plain", "fused"):
        ctx = dataclasses.replace(_context(profiles, True), cross_entropy=loss)
        timings[loss] = head_timing(ctx, gpu, gpu.intra_node_bandwidth_Bps, 1, 2)
    assert (timings["plain"].forward_s, timings["plain"].backward_s) == pytest.approx((0.002, 0.004))
    bare = _context(None, True)
    works = {loss: head_work(dataclasses.replace(bare, cross_entropy=loss), gemm_curve_for(bare, gpu), 1, 2)
             for loss in ("plain", "fused")}
    assert works["fused"][0] < works["plain"][0]       # the fused loss moves fewer bytes
    assert timings["fused"].forward_s == pytest.approx(0.002 * works["fused"][0] / works["plain"][0])
    assert timings["fused"].backward_s == pytest.approx(0.004 * works["fused"][1] / works["plain"][1])


def test_the_plan_says_which_measured_costs_were_repriced(tmp_path):
    """A plan priced from profiles of other kernels records which layer costs were re-priced
    (inputs.profiles.repriced), and the plan file reads back."""
    from test_profile_e2e import ROOT

    from planner import api
    from planner.plan import Plan
    cluster = api.load_cluster(ROOT / "cluster_specs" / "cpu-local.yaml")
    from planner.spec import Training
    training = Training(global_batch_size=8, seq_len=SEQ_LEN, attention="unfused")
    result = api.plan(cluster, str(MODEL_FILE), training, time_limit_s=5)
    repriced = result.plan.inputs.profiles["repriced"]
    assert any("/block/" in k and "fused attention" in v for k, v in repriced.items())
    assert any("/head/" in k and "plain loss" in v for k, v in repriced.items())
    assert Plan.from_json(result.plan.to_json()).inputs.profiles["repriced"] == repriced
    # the record is the cost model's own (compute.py writes it where it applies a ratio), and
    # evaluate --json carries the same entries
    assert result.evaluation.repriced == repriced
    assert result.evaluation.to_json()["repriced"] == repriced
    assert set(repriced) <= {k for k, v in result.evaluation.sources.items() if v != "estimated"}
