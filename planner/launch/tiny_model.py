"""The decoder-only transformer the reference runner trains, written as plain functions over a
dict of named parameters so that the same code serves the single-process reference and every
sharded piece of a plan.

Imports torch at module level: only the runner's worker processes and tests import this module
(``planner.*`` stays torch-free at import time).

Shape (pre-norm GPT): ``embedding`` = token embedding + learned positions; ``block_i`` =
``x + o(attn(q, k, v of ln1(x)))`` then ``x + down(act(up(ln2(x))))`` (gelu, or swiglu with a
gate); ``head`` = final layer norm + output projection + token cross-entropy. Linear layers have
no bias (as in Llama), so a row-parallel layer needs nothing but the all-reduce. With
``tied_embeddings`` the output projection is the embedding matrix (``embed.weight``).

Tensor parallelism follows the Megatron pattern: q/k/v and up/gate are column-parallel (split by
heads / ffn rows), o and down are row-parallel (split by columns) with one all-reduce after each;
norms, embeddings and the head are replicated on every tp rank of a replica.

Context parallelism (``CPContext``) splits each sequence over ``cp`` groups of a replica's tp
ranks, load-balanced for causal attention as Megatron-Core and torchtitan do: the sequence is
cut into ``2 cp`` chunks and cp rank ``c`` holds chunks ``c`` and ``2 cp - 1 - c``. Everything
but attention is per token; attention takes the local queries against every rank's K/V chunk,
block by block with an online softmax (Liu et al. 2023, ring attention).

Attention is computed unfused (scores, mask, softmax, context as separate ops) whatever the plan's
``training.attention``: the maths of a flash plan is the same, its kernel is not, so a run's times
are the unfused core's (``planner run --measurements`` says so for a flash plan, and
``planner profile --from-run`` labels its profiles ``attention: unfused``).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

INIT_STD = 0.02  # GPT-2's initialiser scale; the value only has to be the same everywhere


@dataclass(frozen=True)
class Shape:
    """Sizes of the model the runner builds (after any shrinking)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_size: int
    vocab_size: int
    seq_len: int
    mlp: str = "gelu"  # gelu | swiglu
    tied_embeddings: bool = False  # the head's projection is the embedding matrix

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


# -- parameter layout --------------------------------------------------------------------------
# Which dimension a parameter is split along under TP: 0 = column-parallel (output rows),
# 1 = row-parallel (input columns), None = replicated on every tp rank.

def block_param_shapes(shape: Shape, i: int) -> dict[str, tuple[tuple[int, ...], int | None]]:
    h, d = shape.hidden_size, shape.head_dim
    out = {
        f"blocks.{i}.ln1.weight": ((h,), None), f"blocks.{i}.ln1.bias": ((h,), None),
        f"blocks.{i}.attn.q.weight": ((shape.num_heads * d, h), 0),
        f"blocks.{i}.attn.k.weight": ((shape.num_kv_heads * d, h), 0),
        f"blocks.{i}.attn.v.weight": ((shape.num_kv_heads * d, h), 0),
        f"blocks.{i}.attn.o.weight": ((h, shape.num_heads * d), 1),
        f"blocks.{i}.ln2.weight": ((h,), None), f"blocks.{i}.ln2.bias": ((h,), None),
    }
    if shape.mlp == "swiglu":
        out[f"blocks.{i}.mlp.gate.weight"] = ((shape.ffn_size, h), 0)
    out[f"blocks.{i}.mlp.up.weight"] = ((shape.ffn_size, h), 0)
    out[f"blocks.{i}.mlp.down.weight"] = ((h, shape.ffn_size), 1)
    return out


def param_layout(shape: Shape, blocks: tuple[int, int], embedding: bool,
                 head: bool) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """Full shapes and split dimension of the parameters of one stage, in a fixed order."""
    h = shape.hidden_size
    out: dict[str, tuple[tuple[int, ...], int | None]] = {}
    if embedding:
        out["embed.weight"] = ((shape.vocab_size, h), None)
        out["pos.weight"] = ((shape.seq_len, h), None)
    for i in range(*blocks):
        out.update(block_param_shapes(shape, i))
    if head:
        out["head.norm.weight"] = ((h,), None)
        out["head.norm.bias"] = ((h,), None)
        # Tied: a head on another stage keeps its own copy of the embedding under the same
        # name, and the runner sums the two copies' gradients every step (Megatron does the
        # same with its "embedding group").
        out["embed.weight" if shape.tied_embeddings else "head.out.weight"] = ((shape.vocab_size, h), None)
    return out


