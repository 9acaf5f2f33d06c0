"""Measuring per-layer times and memory with PyTorch: the only planner module that imports torch.

For each tensor-parallel degree, layer kind and micro-batch size we build the layer as one TP
rank holds it (heads/tp, kv_heads/tp, ffn/tp, vocab/tp; no communication: the cost model adds
TP collectives itself), run ``warmup`` untimed forward+backward passes, then ``repeats`` timed
ones, and keep the median of each direction.  Block and head backwards are also timed as their
two zero-bubble parts, input gradient (I) and weight gradient (W), the way torch's pipeline
runtime splits them (split.py).

Timing: CUDA events around forward and backward on GPU.  On CPU ops are synchronous; with one
torch thread (the default, as the reference runner uses) we read the measuring thread's CPU
time (``time.thread_time``), which equals the op time on an idle core and is not inflated when
other processes share the machine; with several threads, ``time.perf_counter`` (wall clock).
Memory: on GPU ``torch.cuda.max_memory_allocated`` over one forward+backward after resetting the
peak (it includes the layer's weights, gradients, input and workspace).  On CPU torch keeps no
peak counter, so we estimate: the bytes of every distinct tensor storage that is alive around
the step (weights, their gradients, input, output, their gradients) plus those autograd saved for
backward (seen through ``saved_tensors_hooks``).  Transient workspace inside kernels is not
counted, so the CPU figure is a lower bound.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from planner.errors import InputError
from planner.launch.measurements import cpu_model_name
from planner.profile import split
from planner.profile.schema import LAYER_KINDS, SCHEMA_ID, ProfileEntry, ProfileFile
from planner.spec.model import ModelSpec

# tf32 keeps fp32 tensors; its matmuls run on TF32 tensor cores (allow_tf32, set per entry).
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}


# ---------------------------------------------------------------------------- layers (one rank)
@dataclass(frozen=True)
class RankShape:
    """The per-rank sizes of a model's layers under tensor parallelism of degree ``tp``."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    mlp: str

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> RankShape:
        # Megatron-style split: attention heads and the FFN's inner dimension are divided; when
        # there are fewer KV heads than ranks each rank keeps one (replicated) KV head.
        return cls(hidden=model.hidden_size, heads=model.num_attention_heads // tp,
                   kv_heads=max(1, model.kv_heads // tp), head_dim=model.head_dim,
                   ffn=model.ffn_size // tp, vocab=math.ceil(model.vocab_size / tp), mlp=model.mlp)


def check_tp(model: ModelSpec, tp: int) -> str | None:
    """Why ``tp`` cannot split this model, or None."""
    if model.num_attention_heads % tp:
        return f"tp={tp} does not divide num_attention_heads={model.num_attention_heads}"
    if model.ffn_size % tp:
        return f"tp={tp} does not divide ffn_hidden_size={model.ffn_size}"
    if model.kv_heads >= tp and model.kv_heads % tp:
        return f"tp={tp} does not divide num_kv_heads={model.kv_heads}"
    return None


def _norm(shape: RankShape) -> nn.Module:
    # GPT-style (gelu) models use LayerNorm, Llama-style (swiglu) ones RMSNorm.
    return nn.RMSNorm(shape.hidden) if shape.mlp == "swiglu" else nn.LayerNorm(shape.hidden)


class Block(nn.Module):
    """Pre-norm decoder block: causal GQA attention and a gelu or swiglu MLP, one TP rank."""

    def __init__(self, s: RankShape):
        super().__init__()
        bias = s.mlp == "gelu"
        self.s = s
        self.norm1, self.norm2 = _norm(s), _norm(s)
        self.qkv = nn.Linear(s.hidden, (s.heads + 2 * s.kv_heads) * s.head_dim, bias=bias)
        self.proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=bias)
        inner = 2 * s.ffn if s.mlp == "swiglu" else s.ffn
        self.fc1 = nn.Linear(s.hidden, inner, bias=bias)
        self.fc2 = nn.Linear(s.ffn, s.hidden, bias=bias)

    def forward(self, x):
        s = self.s
        b, n, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1)
        q = q.view(b, n, s.heads, s.head_dim).transpose(1, 2)
        k = k.view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        v = v.view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                             enable_gqa=s.kv_heads != s.heads)
        x = x + self.proj(att.transpose(1, 2).reshape(b, n, s.heads * s.head_dim))
        h = self.fc1(self.norm2(x))
        if s.mlp == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h)
        return x + self.fc2(h)


