"""Profiles give the backward's input-gradient (I) and weight-gradient (W) parts apart: measured
as torch's pipeline runtime splits them, optional in the file (older profiles stay valid), and
used by the cost model's W where present, the FLOPs split otherwise."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError
from test_profile_cost import CLUSTER, synthetic_profile
from test_profile_e2e import pipeline_plan

from planner.cost import evaluate
from planner.cost.compute import backward_weight_fraction
from planner.cost.context import CostContext
from planner.profile import ProfileSet
from planner.profile.schema import ProfileEntry
from planner.spec import load_cluster, load_model

torch = pytest.importorskip("torch")
measure = pytest.importorskip("planner.profile.measure")
split = pytest.importorskip("planner.profile.split")

MODEL = load_model({"name": "t", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                    "vocab_size": 128})


@pytest.mark.parametrize("kind", ["block", "head"])
def test_split_backward_gives_the_full_backwards_gradients(kind):
    """I then W (torch's stage_backward_input / _weight) computes what one backward does."""
    case = measure._make_case(kind, measure.RankShape.of(MODEL, 1), 2, 16, torch.float32,
                              torch.device("cpu"))
    measure._zero(case)
    case.backward(case.forward())
    want = [p.grad.clone() for p in case.module.parameters()] + [case.leaf.grad.clone()]
    measure._zero(case)
    out = case.forward()
    groups = split.split_backward(case, out)
    assert all(p.grad is None for p in case.module.parameters())  # I computes no weight gradient
    split.stage_backward_weight(case.module.parameters(), groups)
    got = [p.grad for p in case.module.parameters()] + [case.leaf.grad]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_measured_entries_carry_the_split():
    cpu = torch.device("cpu")
    for kind in ("block", "head"):
        e = measure.measure_entry(MODEL, kind, 2, 1, 16, "fp32", cpu, warmup=1, repeats=3)
        assert e.backward_input_s > 0 and e.backward_weight_s > 0 and 0 < e.weight_fraction < 1
        written = measure.ProfileEntry.model_validate(
            {k: v for k, v in e.model_dump().items() if v is not None})
        assert written.weight_fraction == pytest.approx(e.weight_fraction)
    emb = measure.measure_entry(MODEL, "embedding", 2, 1, 16, "fp32", cpu, warmup=0, repeats=1)
    assert emb.backward_input_s is None and emb.weight_fraction is None  # token ids have no gradient


def test_schema_split_is_optional_and_comes_in_pairs():
    base = {"layer": "block", "micro_batch": 1, "tp": 1, "forward_s": 1.0, "backward_s": 2.0,
            "peak_memory_bytes": 1}
    assert ProfileEntry.model_validate(base).weight_fraction is None   # an older profile
    e = ProfileEntry.model_validate({**base, "backward_input_s": 1.5, "backward_weight_s": 0.5})
    assert e.weight_fraction == 0.25
    with pytest.raises(ValidationError, match="come together"):
        ProfileEntry.model_validate({**base, "backward_input_s": 1.5})
    with pytest.raises(ValidationError, match="positive time"):
        ProfileEntry.model_validate({**base, "backward_input_s": 1.5, "backward_weight_s": 0.0})


def with_split(tmp_path, fractions: dict[tuple[str, int], float]):
    """The synthetic profile of test_profile_cost with I / W given for some (layer, mb)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = synthetic_profile(tmp_path)
    data = yaml.safe_load(path.read_text())
    for e in data["entries"]:
        f = fractions.get((e["layer"], e["micro_batch"]))
        if f is not None:  # any split of any total: only the ratio is used
            e["backward_input_s"], e["backward_weight_s"] = 3 * (1 - f), 3 * f
    path.write_text(yaml.safe_dump(data))
    return ProfileSet.load(path)


def ctx_for(profiles, gpu):
    from test_profile_e2e import MODEL_FILE, SEQ_LEN
    return CostContext(model=load_model(MODEL_FILE), seq_len=SEQ_LEN, profiles=profiles,
                       precision="bf16"), gpu


def test_cost_model_uses_the_measured_fraction_else_flops(tmp_path):
    gpu = load_cluster(CLUSTER).node_list[0].gpu
    profiles = with_split(tmp_path, {("block", 1): 0.2, ("block", 2): 0.4, ("head", 2): 0.7})
    ctx, gpu = ctx_for(profiles, gpu)
    assert backward_weight_fraction(ctx, gpu, 1, 1) == pytest.approx(0.2)
    assert backward_weight_fraction(ctx, gpu, 1, 2) == pytest.approx(0.4)
    assert backward_weight_fraction(ctx, gpu, 1, 2, "head") == pytest.approx(0.7)
    flops, _ = ctx_for(None, gpu)
    # head at micro-batch 1 was not split: the FLOPs split, as without a profile
    assert backward_weight_fraction(ctx, gpu, 1, 1, "head") == pytest.approx(
        backward_weight_fraction(flops, gpu, 1, 1))
    # older profile: no split anywhere, the FLOPs split
    (tmp_path / "old").mkdir()
    old, _ = ctx_for(ProfileSet.load(synthetic_profile(tmp_path / "old")), gpu)
    assert backward_weight_fraction(old, gpu, 1, 2) == pytest.approx(backward_weight_fraction(flops, gpu, 1, 2))
    assert backward_weight_fraction(flops, gpu, 1, 2) not in (pytest.approx(0.4), 0.0)


def test_interpolated_fraction_needs_both_neighbours(tmp_path):
    gpu = load_cluster(CLUSTER).node_list[0].gpu
    profiles = with_split(tmp_path, {("block", 1): 0.2, ("block", 2): 0.4})
    # measured at 1 and 2 only: 1.5 does not exist as a share, so check the helper directly
    from test_profile_e2e import MODEL_FILE, SEQ_LEN
    model = load_model(MODEL_FILE)
    name = gpu.name
    assert profiles.weight_fraction(name, "block", 2, 1, SEQ_LEN, model, precision="bf16") == pytest.approx(0.4)
    assert profiles.weight_fraction(name, "block", 4, 1, SEQ_LEN, model, precision="bf16") is None  # unmeasured
    assert profiles.weight_fraction(name, "block", 2, 1, SEQ_LEN, model, precision="fp32") is None  # other dtype
    half = with_split(tmp_path / "half", {("block", 1): 0.2})
    assert half.weight_fraction(name, "block", 2, 1, SEQ_LEN, model, precision="bf16") is None


def test_zb_h1_stage_w_follows_the_profile(tmp_path):
    cluster = load_cluster(CLUSTER)
    plan = pipeline_plan(2, micro_batch_size=2, num_micro_batches=4).model_copy(update={"schedule": "zb-h1"})
    profiles = with_split(tmp_path, {("block", 2): 0.4, ("head", 2): 0.7})
    ev = evaluate(cluster, plan, profiles=profiles)
    b_block, b_emb, b_head = 0.016, 0.0003 * 2, 0.004 * 2   # test_profile_cost's BLOCK / EMB / HEAD
    # stage 0: two blocks and the embedding (all W); stage 1: two blocks and the head
    assert ev.stages[0].backward_weight_s == pytest.approx(2 * 0.4 * b_block + b_emb)
    assert ev.stages[1].backward_weight_s == pytest.approx(2 * 0.4 * b_block + 0.7 * b_head)
