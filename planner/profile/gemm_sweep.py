"""Time the GEMMs of a model's blocks on this device and set them beside the cost model's
prediction: ``python -m planner.profile.gemm_sweep --model M --gpu-type ID -o gemms.json``.

The shapes are the ones the cost model prices (planner/cost/roofline.py: qkv, the attention
core's batched GEMMs, projection, MLP; each forward GEMM and its dgrad and wgrad) for the given
micro-batches and TP degrees, so the output checks the per-GEMM curve (planner/cost/gemm.py)
shape by shape on real hardware.  Timing: CUDA events on GPU (median of ``repeats`` after
``warmup``), wall clock on CPU.  This is the GEMM part of the prepared device check
(scripts/device_check.sh); it imports torch and runs only where it is called.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from planner.cost.gemm import Gemm


@dataclass(frozen=True)
class GemmRow:
    name: str
    m: int
    n: int
    k: int
    batch: int
    measured_s: float
    predicted_s: float | None
    measured_tflops: float

    @property
    def error(self) -> float | None:
        return None if self.predicted_s is None else (self.predicted_s - self.measured_s) / self.measured_s


def sweep_shapes(model, micro_batches: list[int], tps: list[int], seq_len: int) -> list[Gemm]:
    """Every distinct forward, dgrad and wgrad GEMM of one block, per (micro-batch, tp)."""
    from planner.cost.roofline import block_gemms
    seen, out = set(), []
    for tp in tps:
        for mb in micro_batches:
            for g in block_gemms(model, mb, seq_len, tp):
                for x in (g, g.dgrad(), g.wgrad()):
                    key = (round(x.m), round(x.n), round(x.k), round(x.batch))
                    if key not in seen and min(key) >= 1:
                        seen.add(key)
                        out.append(Gemm(f"{x.name}@mb{mb}/tp{tp}", *key))
    return out


def time_gemm(g: Gemm, dtype: str, device, warmup: int = 3, repeats: int = 10) -> float:
    import torch

    from planner.profile.measure import DTYPES
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    kw = {"dtype": DTYPES[dtype], "device": device}
    b, m, n, k = int(g.batch), int(g.m), int(g.n), int(g.k)
    a = torch.randn(b, m, k, **kw) if b > 1 else torch.randn(m, k, **kw)
    w = torch.randn(b, k, n, **kw) if b > 1 else torch.randn(k, n, **kw)
    cuda = getattr(device, "type", str(device)) == "cuda"
    times = []
    for i in range(warmup + repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, w)
            end.record()
            torch.cuda.synchronize(device)
            elapsed = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            torch.matmul(a, w)
            elapsed = time.perf_counter() - t0
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times)


def run_sweep(model, gpu, dtype: str, device, micro_batches, tps, seq_len, warmup=3, repeats=10) -> list[GemmRow]:
    """``gpu``: the GpuType whose cost-model curve predicts each GEMM (None: no prediction)."""
    curve = None
    if gpu is not None:
        from planner.cost.calibration import default_calibration
        from planner.cost.context import element_bytes
        from planner.cost.gemm import gemm_curve
        curve = gemm_curve(gpu, dtype, default_calibration().for_gpu(gpu), element_bytes(dtype))
    rows = []
    for g in sweep_shapes(model, micro_batches, tps, seq_len):
        t = time_gemm(g, dtype, device, warmup, repeats)
        rows.append(GemmRow(g.name, int(g.m), int(g.n), int(g.k), int(g.batch), t,
                            curve.time_s(g) if curve is not None else None, g.flops / t / 1e12))
    return rows


def main(argv: list[str] | None = None) -> int:
    from planner import catalog
    from planner.profile.measure import resolve_device
    from planner.spec import load_model
    ap = argparse.ArgumentParser(prog="python -m planner.profile.gemm_sweep", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--gpu-type", help="catalog id whose curve predicts the GEMMs (default: none)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32", "tf32"])
    ap.add_argument("--micro-batch", default="1,2,4")
    ap.add_argument("--tp", default="1,2,4,8")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    model = load_model(args.model)
    gpu = catalog.gpu(args.gpu_type) if args.gpu_type else None
    rows = run_sweep(model, gpu, args.dtype, resolve_device(args.device),
                     [int(x) for x in args.micro_batch.split(",")], [int(x) for x in args.tp.split(",")],
                     args.seq_len, repeats=args.repeats)
    errors = [abs(r.error) for r in rows if r.error is not None]
    summary = {"rows": len(rows), "mean_abs_error": statistics.fmean(errors) if errors else None}
    with open(args.output, "w") as f:
        json.dump({"model": args.model, "gpu_type": args.gpu_type, "dtype": args.dtype, "summary": summary,
                   "rows": [asdict(r) | {"error": r.error} for r in rows]}, f, indent=1, sort_keys=True)
    err = summary["mean_abs_error"]
    shown = "n/a" if err is None else f"{100 * err:.1f}%"
    print(f"{len(rows)} GEMMs timed; mean |prediction error| {shown}; wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