def init_full(name: str, full_shape: tuple[int, ...], seed: int, dtype) -> torch.Tensor:
    """The full (unsharded) initial value of one parameter.

    Seeded per name, not by creation order, so every rank and the reference get the same
    numbers whichever subset of the model they build.
    """
    if name.endswith(("ln1.weight", "ln2.weight", "norm.weight")):
        return torch.ones(full_shape, dtype=dtype)
    if name.endswith(("ln1.bias", "ln2.bias", "norm.bias")):
        return torch.zeros(full_shape, dtype=dtype)
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    # Drawn in float64 and cast so float32 and float64 runs start from the same point.
    return (torch.randn(full_shape, generator=gen, dtype=torch.float64) * INIT_STD).to(dtype)


def shard(full: torch.Tensor, dim: int | None, tp: int, tp_rank: int) -> torch.Tensor:
    if dim is None or tp == 1:
        return full.clone()
    return full.chunk(tp, dim=dim)[tp_rank].clone()


def build_params(shape: Shape, blocks: tuple[int, int], embedding: bool, head: bool,
                 seed: int, dtype, tp: int = 1, tp_rank: int = 0) -> dict[str, torch.Tensor]:
    """This rank's parameters: the full model's values, cut to the shard the rank owns."""
    out = {}
    for name, (full_shape, dim) in param_layout(shape, blocks, embedding, head).items():
        t = shard(init_full(name, full_shape, seed, dtype), dim, tp, tp_rank)
        out[name] = t.requires_grad_(True)
    return out


# -- tensor-parallel autograd pieces (Megatron's "f" and "g") -----------------------------------

class _CopyToTP(torch.autograd.Function):
    """Identity forward; the backward sums the input gradient over the tp group, because each
    tp rank only saw the part of the gradient that flows through its shard."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Sum of the partial outputs of a row-parallel layer; the gradient is already whole."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


@dataclass
class TPContext:
    """A replica's tensor-parallel group as the block code sees it."""

    tp: int = 1
    group: object | None = None

    def copy_in(self, x):
        return x if self.tp == 1 else _CopyToTP.apply(x, self.group)

    def reduce_out(self, x):
        return x if self.tp == 1 else _ReduceFromTP.apply(x, self.group)


# -- forward pieces ----------------------------------------------------------------------------

# -- context parallelism -------------------------------------------------------------------------

def cp_positions(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """The token positions cp rank ``cp_rank`` holds: chunks ``c`` and ``2 cp - 1 - c`` of the
    ``2 cp`` equal chunks, so that every rank has as much causal attention work."""
    if cp == 1:
        return torch.arange(seq_len)
    n = seq_len // (2 * cp)
    c = cp_rank
    return torch.cat([torch.arange(c * n, (c + 1) * n), torch.arange((2 * cp - 1 - c) * n, (2 * cp - c) * n)])


class _GatherKV(torch.autograd.Function):
    """Every cp rank's K (or V) chunk, stacked ``[cp, ...]``; the backward sums each chunk's
    gradient over the ranks that used it and hands the owner its own. An all-gather, not a
    ring: the blockwise attention below visits the chunks one after another as a ring would
    (a ring in time, not in its sends), and all_reduce backs the gradient on every backend."""

    @staticmethod
    def forward(ctx, x, group, cp_rank):
        ctx.group, ctx.cp_rank = group, cp_rank
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.cp_rank], None, None


@dataclass
class CPContext:
    """A replica's context-parallel group as the block code sees it: ``cp`` ranks (this one
    ``rank``) holding the positions of ``cp_positions``; ``group`` gathers K/V over them."""

    cp: int = 1
    rank: int = 0
    group: object | None = None
    seq_len: int = 0

    def positions(self, rank: int | None = None) -> torch.Tensor:
        return cp_positions(self.seq_len, self.cp, self.rank if rank is None else rank)