class Head(nn.Module):
    """Final norm, output projection (vocab/tp columns) and the cross-entropy loss."""

    def __init__(self, s: RankShape):
        super().__init__()
        self.norm = _norm(s)
        self.out = nn.Linear(s.hidden, s.vocab, bias=False)

    def forward(self, x, targets):
        logits = self.out(self.norm(x))
        # Loss in fp32 as mixed-precision trainers compute it.
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


# ---------------------------------------------------------------------------- one measurement
@dataclass
class _Case:
    module: nn.Module
    forward: Callable[[], torch.Tensor]
    backward: Callable[[torch.Tensor], None]
    live: Callable[[], list[torch.Tensor]]  # tensors alive around a step (for the CPU estimate)
    leaf: torch.Tensor | None = None  # the input whose gradient the backward computes
    output_grad: torch.Tensor | None = None  # the gradient fed to the output (None: a loss)


def _make_case(kind: str, s: RankShape, mb: int, seq_len: int, dtype, device) -> _Case:
    g = torch.Generator(device=device).manual_seed(0)
    # Build the weights on the device itself: initialising a large layer on the CPU first
    # would take longer than measuring it.
    with torch.device(device):
        module = {"embedding": lambda: nn.Embedding(s.vocab, s.hidden), "block": lambda: Block(s),
                  "head": lambda: Head(s)}[kind]().to(dtype=dtype)
    if kind == "embedding":
        ids = torch.randint(0, s.vocab, (mb, seq_len), generator=g, device=device)
        grad = torch.randn(mb, seq_len, s.hidden, generator=g, device=device, dtype=dtype)
        return _Case(module, lambda: module(ids), lambda out: out.backward(grad), lambda: [ids, grad])
    x = torch.randn(mb, seq_len, s.hidden, generator=g, device=device, dtype=dtype)
    x.requires_grad_(True)
    if kind == "block":
        grad = torch.randn(mb, seq_len, s.hidden, generator=g, device=device, dtype=dtype)
        return _Case(module, lambda: module(x), lambda out: out.backward(grad),
                     lambda: [x, grad] + ([x.grad] if x.grad is not None else []), x, grad)
    targets = torch.randint(0, s.vocab, (mb, seq_len), generator=g, device=device)
    return _Case(module, lambda: module(x, targets), lambda out: out.backward(),
                 lambda: [x, targets] + ([x.grad] if x.grad is not None else []), x)


