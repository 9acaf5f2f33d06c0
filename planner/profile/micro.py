"""Micro-benchmarks of the cost model's memory-bound terms on this device:
``python -m planner.profile.micro --gpu-type ID -o micro.json``.

The GEMM sweep (gemm_sweep.py) checks the compute curve; these check the terms beside it, each
against the cost model's own formula for it:
- ``copy``: device-to-device copy, bytes read + written per second: the achieved HBM bandwidth
  that ``mem_eff`` scales the datasheet figure to (planner/cost/gemm.py ``memory_Bps``).
- ``adam``: one fused AdamW step over fp32 parameters (torch.optim.AdamW(fused=True)), beside
  ``optimizer_time_s``'s bytes-touched price (planner/cost/compute.py).
- ``attention_core``: the unfused attention core (Q K^T, scale-mask-softmax, dropout, A V) in
  the activation dtype, beside the roofline's core GEMMs plus ``ATTENTION_CORE_PASSES`` s^2
  traffic (planner/cost/roofline.py); flash (scaled_dot_product_attention) beside the
  flash pricing.
- ``launch``: many tiny kernels queued back to back: the per-kernel launch cost that a
  block's fixed floor (``layer_overhead_s``) stands for.
Timing: CUDA events around ``repeats`` runs after ``warmup`` (mean per run); wall clock on CPU.
It imports torch and runs only where it is called (the device check, scripts/device_check.sh).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time


def _timer(device):
    import torch
    cuda = getattr(device, "type", str(device)) == "cuda"

    def run(fn, warmup: int = 3, repeats: int = 10) -> float:
        for _ in range(warmup):
            fn()
        if cuda:
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                fn()
            end.record()
            torch.cuda.synchronize(device)
            return start.elapsed_time(end) / 1e3 / repeats
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - t0) / repeats
    return run


def copy_rows(device, sizes_mib: list[int]) -> list[dict]:
    import torch
    timed = _timer(device)
    rows = []
    for mib in sizes_mib:
        src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        t = timed(functools.partial(dst.copy_, src))
        rows.append({"bytes_moved": 2 * src.numel(), "measured_s": t, "achieved_Bps": 2 * src.numel() / t})
    return rows


def adam_rows(device, params_m: list[int]) -> list[dict]:
    import torch
    timed = _timer(device)
    rows = []
    for pm in params_m:
        p = torch.zeros(pm * 10**6, dtype=torch.float32, device=device, requires_grad=True)
        p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW([p], lr=1e-4, fused=getattr(device, "type", str(device)) == "cuda")
        t = timed(opt.step, warmup=2, repeats=5)
        rows.append({"params": p.numel(), "measured_s": t})
        del opt, p
    return rows


def _unfused_core(q, k, v, mask):
    """Eager PyTorch, one kernel per step (not Megatron's fused scale-mask-softmax): scores,
    scale, causal mask, softmax, dropout, context."""
    import torch.nn.functional as F
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    return F.dropout(scores.masked_fill(~mask, float("-inf")).softmax(-1), 0.1) @ v


def attention_rows(device, dtype: str, shapes: list[tuple[int, int, int, int]]) -> list[dict]:
    """(micro-batch, heads, seq, head_dim) per row: unfused and flash forward, seconds."""
    import torch
    import torch.nn.functional as F

    from planner.profile.measure import DTYPES
    timed = _timer(device)
    rows = []
    for b, a, s, d in shapes:
        kw = {"dtype": DTYPES[dtype], "device": device}
        q, k, v = (torch.randn(b, a, s, d, **kw) for _ in range(3))
        mask = torch.ones(s, s, dtype=torch.bool, device=device).tril()

        rows.append({"micro_batch": b, "heads": a, "seq_len": s, "head_dim": d,
                     "unfused_s": timed(functools.partial(_unfused_core, q, k, v, mask)),
                     "flash_s": timed(functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=True))})
    return rows


def launch_row(device, kernels: int = 2000) -> dict:
    import torch
    x = torch.zeros(1, device=device)
    t = _timer(device)(lambda: [x.add_(1) for _ in range(kernels)], warmup=1, repeats=3)
    return {"kernels": kernels, "per_kernel_s": t / kernels}


def main(argv: list[str] | None = None) -> int:
    from planner.profile.measure import resolve_device
    ap = argparse.ArgumentParser(prog="python -m planner.profile.micro", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32", "tf32"])
    ap.add_argument("--small", action="store_true", help="tiny sizes (a CPU smoke run)")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    if args.small:
        sizes, params, shapes = [1, 4], [1], [(1, 2, 64, 16)]
    else:
        sizes, params = [16, 256, 2048], [100, 1000]
        shapes = [(1, 16, 2048, 64), (4, 16, 2048, 64), (1, 32, 4096, 128), (1, 32, 8192, 128)]
    out = {"device": str(device), "dtype": args.dtype, "copy": copy_rows(device, sizes),
           "adam": adam_rows(device, params), "attention_core": attention_rows(device, args.dtype, shapes),
           "launch": launch_row(device, 200 if args.small else 2000)}
    if getattr(device, "type", "") == "cuda":
        import torch
        out["device_name"] = torch.cuda.get_device_name(device)
    with open(args.output, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    best = max(r["achieved_Bps"] for r in out["copy"])
    print(f"copy {best / 1e12:.2f} TB/s; adam {out['adam'][-1]['measured_s'] * 1e3:.2f} ms for "
          f"{out['adam'][-1]['params'] / 1e6:.0f}M params; launch {out['launch']['per_kernel_s'] * 1e6:.1f} us; "
          f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
