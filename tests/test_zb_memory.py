"""ZB-H1's memory rule against what a split backward really keeps (planner.cost.memory).

A zero-bubble backward runs I with ``retain_graph=True`` and keeps the weight ops' nodes for W
(torch's ``stage_backward_input``, the runner's ``SplitBackward``): so a micro-batch's saved
tensors all stay until its W, and the gradients flowing into its weight ops are kept beside
them.  Measured here on the runner's own block, then held against the cost model."""

from __future__ import annotations

import gc
import weakref

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from planner.cost import CostContext
from planner.cost.memory import (
    block_activation_bytes,
    deferred_w_micro_batches,
    in_flight_micro_batches,
    w_input_grad_bytes,
)
from planner.launch import tiny_model as tm
from planner.launch.backward_split import SplitBackward
from planner.spec import load_model

B, S = 2, 16
SHAPES = {
    "gelu": tm.Shape(num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=4, ffn_size=128,
                     vocab_size=64, seq_len=S),
    "swiglu-gqa": tm.Shape(num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, ffn_size=96,
                           vocab_size=64, seq_len=S, mlp="swiglu"),
}


class _Created(TorchDispatchMode):
    """Weak references to every tensor an op creates: what is still alive later is held."""

    def __init__(self):
        super().__init__()
        self.refs: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.refs.extend(weakref.ref(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        return out

    def alive_bytes(self, exclude: set) -> int:
        return _storage_bytes((r() for r in self.refs), exclude)


def _storage_bytes(tensors, exclude: set) -> int:
    """Bytes of the distinct storages behind ``tensors`` (None skipped), less those in ``exclude``."""
    seen, total = set(exclude), 0
    for t in tensors:
        if t is not None and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    return total


def _kept_bytes(split: SplitBackward, exclude: set) -> int:
    return _storage_bytes((g for grads in split.kept.values() for g in grads), exclude)


def _stage(shape: tm.Shape):
    """(params, stage input, output gradient, storages that are not saved tensors) of one
    fp32 micro-batch through all of ``shape``'s blocks."""
    p = tm.build_params(shape, (0, shape.num_layers), False, False, 0, torch.float32)
    x_in = torch.randn(B, S, shape.hidden_size).requires_grad_(True)
    g = torch.randn(B, S, shape.hidden_size)
    return p, x_in, g, {x_in.untyped_storage().data_ptr(), g.untyped_storage().data_ptr()}


def _forward(shape: tm.Shape, p: dict, x_in, outside: set):
    x = x_in
    for i in range(shape.num_layers):
        x = tm.block(p, i, x, shape, tm.TPContext())
    outside.add(x.untyped_storage().data_ptr())   # the stage output travels on, not a saved tensor
    return x


def _measure(shape: tm.Shape):
    """(bytes alive after F, after I, kept for W) for the blocks of one fp32 micro-batch."""
    p, x_in, g, outside = _stage(shape)
    with _Created() as created:
        x = _forward(shape, p, x_in, outside)
        after_f = created.alive_bytes(outside)
        split = SplitBackward(x, x_in, g)
        gx = split.input_grad()
        outside.add(gx.untyped_storage().data_ptr())
        gc.collect()
        after_i = created.alive_bytes(outside)
        kept = _kept_bytes(split, outside)   # the last block's output gradient is g itself
    return after_f, after_i, kept


def _ctx(shape: tm.Shape) -> CostContext:
    model = load_model({"name": "t", "num_layers": shape.num_layers, "hidden_size": shape.hidden_size,
                        "num_attention_heads": shape.num_heads, "num_kv_heads": shape.num_kv_heads,
                        "ffn_hidden_size": shape.ffn_size, "mlp": shape.mlp, "vocab_size": shape.vocab_size})
    return CostContext(model=model, seq_len=S, precision="fp32", recompute="none")


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_split_backward_keeps_every_saved_tensor_and_the_weight_ops_gradients(name):
    shape = SHAPES[name]
    after_f, after_i, kept = _measure(shape)
    # nothing of the forward is freed at I (the rule counts a micro-batch until its W) ...
    assert after_i >= after_f + kept
    # ... and the kept gradients are what w_input_grad_bytes counts, less at most the two
    # residual-stream gradients it counts whole though the next block down may share them
    per_block = w_input_grad_bytes(_ctx(shape), 1, B)
    residual = 2 * 4 * B * S * shape.hidden_size
    assert shape.num_layers * (per_block - residual) <= kept <= shape.num_layers * per_block
    # and they are a large part of a block's activations: not a rounding term
    assert kept > 0.3 * shape.num_layers * block_activation_bytes(_ctx(shape), 1, B, "none")


def test_zb_h1_waits_for_r_plus_one_w_on_rank_r_at_its_peak():
    """The counts the rule uses, read off the action lists (planner.simulate.actions.zb_h1):
    at rank r's peak of micro-batches between F and W, r + 1 of them (at most m) are between
    I and W (just after an I, before the W it lets run)."""
    from planner.simulate.actions import zb_h1
    from planner.simulate.latency import peak_waiting_w

    for p, m in ((4, 8), (4, 2), (6, 12), (1, 3)):
        sched = zb_h1(p, m)
        for r, acts in enumerate(sched.ranks):
            f = i = w = 0
            best = (0, 0)
            for a in acts:
                f, i, w = f + (a.kind == "F"), i + (a.kind == "I"), w + (a.kind == "W")
                best = max(best, (f - w, i - w))
            assert best[0] == in_flight_micro_batches("zb-h1", p, r, m)
            assert best[1] == deferred_w_micro_batches("zb-h1", p, r, m)
        # what evaluate reads off a latency-aware plan's own lists gives the same on ZB-H1's
        assert peak_waiting_w(sched) == [deferred_w_micro_batches("zb-h1", p, r, m) for r in range(p)]


def _rank_moments(acts):
    """(chunks between F and W, chunks between I and W) after each action of one rank's list."""
    f = i = w = 0
    out = []
    for a in acts:
        whole = a.kind == "B"
        f, i, w = f + (a.kind == "F"), i + (a.kind == "I" or whole), w + (a.kind == "W" or whole)
        out.append((f - w, i - w))
    return out


@pytest.mark.parametrize("name", ["zb-v", "dualpipev"])
def test_the_v_schedules_wait_for_what_the_rule_says(name):
    """torch's V schedules, as generated: the activations' peak is ``in_flight_micro_batches``;
    the most chunks between I and W at any moment (the cool-down runs I's ahead of their W's,
    after the activations' peak) is ``deferred_w_micro_batches``, exactly once m >= 2p - 1
    and at most it for fewer; so the rule's sum bounds every moment's memory whatever the
    ratio of weight-op gradient bytes to activation bytes (a review found ZB-V's rank 3 at
    p = 4, m = 8 holding 7 chunks' gradients where the rule said 1)."""
    from planner.simulate.actions import generate

    lo = 2 if name == "dualpipev" else 1
    for p in (1, 2, 3, 4, 5, 8):
        for m in sorted(set(range(lo * p, 3 * p + 2)) | {1, 2, 64}):
            if m < lo * p:
                continue
            for r, acts in enumerate(generate(name, p, m).ranks):
                moments = _rank_moments(acts)
                act_rule = in_flight_micro_batches(name, p, r, m, 2)
                w_rule = deferred_w_micro_batches(name, p, r, m)
                assert max(a for a, _ in moments) / 2 == act_rule
                most_waiting = max(g for _, g in moments) / 2
                assert most_waiting <= w_rule
                if m >= 2 * p - 1:
                    assert most_waiting == w_rule
                for ratio in (0.3, 0.725, 1.0, 12.4):
                    assert max(a + ratio * g for a, g in moments) / 2 <= act_rule + ratio * w_rule + 1e-9


def test_the_v_schedules_hold_one_micro_batch_at_their_head():
    """The head is rank 0's second chunk in a V: each micro-batch's F, I and W there run before
    the next one's F, so ``logits_in_flight`` charges two micro-batches' fp32 logits (the
    logits, then their gradient until W), not the stage's in-flight count (p and more)."""
    from planner.cost.memory import logits_in_flight
    from planner.simulate.actions import generate

    for name in ("zb-v", "dualpipev"):
        assert logits_in_flight(name) == 2.0
        for p in (2, 4, 8):
            for m in (2 * p, 2 * p + 3, 64):
                held, most = set(), 0
                for a in generate(name, p, m).ranks[0]:
                    if a.chunk == 1 and a.kind == "F":
                        held.add(a.micro_batch)
                    elif a.chunk == 1 and a.kind in ("W", "B"):
                        held.discard(a.micro_batch)
                    most = max(most, len(held))
                assert most == 1


def test_evaluate_adds_the_waiting_gradients_on_the_later_ranks():
    """Four equal stages on one node under ZB-H1: the two middle stages differ by exactly one
    micro-batch's weight-op gradients (rank 2 waits for one more W than rank 1), and under
    1F1B the same layout's middle stages differ the other way (one fewer in flight)."""
    from planner.cost import evaluate
    from planner.cost.evaluate import context_for_plan
    from planner.plan import Plan
    from planner.spec import cluster_from_dict

    cluster = cluster_from_dict({"name": "t", "nodes": [
        {"name": "a", "gpu": "A100-SXM4-80GB", "gpus_per_node": 4, "network_bandwidth": "100 Gbit/s"}]})
    model = {"name": "m", "num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
             "num_kv_heads": 4, "ffn_hidden_size": 2816, "mlp": "swiglu", "vocab_size": 32000}

    def plan(schedule):
        return Plan.from_json({
            "schema": "planner.plan/v1",
            "inputs": {"cluster": "t", "model": model,
                       "training": {"global_batch_size": 16, "seq_len": 1024, "precision": "bf16"}},
            "micro_batch_size": 2, "num_micro_batches": 8, "schedule": schedule, "recompute": "none",
            "zero_stage": 0, "sequence_parallel": False,
            "stages": [{"index": i, "blocks": [2 * i, 2 * i + 2], "embedding": i == 0, "head": i == 3,
                        "replicas": [{"gpu_type": "A100-SXM4-80GB", "tp": 1, "micro_batch_share": 2,
                                      "devices": [f"a:{i}"]}]} for i in range(4)]})

    zb, one = plan("zb-h1"), plan("1f1b")
    ctx = context_for_plan(zb)
    grads = 2 * w_input_grad_bytes(ctx, 1, 2)          # two blocks a stage
    acts = 2 * block_activation_bytes(ctx, 1, 2)
    zb_peaks = [evaluate(cluster, zb).peak_memory_bytes[f"a:{i}"] for i in range(4)]
    one_peaks = [evaluate(cluster, one).peak_memory_bytes[f"a:{i}"] for i in range(4)]
    assert zb_peaks[2] - zb_peaks[1] == pytest.approx(grads, rel=1e-9)
    assert one_peaks[1] - one_peaks[2] == pytest.approx(acts, rel=1e-9)
    # rank 1 under ZB-H1: 1F1B's three in flight, one more, and two micro-batches' gradients
    assert zb_peaks[1] - one_peaks[1] == pytest.approx(acts + 2 * grads, rel=1e-9)


def test_torch_stage_backward_input_keeps_every_saved_tensor_too():
    """What ``launch --format pipelining`` runs (torch's ScheduleInterleavedZeroBubble calls
    ``stage_backward_input``): the same, nothing of the forward freed before W."""
    from torch.distributed.pipelining._backward import stage_backward_input

    shape = SHAPES["gelu"]
    p, x_in, g, outside = _stage(shape)
    weights = [t.requires_grad_(True) for t in p.values()]
    with _Created() as created:
        x = _forward(shape, p, x_in, outside)
        after_f = created.alive_bytes(outside)
        dx, groups = stage_backward_input([x], [g], [x_in], iter(weights))
        outside.update(t.untyped_storage().data_ptr() for t in dx if t is not None)
        del x
        gc.collect()
        after_i = created.alive_bytes(outside)
    assert groups and after_i >= after_f
