"""I then W on one stage chunk equals B: the input gradient after I, every weight gradient
after W, bit for bit in float64, for a middle chunk, the head chunk, the embedding chunk and a
pass-through; I runs none of the weight-gradient matmuls and W none of the input ones."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode

from planner.launch import tiny_model as tm
from planner.launch.backward_split import SplitBackward, weight_edges

GELU = tm.Shape(num_layers=2, hidden_size=16, num_heads=4, num_kv_heads=4, ffn_size=32,
                vocab_size=32, seq_len=6)
SWIGLU_GQA = tm.Shape(num_layers=2, hidden_size=16, num_heads=4, num_kv_heads=2, ffn_size=24,
                      vocab_size=32, seq_len=6, mlp="swiglu")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def chunk(shape, blocks, embedding, head):
    """One forward of a chunk: (params, x_in or None, output, output gradient or None)."""
    p = tm.build_params(shape, blocks, embedding, head, 0, torch.float64)
    tokens = torch.randint(0, shape.vocab_size, (2, shape.seq_len + 1), generator=_gen(1))
    x_in = None
    if embedding:
        x = tm.embed(p, tokens[:, :-1])
    else:
        x_in = torch.randn(2, shape.seq_len, shape.hidden_size, dtype=torch.float64,
                           generator=_gen(2)).requires_grad_(True)
        x = x_in
    for i in range(*blocks):
        x = tm.block(p, i, x, shape, tm.TPContext())
    if head:
        return p, x_in, tm.head_loss_sum(p, x, tokens[:, 1:], shape), None
    return p, x_in, x, torch.randn(x.shape, dtype=torch.float64, generator=_gen(3))


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.bmm):
            self.n += 1
        return func(*args, **(kwargs or {}))


def split_grads(shape, blocks, embedding, head):
    p, x_in, out, g = chunk(shape, blocks, embedding, head)
    split = SplitBackward(out, x_in, g)
    with CountMatmuls() as count_i:
        gx = split.input_grad()
    assert all(t.grad is None for t in p.values())  # I leaves the weights alone
    with CountMatmuls() as count_w:
        gw = split.weight_grads(list(p.values()))
    return gx, dict(zip(p, gw)), count_i.n, count_w.n


def full_grads(shape, blocks, embedding, head):
    p, x_in, out, g = chunk(shape, blocks, embedding, head)
    with CountMatmuls() as count:
        torch.autograd.backward(out, g)
    return (None if x_in is None else x_in.grad), {k: t.grad for k, t in p.items()}, count.n


@pytest.mark.parametrize("shape", [GELU, SWIGLU_GQA], ids=["gelu", "swiglu-gqa"])
@pytest.mark.parametrize("embedding, head", [(False, False), (False, True), (True, False)],
                         ids=["middle", "head", "embedding"])
def test_input_then_weight_equals_full_backward(shape, embedding, head):
    blocks = (0, 2)
    gx, gw, n_i, n_w = split_grads(shape, blocks, embedding, head)
    want_x, want_w, n_b = full_grads(shape, blocks, embedding, head)
    if embedding:
        assert gx is None
    else:
        assert torch.equal(gx, want_x)
    assert sorted(gw) == sorted(want_w)
    for name, want in want_w.items():
        assert gw[name] is not None and torch.equal(gw[name], want), name
    # Nothing computed twice: the matmuls of I and W are those of B.
    assert n_i + n_w == n_b
    if not embedding:
        # W runs exactly one matmul per weight matrix used as a matmul operand (q, k, v, o,
        # up, down and swiglu's gate per block; the head's projection), I none of them.
        per_block = 7 if shape.mlp == "swiglu" else 6
        assert n_w == per_block * 2 + (1 if head else 0)


def test_pass_through_chunk_hands_the_gradient_back():
    x_in = torch.randn(2, 3, dtype=torch.float64).requires_grad_(True)
    g = torch.randn(2, 3, dtype=torch.float64)
    split = SplitBackward(x_in, x_in, g)
    assert torch.equal(split.input_grad(), g)
    assert split.weight_grads([]) == []


def test_a_weight_shared_by_two_branches_falls_back_to_the_whole_backward_in_i():
    w = torch.randn(3, 3, dtype=torch.float64, generator=_gen(4)).requires_grad_(True)
    x = torch.randn(2, 3, dtype=torch.float64, generator=_gen(5)).requires_grad_(True)
    g = torch.randn(2, 3, dtype=torch.float64, generator=_gen(6))

    def forward():
        return (x @ w + (x * 2) @ w).tanh() @ w

    out = forward()
    assert weight_edges(out.grad_fn, torch.autograd.graph.get_gradient_edge(x).node) is None
    split = SplitBackward(out, x, g)
    gx = split.input_grad()
    (gw,) = split.weight_grads([w])
    want_x, want_w = torch.autograd.grad(forward(), [x, w], g)
    assert torch.equal(gx, want_x) and torch.equal(gw, want_w)