def _cp_attention(q, k, v, cpc: CPContext, heads: int, kv_heads: int, d: int) -> torch.Tensor:
    """Causal attention of the local queries against every cp rank's K/V chunk, one chunk at a
    time with an online softmax: running max (a stabiliser only, so kept out of autograd), sum
    of exponentials and weighted values, rescaled as each chunk arrives."""
    ks, vs = _GatherKV.apply(k, cpc.group, cpc.rank), _GatherKV.apply(v, cpc.group, cpc.rank)
    q_pos = cpc.positions().to(q.device)
    b, _, s_loc, _ = q.shape
    top = torch.full((b, heads, s_loc, 1), float("-inf"), dtype=q.dtype, device=q.device)
    denom = torch.zeros_like(top)
    acc = torch.zeros_like(q)
    for j in range(cpc.cp):
        kj, vj = ks[j], vs[j]
        if kv_heads != heads:
            kj = kj.repeat_interleave(heads // kv_heads, dim=1)
            vj = vj.repeat_interleave(heads // kv_heads, dim=1)
        scores = (q @ kj.transpose(-1, -2)) / math.sqrt(d)
        future = q_pos[:, None] < cpc.positions(j).to(q.device)[None, :]
        scores = scores.masked_fill(future, float("-inf"))
        with torch.no_grad():
            new_top = torch.maximum(top, scores.amax(dim=-1, keepdim=True))
            safe = torch.where(torch.isinf(new_top), torch.zeros_like(new_top), new_top)
            keep = torch.exp(top - safe)   # 0 where nothing was seen yet
        e = torch.exp(scores - safe)
        denom = denom * keep + e.sum(dim=-1, keepdim=True)
        acc = acc * keep + e @ vj
        top = new_top
    return acc / denom


def embed(p: dict, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Token plus learned position embeddings; ``positions``: the places in the sequence this
    rank holds (context parallelism: ``tokens`` whole, only those kept), default all."""
    if positions is None:
        return F.embedding(tokens, p["embed.weight"]) + p["pos.weight"][:tokens.shape[1]].unsqueeze(0)
    return F.embedding(tokens[:, positions], p["embed.weight"]) + p["pos.weight"][positions].unsqueeze(0)


def block(p: dict, i: int, x: torch.Tensor, shape: Shape, tpc: TPContext,
          cpc: CPContext | None = None) -> torch.Tensor:
    pre = f"blocks.{i}."
    h, d = shape.hidden_size, shape.head_dim
    b, s, _ = x.shape
    heads, kv_heads = shape.num_heads // tpc.tp, shape.num_kv_heads // tpc.tp

    a = tpc.copy_in(F.layer_norm(x, (h,), p[pre + "ln1.weight"], p[pre + "ln1.bias"]))
    q = (a @ p[pre + "attn.q.weight"].T).view(b, s, heads, d).transpose(1, 2)
    k = (a @ p[pre + "attn.k.weight"].T).view(b, s, kv_heads, d).transpose(1, 2)
    v = (a @ p[pre + "attn.v.weight"].T).view(b, s, kv_heads, d).transpose(1, 2)
    if cpc is not None and cpc.cp > 1:   # K/V of the kv heads only travel (GQA)
        ctx = _cp_attention(q, k, v, cpc, heads, kv_heads, d).transpose(1, 2).reshape(b, s, heads * d)
        x = x + tpc.reduce_out(ctx @ p[pre + "attn.o.weight"].T)
        return _mlp(p, pre, x, shape, tpc)
    if kv_heads != heads:  # GQA: each kv head serves heads // kv_heads query heads
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
    causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
    scores = scores.masked_fill(causal, float("-inf"))
    ctx = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, s, heads * d)
    x = x + tpc.reduce_out(ctx @ p[pre + "attn.o.weight"].T)
    return _mlp(p, pre, x, shape, tpc)


def _mlp(p: dict, pre: str, x: torch.Tensor, shape: Shape, tpc: TPContext) -> torch.Tensor:
    h = shape.hidden_size
    m = tpc.copy_in(F.layer_norm(x, (h,), p[pre + "ln2.weight"], p[pre + "ln2.bias"]))
    up = m @ p[pre + "mlp.up.weight"].T
    if shape.mlp == "swiglu":
        act = F.silu(m @ p[pre + "mlp.gate.weight"].T) * up
    else:
        act = F.gelu(up)
    return x + tpc.reduce_out(act @ p[pre + "mlp.down.weight"].T)


def head_loss_sum(p: dict, x: torch.Tensor, labels: torch.Tensor, shape: Shape) -> torch.Tensor:
    """Summed token cross-entropy; callers divide by the global token count so that summing the
    pieces over micro-batches and replicas gives the full-batch mean."""
    y = F.layer_norm(x, (shape.hidden_size,), p["head.norm.weight"], p["head.norm.bias"])
    logits = y @ p["embed.weight" if shape.tied_embeddings else "head.out.weight"].T
    return F.cross_entropy(logits.reshape(-1, shape.vocab_size), labels.reshape(-1), reduction="sum")


# -- data and optimiser shared with the workers ------------------------------------------------

def batch_tokens(seed: int, step: int, global_batch: int, shape: Shape) -> torch.Tensor:
    """The global batch of one step, ``[global_batch, seq_len + 1]``: every process draws the
    same tokens and keeps the rows it needs (inputs are ``[:, :-1]``, labels ``[:, 1:]``)."""
    gen = torch.Generator().manual_seed(seed * 7919 + step + 1)
    return torch.randint(0, shape.vocab_size, (global_batch, shape.seq_len + 1), generator=gen)


class Optimizer:
    """Plain SGD or Adam (Kingma & Ba, with bias correction; no weight decay), written out
    rather than taken from torch.optim: constructing a torch.optim optimiser imports
    torch._dynamo, which costs seconds in every worker process. The update is element-wise,
    so a shard updated on its own ends exactly where the slice of the full update would."""

    def __init__(self, params: list[torch.Tensor], kind: str, lr: float,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8):
        self.params, self.kind, self.lr, self.betas, self.eps = params, kind, lr, betas, eps
        self.t = 0
        self.m = [torch.zeros_like(p) for p in params] if kind == "adam" else []
        self.v = [torch.zeros_like(p) for p in params] if kind == "adam" else []

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        b1, b2 = self.betas
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad
            if self.kind == "sgd":
                p.sub_(self.lr * g)
                continue
            self.m[i].mul_(b1).add_(g, alpha=1 - b1)
            self.v[i].mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (self.v[i] / (1 - b2 ** self.t)).sqrt_().add_(self.eps)
            p.addcdiv_(self.m[i], denom, value=-self.lr / (1 - b1 ** self.t))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def make_optimizer(params: list[torch.Tensor], kind: str, lr: float) -> Optimizer:
    # The same hyper-parameters on every rank and in the reference.
    return Optimizer(params, kind, lr)


def torch_dtype(name: str):
    return {"float32": torch.float32, "float64": torch.float64}[name]


def reference_run(shape: Shape, global_batch: int, steps: int, seed: int = 0,
                  dtype: str = "float64", optimizer: str = "adam", lr: float = 1e-3):
    """Train the whole model in this process, one full batch per step.

    Returns ``(losses, params)`` with params as ``{name: numpy array}``: the ground truth the
    distributed runner must reproduce.
    """
    p = build_params(shape, (0, shape.num_layers), True, True, seed, torch_dtype(dtype))
    opt = make_optimizer(list(p.values()), optimizer, lr)
    tpc = TPContext()
    losses = []
    for step in range(steps):
        tokens = batch_tokens(seed, step, global_batch, shape)
        x = embed(p, tokens[:, :-1])
        for i in range(shape.num_layers):
            x = block(p, i, x, shape, tpc)
        loss = head_loss_sum(p, x, tokens[:, 1:], shape) / (global_batch * shape.seq_len)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().numpy().copy() for k, v in p.items()}
