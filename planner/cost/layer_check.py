"""The roofline's block time against published per-layer measurements on many GPU types:
``python -m planner.cost.layer_check`` (also run by ``make fidelity``).

The calibration is fitted on two GPUs only (A100, H100: calibration.py); every other GPU type,
and every precision but the 2-byte one, is priced by carrying the fitted GEMM half-sizes over
(gemm.py ``transferred_halves``).  Sailor's profiler timed one transformer block alone on seven
GPU types, in fp32 with TF32 matmuls where the GPU has them (tests/fidelity/sources/
sailor_layer_profiles.yaml, with its source): a check of that transfer, block by block, before
any pipeline or network enters.  Nothing is fitted to these rows.

Each row prices the block as Sailor's Megatron-DeepSpeed ran it: tf32, unfused attention (no
flash kernel there), no recompute, tp 1, seq 2048, micro-batch as measured.  A second set, the
same block at tp 8 on the MIT cluster's GeForce nodes, prices its TP collectives with Sailor's
measured 8-GPU intra-node figure, read two ways.  That figure is not one GPU's: Sailor's
profiler (sailor/profiling/networking/test_sendrecv.py, run as its docs/PROFILING.md says) runs
n / 2 send/recv pairs at once and divides all pairs' bytes by the time, so it is the pairs' sum
(its GH-96 files agree: 125.5 GB/s at 2 GPUs, 250.6 at 4).  At the sum, as the MIT fidelity
clusters take it, the blocks are 0.45-0.71x of measured: the cost those rows' end-to-end
predictions miss.  Per pair (sum / 4), what one GPU moves while every GPU sends, the Titan RTX
and RTX 2080 Ti blocks come to 1.14-1.29x, the same factor as their tp-1 compute (above), and
the RTX 3090's to 1.6-2.1x (its GPUs 0 and 1 share an NVLink bridge, 49.8 GB/s at 2 GPUs, which
a ring can use and the test's pairs did not).  Printed, not used by the trust levels.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

SOURCE = Path(__file__).resolve().parents[2] / "tests" / "fidelity" / "sources" / "sailor_layer_profiles.yaml"


@dataclass(frozen=True)
class LayerCheckRow:
    model: str
    gpu: str
    micro_batch: int
    measured_s: float      # forward + backward of one block
    predicted_s: float     # with tp > 1 its TP collectives too (the profile timed them inside the block)
    tp: int = 1

    @property
    def ratio(self) -> float:
        """Predicted over measured: above 1, the model is too slow."""
        return self.predicted_s / self.measured_s


@cache
def _source() -> dict:
    return yaml.safe_load(SOURCE.read_text())


def check_rows(calibration=None, tp_rows: bool = False, per_pair: bool = False) -> list[LayerCheckRow]:
    """The tp-1 blocks; with ``tp_rows`` the tensor-parallel ones instead (each priced with the
    measured intra-node figure its row carries: Sailor's sum over its ``tp / 2`` send/recv pairs,
    or with ``per_pair`` one pair's share of it)."""
    from planner import catalog
    from planner.cost.compute import block_timing
    from planner.cost.context import CostContext
    from planner.spec import load_model
    data = _source()
    models = {key: load_model(spec) for key, spec in data["models"].items()}
    extra = {"calibration": calibration} if calibration is not None else {}
    contexts = {key: CostContext(model=m, seq_len=int(data["seq_len"]), precision=data["precision"],
                                 flash_attention=False, **extra) for key, m in models.items()}
    out = []
    for row in data["tp_rows" if tp_rows else "rows"]:
        gpu = catalog.gpu(row["gpu"])
        tp = int(row.get("tp", 1))
        # tp 1: no collective, so the link figure is never read
        link_Bps = float(row.get("intra_node_bytes_per_s", gpu.intra_node_bandwidth_Bps))
        if per_pair and tp > 1:
            link_Bps /= tp / 2   # the row's node has tp GPUs: tp / 2 pairs were summed
        t = block_timing(contexts[row["model"]], gpu, link_Bps, tp, int(row["micro_batch"]))
        out.append(LayerCheckRow(row["model"], gpu.name, int(row["micro_batch"]),
                                 row["forward_s"] + row["backward_s"],
                                 t.forward_s + t.backward_s + t.tp_comm_s, tp))
    return out


def mean_abs_log_ratio(rows: list[LayerCheckRow]) -> float:
    """exp of it - 1 is the typical factor off, either way (a 1.2x slow and a 1.2x fast row
    count the same)."""
    return statistics.fmean(abs(math.log(r.ratio)) for r in rows)


def checks_summary(calibration=None) -> dict[str, list[dict]]:
    """Per GPU type, the check in the shape of validation.yaml's ``device_checks`` (what
    planner.cost.trust reads): mean |relative error| of the block's forward + backward."""
    out: dict[str, list[dict]] = {}
    rows = check_rows(calibration)
    for gpu in sorted({r.gpu for r in rows}):
        mine = [r for r in rows if r.gpu == gpu]
        out[gpu] = [{"folder": SOURCE.relative_to(SOURCE.parents[3]).as_posix(), "gpus": 1,
                     "precision": _source()["precision"], "kind": "published blocks", "rows": len(mine),
                     "mape_percent": round(100 * statistics.fmean(abs(r.ratio - 1) for r in mine), 1)}]
    return out


def format_rows(rows: list[LayerCheckRow]) -> str:
    lines = [("Sailor's per-layer profiles (one block, tf32, tp 1, seq 2048; tests/fidelity/sources/"
              "sailor_layer_profiles.yaml): predicted / measured block time, not fitted"),
             f"{'model':14s} {'gpu':16s} " + "  ".join(f"mb{mb:<4d}" for mb in (1, 2, 4, 8, 16, 32))]
    groups: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        groups.setdefault((r.model, r.gpu), {})[r.micro_batch] = r.ratio
    for (model, gpu), by_mb in groups.items():
        cells = "  ".join(f"{by_mb[mb]:6.2f}" if mb in by_mb else f"{'':6s}" for mb in (1, 2, 4, 8, 16, 32))
        lines.append(f"{model:14s} {gpu:16s} {cells}")
    lines.append(f"mean |log(predicted / measured)| over {len(rows)} rows: {mean_abs_log_ratio(rows):.3f} "
                 f"(a typical factor of {math.exp(mean_abs_log_ratio(rows)):.2f})")
    return "\n".join(lines)


def format_tp_rows(rows: list[LayerCheckRow], per_pair_rows: list[LayerCheckRow] | None = None) -> str:
    """The tensor-parallel blocks: what the TP collectives on these nodes cost against the price,
    with Sailor's 8-GPU figure as its pairs' sum and, given ``per_pair_rows``, as one pair's."""
    lines = [(f"the same at tp {rows[0].tp} on one MIT node, TP collectives at Sailor's measured 8-GPU "
              "intra-node figure: predicted / measured")]
    readings = [("pair sum", rows)] + ([("per pair", per_pair_rows)] if per_pair_rows else [])
    for reading, mine in readings:
        groups: dict[str, list[LayerCheckRow]] = {}
        for r in mine:
            groups.setdefault(r.gpu, []).append(r)
        for gpu, group in groups.items():
            lines.append(f"{reading:9s} {'opt-350m':10s} {gpu:16s} "
                         + "  ".join(f"mb{r.micro_batch} {r.ratio:.2f}" for r in group))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    del argv
    print(format_rows(check_rows()))
    print(format_tp_rows(check_rows(tp_rows=True), check_rows(tp_rows=True, per_pair=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
