"""Fast, in-process checks of the reference runner's model code: the tensor-parallel block
split (heads, kv heads, FFN rows and columns) gives the full block's output and gradients, and
the hand-written Adam is torch's Adam. Two threads stand in for two tp ranks; a barrier-based
sum stands in for the all-reduce."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from planner.launch import tiny_model as tm

SHAPES = [
    tm.Shape(num_layers=1, hidden_size=32, num_heads=4, num_kv_heads=4, ffn_size=64,
             vocab_size=16, seq_len=5, mlp="gelu"),
    tm.Shape(num_layers=1, hidden_size=32, num_heads=4, num_kv_heads=2, ffn_size=48,
             vocab_size=16, seq_len=5, mlp="swiglu"),
]


class _ThreadSum:
    """All-reduce (sum) between ``n`` threads."""

    def __init__(self, n: int):
        self.n, self.barrier, self.slots = n, threading.Barrier(n), [None] * n

    def __call__(self, t, rank: int):
        self.slots[rank] = t.detach().clone()
        self.barrier.wait()
        total = sum(self.slots[1:], self.slots[0].clone())
        self.barrier.wait()
        return total


def _thread_tp(allreduce, rank: int, tp: int) -> tm.TPContext:
    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return allreduce(g, rank)

    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return allreduce(x, rank)

        @staticmethod
        def backward(ctx, g):
            return g

    ctx = tm.TPContext(tp=tp)
    ctx.copy_in = Copy.apply
    ctx.reduce_out = Reduce.apply
    return ctx


@pytest.mark.parametrize("shape", SHAPES, ids=["gelu-mha", "swiglu-gqa"])
def test_tp2_block_equals_full_block(shape):
    dtype, tp = torch.float64, 2
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(3, shape.seq_len, shape.hidden_size, generator=gen, dtype=dtype)
    w = torch.randn(3, shape.seq_len, shape.hidden_size, generator=gen, dtype=dtype)

    full = tm.build_params(shape, (0, 1), False, False, seed=3, dtype=dtype)
    x = x0.clone().requires_grad_(True)
    out_full = tm.block(full, 0, x, shape, tm.TPContext())
    (out_full * w).sum().backward()

    layout = tm.param_layout(shape, (0, 1), False, False)
    allreduce = _ThreadSum(tp)
    results: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def rank_main(r: int):
        try:
            p = tm.build_params(shape, (0, 1), False, False, seed=3, dtype=dtype, tp=tp, tp_rank=r)
            xr = x0.clone().requires_grad_(True)
            out = tm.block(p, 0, xr, shape, _thread_tp(allreduce, r, tp))
            (out * w).sum().backward()
            results[r] = (out.detach(), xr.grad, {k: v.grad for k, v in p.items()})
        except BaseException as exc:  # noqa: BLE001 - surface in the main thread
            errors.append(exc)
            allreduce.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    for r in range(tp):
        out, xgrad, grads = results[r]
        torch.testing.assert_close(out, out_full.detach(), rtol=0, atol=1e-12)
        torch.testing.assert_close(xgrad, x.grad, rtol=0, atol=1e-12)
        for name, (_, dim) in layout.items():
            want = tm.shard(full[name].grad, dim, tp, r)
            torch.testing.assert_close(grads[name], want, rtol=0, atol=1e-12, msg=name)


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_optimizer_is_torchs(kind):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(5, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    b = a.detach().clone().requires_grad_(True)
    ours = tm.make_optimizer([a], kind, lr=1e-2)
    if kind == "adam":
        theirs = torch.optim.Adam([b], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    else:
        theirs = torch.optim.SGD([b], lr=1e-2)
    for _ in range(4):
        g = torch.randn(5, 4, generator=gen, dtype=torch.float64)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
    torch.testing.assert_close(a, b, rtol=0, atol=1e-14)


def test_tied_reference_has_one_vocabulary_matrix():
    shape = tm.Shape(num_layers=2, hidden_size=16, num_heads=2, num_kv_heads=2, ffn_size=32,
                     vocab_size=16, seq_len=4, tied_embeddings=True)
    losses, params = tm.reference_run(shape, global_batch=2, steps=2)
    assert "head.out.weight" not in params and "embed.weight" in params
    assert losses[1] != losses[0]
    # The last stage alone still holds the matrix, under the embedding's name.
    assert "embed.weight" in tm.param_layout(shape, (1, 2), embedding=False, head=True)