def _zero(case: _Case) -> None:
    # Fresh gradients every pass: accumulating into old ones would add work a step does not do.
    for p in case.module.parameters():
        p.grad = None
    if case.leaf is not None:
        case.leaf.grad = None


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def _cpu_memory(case: _Case) -> tuple[int, int]:
    """(peak estimate, bytes saved for backward) from distinct storages; see module docstring."""
    saved: dict[int, int] = {}

    def pack(t):
        ptr, size = _storage_key(t)
        saved[ptr] = size
        return t

    _zero(case)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = case.forward()
    params = [p for p in case.module.parameters()]
    static = {_storage_key(p)[0] for p in params}
    activation = sum(size for ptr, size in saved.items() if ptr not in static)
    case.backward(out)
    live = dict(saved)
    for t in [*params, *(p.grad for p in params if p.grad is not None), out, *case.live()]:
        ptr, size = _storage_key(t)
        live[ptr] = size
    return sum(live.values()), activation


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cpu_clock():
    """With one torch thread every op runs on this thread, so its CPU time is the op time and,
    unlike the wall clock, does not grow while other processes hold the core; with more threads
    the wall clock is the only honest total."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def _time(case: _Case, device, warmup: int, repeats: int, clock=None,
          statistic=statistics.median) -> tuple[float, float]:
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        _zero(case)
        if device.type == "cuda":
            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            start.record()
            out = case.forward()
            mid.record()
            case.backward(out)
            end.record()
            torch.cuda.synchronize(device)
            f_s, b_s = start.elapsed_time(mid) / 1e3, mid.elapsed_time(end) / 1e3
        else:
            clock = clock or _cpu_clock()
            t0 = clock()
            out = case.forward()
            t1 = clock()
            case.backward(out)
            t2 = clock()
            f_s, b_s = t1 - t0, t2 - t1
        del out
        if i >= warmup:
            fwd.append(f_s)
            bwd.append(b_s)
    return statistic(fwd), statistic(bwd)


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    # The CPU allocator raises a plain RuntimeError.
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


def measure_entry(model: ModelSpec, kind: str, mb: int, tp: int, seq_len: int, dtype: str,
                  device, warmup: int, repeats: int, clock=None,
                  statistic=statistics.median) -> ProfileEntry:
    s = RankShape.of(model, tp)
    case = None
    # fp32 matmuls on CUDA cores (PyTorch's default since 1.12), tf32 on TF32 tensor cores.
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        case = _make_case(kind, s, mb, seq_len, DTYPES[dtype], device)
        if device.type == "cuda":
            _zero(case)
            _sync(device)
            torch.cuda.reset_peak_memory_stats(device)
            case.backward(case.forward())
            _sync(device)
            peak = int(torch.cuda.max_memory_allocated(device))
            _, activation = _cpu_memory(case)
        else:
            peak, activation = _cpu_memory(case)
        f_s, b_s = _time(case, device, warmup, repeats, clock, statistic)
        i_s = w_s = None
        if split.can_split(case):
            i_s, w_s = split.time_split(case, device, warmup, repeats, clock or _cpu_clock(), _zero,
                                        statistic)
    except Exception as exc:
        if not _is_oom(exc):
            raise
        oom = True
    else:
        oom = False
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    # Free outside the except block: its traceback would keep the failed step's tensors alive.
    del case
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if oom:
        return ProfileEntry(layer=kind, micro_batch=mb, tp=tp, fits=False)
    return ProfileEntry(layer=kind, micro_batch=mb, tp=tp, forward_s=f_s, backward_s=b_s,
                        peak_memory_bytes=peak, activation_bytes=activation,
                        backward_input_s=i_s, backward_weight_s=w_s)


# ---------------------------------------------------------------------------- a whole profile
def _load_average() -> float | None:
    # Other processes on the machine slow CPU measurements; the file records how busy it was.
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def resolve_device(name: str):
    if name == "cuda":
        if not torch.cuda.is_available():
            raise InputError("--device cuda: torch sees no CUDA device here (torch "
                             f"{torch.__version__}); use --device cpu or run on a GPU machine")
        return torch.device("cuda", torch.cuda.current_device())
    if name == "cpu":
        return torch.device("cpu")
    raise InputError(f"--device {name!r}: valid devices are cpu, cuda")


def measure_entries(model: ModelSpec, device, micro_batches: list[int], tps: list[int],
                    seq_len: int, dtype: str, warmup: int, repeats: int, clock=None,
                    statistic=statistics.median, sync: Callable[[], None] | None = None,
                    progress: Callable[[ProfileEntry], None] | None = None) -> list[ProfileEntry]:
    """Every (tp, layer kind, micro-batch) in a fixed order; ``sync`` runs before each entry
    (co-tenant processes line up there)."""
    entries = []
    for tp in sorted(tps):
        for kind in LAYER_KINDS:
            oom = False
            for mb in sorted(micro_batches):
                if sync:
                    sync()
                # Memory grows with the micro-batch: once one does not fit, larger ones cannot.
                entry = (ProfileEntry(layer=kind, micro_batch=mb, tp=tp, fits=False) if oom else
                         measure_entry(model, kind, mb, tp, seq_len, dtype, device, warmup,
                                       repeats, clock, statistic))
                oom = oom or not entry.fits
                entries.append(entry)
                if progress:
                    progress(entry)
    return entries


def measure_profile(model: ModelSpec, device_name: str, micro_batches: list[int], tps: list[int],
                    seq_len: int, dtype: str, warmup: int = 2, repeats: int = 5,
                    gpu_type: str | None = None, threads: int | None = 1,
                    provenance: str | None = None,
                    progress: Callable[[ProfileEntry], None] | None = None,
                    concurrent: int = 1) -> ProfileFile:
    """Measure every (tp, layer kind, micro-batch) and return the profile (not yet written).
    ``concurrent`` > 1 (CPU): measure as one of that many processes running the same layers at
    once (planner/profile/cotenants.py)."""
    if model.is_moe or model.attention_head_dim is not None:
        # the measured block is dense with head_dim = hidden / heads (Block above): its times
        # would price another layer than this model's
        raise InputError(f"planner profile measures dense blocks with head_dim = hidden / heads; "
                         f"{model.name} has " + ("experts" if model.is_moe else "a head_dim of its own")
                         + ": its layers are priced by the roofline")
    for tp in tps:
        why = check_tp(model, tp)
        if why:
            raise InputError(f"--tp: {why}")
    device = resolve_device(device_name)
    if device.type == "cpu" and threads:
        # The reference runner gives each process one thread; profile under the same condition.
        torch.set_num_threads(threads)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model_name()
    if gpu_type is None and device.type == "cuda":
        from planner.profile.files import gpu_type_for_device
        gpu_type = gpu_type_for_device(name)
        if gpu_type is None:
            raise InputError(f"device {name!r} matches no catalog GPU type; pass --gpu-type with "
                             "a catalog id or the name of an inline GPU of your cluster")
    load_before = _load_average()
    if concurrent > 1:
        if device.type != "cpu":
            raise InputError("--concurrent: only for --device cpu (GPU ranks do not share a device)")
        from planner.profile.cotenants import measure_with_cotenants
        entries = measure_with_cotenants(model, micro_batches, tps, seq_len, dtype, warmup, repeats,
                                         threads or 1, concurrent, progress)
    else:
        entries = measure_entries(model, device, micro_batches, tps, seq_len, dtype, warmup,
                                  repeats, progress=progress)
    return ProfileFile(
        schema=SCHEMA_ID,
        device={"kind": device.type, "name": name, "gpu_type": gpu_type or "cpu",
                "threads": torch.get_num_threads() if device.type == "cpu" else None},
        torch_version=torch.__version__, dtype=dtype, attention="fused",  # Block.forward: SDPA
        created=dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        seq_len=seq_len, model=model.to_mapping(),
        settings={"warmup": warmup, "repeats": repeats,
                  "statistic": "mean" if concurrent > 1 else "median",
                  "timer": ("cuda-events" if device.type == "cuda" else
                            "wall-clock" if concurrent > 1 else
                            "thread-cpu-time" if _cpu_clock() is time.thread_time else "wall-clock"),
                  "concurrent": concurrent if concurrent > 1 else None,
                  "memory": ("torch.cuda.max_memory_allocated" if device.type == "cuda" else
                             "estimate: distinct live and saved-for-backward tensor storages"),
                  "load_average": (load_before, _load_average()) if load_before is not None else None},
        provenance=provenance, entries=tuple(entries))
