"""The rows a plan's evaluation explains itself with (``Evaluation.details``, ``sources``,
``trust``): the bottleneck replica's GEMMs, floors and memory-bound terms, where each layer
cost came from, and how far each GPU type's prices were validated."""

from __future__ import annotations


def trust_of(ctx, stages, nodes) -> list:
    """Per GPU type used: validated on measured runs, profiled, or datasheet-only (trust.py)."""
    from planner.cost.trust import plan_trust
    types = sorted({nodes[r.node].gpu.name for st in stages for r in st.replicas})
    profiled = {key.split("/")[0] for key, src in ctx.sources.items() if src != "estimated"}
    return plan_trust(types, ctx.precision, profiled & set(types))


def plan_sources(ctx, stages, nodes, of: str = "sources") -> dict[str, str]:
    """measured|interpolated|estimated for the layer costs this plan used (a shared ctx holds
    more); ``of="repriced"``: how those of them measured with other kernels were re-priced."""
    entries = getattr(ctx, of)
    out = {}
    for st in stages:
        for r in st.replicas:
            gpu = nodes[r.node].gpu.name
            kinds = (["block"] if st.num_blocks else []) + (["embedding"] if st.embedding else []) \
                + (["head"] if st.head else [])
            for kind in kinds:
                key = f"{gpu}/{kind}/mb{r.micro_batch_share}/tp{r.tp}"
                if key in entries:
                    out[key] = entries[key]
    return dict(sorted(out.items()))


def bottleneck_details(ctx, plan, priced, nodes, timings, k) -> list[tuple[str, float, str]]:
    """Explain rows for the bottleneck stage's slowest replica: each GEMM's efficiency, the
    launch floors, and where the curve's numbers come from."""
    from planner.catalog.benchmarks import matmul_ceiling
    from planner.cost.compute import gemm_curve_for
    from planner.cost.cross_entropy import loss_details
    from planner.cost.elementwise import elementwise_details
    from planner.cost.roofline import block_gemms
    st = plan.stages[k]
    r = st.replicas[timings[k].slowest_replica]
    gpu = nodes[r.node].gpu
    cal = ctx.calibration.for_gpu(gpu)
    curve = gemm_curve_for(ctx, gpu)
    where = f"stage {k} replica {timings[k].slowest_replica} ({gpu.name}, tp={r.tp}, share={r.micro_batch_share})"
    bench = matmul_ceiling(gpu.name)
    ceiling_src = ("profile fit" if cal.matmul_ceiling is not None else
                   f"{bench.source}; x {bench.training_fraction(ctx.precision) / bench.fraction:g} for a "
                   f"training shape ({bench.typical_source})")
    half_src = cal.source
    if cal.fitted_on and (cal.fitted_on != gpu.name or ctx.activation_bytes != 2):
        half_src += (f"; on {cal.fitted_on} in 2-byte precision, carried to {gpu.name} {ctx.precision} by "
                     "peak (fill) and operand rate (depth), gemm.transferred_halves")
    rows = []
    for g in block_gemms(ctx.model, r.micro_batch_share, ctx.seq_len, r.tp, ctx.context_parallel,
                         ctx.expert_parallel):
        shape = f"M={g.m:.0f} N={g.n:.0f} K={g.k:.0f} x{g.batch:g}"
        rows.append((f"gemm_efficiency.{g.name}", curve.efficiency(g),
                     f"{where}: {shape}, {curve.time_s(g) * 1e3:.3f} ms forward"))
    rows += [
        ("gemm_ceiling", curve.ceiling, f"{ctx.precision} peak {curve.peak_flops / 1e12:.4g} TFLOP/s; {ceiling_src}"),
        ("gemm_fill_half_outputs", curve.outputs_half, f"x/(x+x_half) wave fill, x = M N; {half_src}"),
        ("gemm_depth_half", curve.depth_half, f"K/(K+k_half) K-loop amortisation; {half_src}"),
        ("block_launch_floor_s", cal.layer_overhead_s, ("per block forward (backward 2x): block time = "
         "max(GPU work, floor), launches overlap GPU work")),
        ("microbatch_overhead_s", cal.microbatch_overhead_s, "fixed time per micro-batch per stage"),
    ]
    if st.num_blocks:   # a block's memory-bound ops, fused or eager (Training.elementwise)
        rows += elementwise_details(ctx, gpu, r.tp, r.micro_batch_share)
        rows += softmax_details(ctx, gpu, r.tp, r.micro_batch_share)
    # the head stage as priced (``priced``: in a V, rank 0), not as the plan file keeps it
    last = next((i for i, x in enumerate(priced) if x.head), None)
    if last is not None:   # the head stage's loss term (its kernel's passes over the logits)
        r = priced[last].replicas[timings[last].slowest_replica]
        rows += loss_details(ctx, nodes[r.node].gpu, r.tp, r.micro_batch_share)
    return rows


def softmax_details(ctx, gpu, tp: int, share: int) -> list[tuple[str, float, str]]:
    """Without flash attention: whether Megatron's fused softmax kernel runs, and what its
    PyTorch path adds to one block when it does not (planner.cost.softmax): the block's
    forward, backward and recompute with it against the same without its bytes and launches."""
    from dataclasses import replace

    from planner.cost.compute import gemm_curve_for, roofline_phases
    from planner.cost.roofline import block_work
    from planner.cost.softmax import FALLBACK_EXTRA_KERNELS, softmax_refusal
    if ctx.flash_attention:
        return []
    heads = ctx.model.num_attention_heads / tp
    why = softmax_refusal(ctx.activation_bytes, share, heads, ctx.local_seq_len, ctx.seq_len)
    if why is None:
        return [("attention_softmax_fused", 1.0, ("Megatron's fused scale-mask-softmax kernel runs "
                 f"(micro-batch {share} x {heads:g} heads per TP rank, {ctx.seq_len} keys)"))]
    work = block_work(ctx, gemm_curve_for(ctx, gpu), tp, share)
    fused = replace(work, softmax_fallback_forward_s=0.0, softmax_fallback_backward_s=0.0, extra_kernels=0.0)
    extra_s = sum(roofline_phases(ctx, gpu, work)[:3]) - sum(roofline_phases(ctx, gpu, fused)[:3])
    return [("attention_softmax_fallback_s", extra_s,
             (f"per block and micro-batch (forward, backward, recompute): PyTorch's softmax path ({why}) "
             f"moves more bytes and launches {FALLBACK_EXTRA_KERNELS} more kernels each way (at the launch "
             "floor's cost per kernel where the block is launch-bound); planner/cost/softmax.py"))]
