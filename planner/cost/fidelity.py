"""How well the cost model predicts measured runs: ``python -m planner.cost.fidelity``.

Sets (tests/fidelity/README.md): ``vtrain-single`` (A100, 1 node) and ``megatron-core-h100``
(H100) are the calibration sets; ``vtrain-multi`` (A100, up to 512 GPUs) and ``sailor``
(GH200 on Alps Clariden; mixed RTX nodes at MIT) are predicted without fitting anything.

Per set, a priori framework facts (not fitted, from the sources' own descriptions):
- vTrain (Megatron-DeepSpeed, 2022): no flash attention; ``use_gradient_bucket false``, so the
  gradient all-reduce runs after the backward, not overlapped.
- Megatron-Core r0.8 benchmarks: flash attention (Transformer Engine); the source lists
  ``--overlap-grad-reduce``, ``--overlap-param-gather`` and ``--tp-comm-overlap``.
- Sailor (its Megatron-DeepSpeed fork): no flash attention, no gradient-reduce overlap.

What the errors say (see the table and README "How good are the predictions?"):
- vtrain-single / megatron-core-h100 are fitted (6 parameters on 1440 rows; 2 on 9 rows): the
  GEMM curve's two half-sizes, elementwise memory efficiency, and the stack's launch costs.
  The matmul ceiling (published MAMF) and NCCL bus bandwidths are not fitted.
- vtrain-multi (unfitted): ~9%, about 8% too fast at every hidden size: not the compute
  curve's shape but the multi-node runs (unknown network; unbucketed gradient all-reduce).
- sailor: fp32 storage with TF32 matmuls on GH200 (model FLOP/s above the FP32 peak), fp32 on
  the MIT RTX cluster, so the unfused fp32 softmax; ~17% / ~21%, both mostly too fast; one GH200
  row and two MIT rows are flagged suspect by the generator (printed with and without them).
- torchtitan-h100 (unfitted, FSDP2 + per-op recompute on a 500 W H100 of unpublished peak): ~19%
  too fast; memory 21 GiB under (its unfused cross-entropy's logit copies).
- Peak memory (Sailor's max_mem, semantics unverified): 4-byte training raises every
  prediction; two MIT tp=2 rows look like runs with recompute.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETS = ("vtrain-single", "megatron-core-h100", "vtrain-multi", "sailor", "torchtitan-h100")
CALIBRATION_SETS = ("vtrain-single", "megatron-core-h100")
SET_CONTEXT = {
    "vtrain-single": {"flash_attention": False, "grad_reduce_overlap": False},
    "vtrain-multi": {"flash_attention": False, "grad_reduce_overlap": False},
    "megatron-core-h100": {"flash_attention": True, "grad_reduce_overlap": True, "tp_comm_overlap": True},
    "sailor": {"flash_attention": False, "grad_reduce_overlap": False},
    # FSDP2 overlaps its reduce-scatters and prefetched all-gathers with compute; SDPA attention
    "torchtitan-h100": {"flash_attention": True, "grad_reduce_overlap": True},
}
# What the published simulators reached on comparable sets (for the table's last column).
REFERENCE_MAPE = {"vtrain-single": "vTrain 8.4%", "vtrain-multi": "vTrain 14.7%",
                  "sailor/GH200": "Sailor 8.9%"}


@dataclass(frozen=True)
class RowResult:
    id: str
    set: str
    group: str
    measured_s: float
    predicted_s: float
    measured_memory_bytes: float | None = None   # where the source measured a peak
    predicted_memory_bytes: float | None = None  # largest device peak of the plan
    hidden_size: int = 0
    gpu_types: tuple[str, ...] = ()
    precision: str = "bf16"
    # the generator marks a row suspect from the source's own figures, before any prediction
    # (tests/fidelity/generate.py: a gradient reduction as long as the whole iteration, or all
    # three measured values copied from another row)
    suspect: bool = False
    config: dict = field(default_factory=dict, compare=False)   # the row's compact config (rows.yaml)

    @property
    def ape(self) -> float:
        return abs(self.predicted_s - self.measured_s) / self.measured_s

    @property
    def signed_error(self) -> float:
        """(predicted - measured) / measured: negative = predicted too fast."""
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class Summary:
    name: str
    rows: int
    mape: float
    median_ape: float
    worst_id: str
    worst_ape: float


def _rows_module():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        from tests.fidelity import rows
    except ImportError as exc:  # pragma: no cover - only outside a checkout
        raise SystemExit(f"fidelity sets need the repository checkout (tests/fidelity): {exc}")
    return rows


@cache
def load_rows(name: str) -> tuple:
    """(row, cluster, model) for every expressible row of a set, plans checked once."""
    from planner.spec import load_cluster, load_model
    rows = _rows_module().load_set(name, expressible_only=True)
    clusters: dict = {}
    out = []
    for row in rows:
        cluster = clusters.get(row.cluster_path)
        if cluster is None:
            cluster = clusters[row.cluster_path] = load_cluster(row.cluster_path)
        out.append((row, cluster, load_model(row.plan.inputs.model)))
    return tuple(out)


def group_of(set_name: str, row_id: str) -> str:
    if set_name == "sailor":
        return "sailor/GH200" if row_id.startswith("clariden") else "sailor/MIT-mixed"
    return set_name


def predict_set(name: str, calibration=None) -> list[RowResult]:
    from planner.cost.evaluate import context_for_plan, evaluate
    extra = SET_CONTEXT.get(name, {})
    out = []
    contexts: dict = {}  # rows with the same model and knobs share a context (and its caches)
    for row, cluster, model in load_rows(name):
        p = row.plan
        # every CostContext.from_plan field (the schedule's included), so no row is priced with
        # another's context parallelism, experts or shard groups
        key = (id(model), str(p.inputs.training), p.recompute, p.sequence_parallel, p.zero_stage,
               p.schedule, p.virtual_stages, p.num_micro_batches if p.zero_stage >= 2 else 1,
               p.reshards_after_forward, p.context_parallel, p.expert_parallel, p.zero_shard_degree)
        ctx = contexts.get(key)
        if ctx is None:
            ctx = contexts[key] = context_for_plan(p, calibration, model=model, **extra)
        ev = evaluate(cluster, p, model=model, check=False, ctx=ctx)
        mem = row.extras.get("measured_max_mem_bytes")
        out.append(RowResult(row.id, name, group_of(name, row.id), row.measured_iteration_time_s,
                             ev.iteration_time_s, mem, max(ev.peak_memory_bytes.values()) if mem else None,
                             model.hidden_size, _gpu_types(cluster, p), str(p.inputs.training.get("precision", "bf16")),
                             any("suspect" in n for n in row.notes), row.config))
    return out


def _gpu_types(cluster, plan) -> tuple[str, ...]:
    nodes = cluster.node_by_name
    return tuple(sorted({nodes[r.node].gpu.name for st in plan.stages for r in st.replicas}))


def validation_summary(calibration=None, results_by_set=None) -> dict:
    """Per GPU type and precision: the sets it ran in, rows, fitted or not, mean error; and the
    one-GPU device checks (reference/device, planner.cost.device_report) with the model's error
    on them (what planner.cost.trust reads from validation.yaml)."""
    results_by_set = results_by_set or predict_all(calibration)
    by_gpu: dict[str, list[dict]] = {}
    for name in SETS:
        results = results_by_set[name]
        keys = sorted({(g, r.precision, r.group) for r in results for g in r.gpu_types})
        for gpu, precision, group in keys:
            rows = [r for r in results if gpu in r.gpu_types and r.precision == precision and r.group == group]
            by_gpu.setdefault(gpu, []).append({
                "set": group, "precision": precision, "rows": len(rows), "fitted": name in CALIBRATION_SETS,
                "mape_percent": round(100 * statistics.fmean(r.ape for r in rows), 1)})
    from planner.cost.device_report import device_checks_summary
    from planner.cost.layer_check import checks_summary
    checks = device_checks_summary(calibration)
    for gpu, entries in checks_summary(calibration).items():   # Sailor's per-layer profiles
        checks.setdefault(gpu, []).extend(entries)
    return {"gpu_types": dict(sorted(by_gpu.items())), "device_checks": dict(sorted(checks.items()))}


VALIDATION_HEADER = """\
# Written by `python -m planner.cost.fidelity --write` (planner/cost/trust.py reads it): for each
# GPU type that ran in a measured fidelity set, the model's mean absolute error there; under
# device_checks, the one-GPU device checks of reference/device (predicted, not fitted). Do not edit.
"""


def write_validation(calibration=None, results_by_set=None) -> Path:
    import yaml

    from planner.cost.trust import VALIDATION_FILE
    summary = validation_summary(calibration, results_by_set)
    VALIDATION_FILE.write_text(VALIDATION_HEADER + yaml.safe_dump(summary, sort_keys=False))
    return VALIDATION_FILE


def summarize(name: str, results: list[RowResult]) -> Summary:
    apes = [r.ape for r in results]
    worst = max(results, key=lambda r: (r.ape, r.id))
    return Summary(name, len(results), statistics.fmean(apes), statistics.median(apes), worst.id, worst.ape)


def memory_summary(name: str, results: list[RowResult]) -> Summary | None:
    """Peak-memory error where the source measured it (Sailor's max_mem, semantics unverified)."""
    rows = [r for r in results if r.measured_memory_bytes]
    if not rows:
        return None
    fake = [RowResult(r.id, r.set, r.group, r.measured_memory_bytes, r.predicted_memory_bytes) for r in rows]
    return summarize(f"{name} (peak memory)", fake)


def predict_all(calibration=None) -> dict[str, list[RowResult]]:
    """Every set's predictions, once: the tables below all read from them."""
    return {name: predict_set(name, calibration) for name in SETS}


def fidelity_table(calibration=None, memory: bool = True, results_by_set=None) -> list[Summary]:
    """One summary per set, then per Sailor sub-cluster (each also without its suspect rows,
    where it has any), then peak memory where measured."""
    results_by_set = results_by_set or predict_all(calibration)
    out = []
    mem_rows = []
    for name in SETS:
        results = results_by_set[name]
        out.append(summarize(name, results))
        m = memory_summary(name, results) if memory else None
        if m is not None:
            mem_rows.append(m)
        groups = sorted({r.group for r in results} - {name})
        for g in groups:
            rows = [r for r in results if r.group == g]
            out.append(summarize(g, rows))
            if any(r.suspect for r in rows):
                out.append(summarize(f"{g} {NO_SUSPECT}", [r for r in rows if not r.suspect]))
    return out + mem_rows


NO_SUSPECT = "(no suspect)"


def format_table(summaries: list[Summary]) -> str:
    lines = [f"{'set':<30}{'rows':>6}{'MAPE':>9}{'median':>9}  {'worst row':<30}{'error':>8}  fitted?  reference",
             "-" * 120]
    for s in summaries:
        base = s.name.split("/")[0].split(" ")[0]
        fitted = "fit" if base in CALIBRATION_SETS else "predict"
        lines.append(f"{s.name:<30}{s.rows:>6}{100 * s.mape:>8.1f}%{100 * s.median_ape:>8.1f}%  "
                     f"{s.worst_id:<30}{100 * s.worst_ape:>7.1f}%  {fitted:<8} {REFERENCE_MAPE.get(s.name, '')}")
    return "\n".join(lines)


# Hidden-size buckets: a model whose shape is right shows no trend of error across them.
HIDDEN_BUCKETS = ((0, 2048), (2048, 4096), (4096, 8192), (8192, 1 << 30))


@dataclass(frozen=True)
class Bucket:
    set: str
    hidden: str          # "1024-2047" etc.
    rows: int
    mape: float
    mean_signed: float   # negative: predicted too fast on average
    median_signed: float  # the same, robust to the suspect rows the sets flag


def bucket_table(calibration=None, results_by_set=None) -> list[Bucket]:
    """Per set (and Sailor sub-cluster), the error by hidden-size bucket."""
    results_by_set = results_by_set or predict_all(calibration)
    out = []
    for name in SETS:
        results = results_by_set[name]
        for group in sorted({r.group for r in results}):
            rows = [r for r in results if r.group == group]
            for lo, hi in HIDDEN_BUCKETS:
                sel = [r for r in rows if lo <= r.hidden_size < hi]
                if sel:
                    label = f">={lo}" if hi >= 1 << 30 else f"{lo}-{hi - 1}"
                    out.append(Bucket(group, label, len(sel), statistics.fmean(r.ape for r in sel),
                                      statistics.fmean(r.signed_error for r in sel),
                                      statistics.median(r.signed_error for r in sel)))
    return out


def format_buckets(buckets: list[Bucket]) -> str:
    lines = [f"{'set':<22}{'hidden':>12}{'rows':>6}{'MAPE':>9}{'mean signed':>13}{'median signed':>15}",
             "-" * 77]
    for b in buckets:
        lines.append(f"{b.set:<22}{b.hidden:>12}{b.rows:>6}{100 * b.mape:>8.1f}%{100 * b.mean_signed:>+12.1f}%"
                     f"{100 * b.median_signed:>+14.1f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    results = predict_all()
    if "--write" in args:
        print(f"wrote {write_validation(results_by_set=results)}")
    print(format_table(fidelity_table(results_by_set=results)))
    print()
    print("error by hidden size (signed: negative = predicted too fast)")
    print(format_buckets(bucket_table(results_by_set=results)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
