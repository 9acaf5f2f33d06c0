"""``planner catalog gpus|models``: list the built-in data with sources."""

from __future__ import annotations

import click

from planner.api import catalog as data
from planner.cli.common import console, echo_json
from planner.cli.tables import Table


@click.group()
def catalog() -> None:
    """List the built-in GPU types and model shapes."""


@catalog.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON, sources included.")
def gpus(as_json: bool) -> None:
    """GPU types: memory, dense bf16, fp32 and tf32 peaks, memory and NVLink bandwidth, price, sources."""
    entries = data.gpus()
    if as_json:
        echo_json({gid: g.model_dump(mode="json", by_alias=True) for gid, g in entries.items()})
        return
    table = Table(title="GPU catalog (dense TFLOP/s: FP16/BF16 tensor, FP32 without tensor cores, "
                        "TF32 tensor, '-' none; bandwidth per direction)")
    for col in ("id", "memory", "TFLOP/s", "FP32", "TF32", "HBM", "intra-node", "USD/GPU-h", "aliases"):
        table.add_column(col)
    for gid, g in entries.items():
        table.add_row(gid, f"{g.memory_bytes / 1e9:.0f} GB", f"{g.peak_tflops:g}",
                      "-" if g.fp32_tflops is None else f"{g.fp32_tflops:g}",
                      "-" if g.tf32_tflops is None else f"{g.tf32_tflops:g}",
                      f"{g.memory_bandwidth_Bps / 1e9:.0f} GB/s", f"{g.intra_node_bandwidth_Bps / 1e9:.0f} GB/s",
                      "-" if g.price_per_hour_usd is None else f"{g.price_per_hour_usd:.2f}",
                      ", ".join(g.aliases[:2]))
    console().print(table)
    console().print("sources: planner catalog gpus --json")


@catalog.command()
@click.option("--json", "as_json", is_flag=True, help="Print as JSON, sources included.")
def models(as_json: bool) -> None:
    """Model shapes: layers, hidden size, heads, FFN, vocabulary, parameters."""
    from planner.api import total_params  # here: keep `catalog gpus` light

    entries = data.models()
    if as_json:
        echo_json({mid: m.model_dump(mode="json") for mid, m in entries.items()})
        return
    table = Table(title="Model catalog")
    for col in ("id", "layers", "hidden", "heads", "kv", "ffn", "mlp", "vocab", "experts", "params", "source"):
        table.add_column(col)
    for mid, m in entries.items():
        experts = (f"{m.num_experts} top-{m.moe_top_k} x {m.moe_ffn_size}"
                   + (f" +{m.num_shared_experts} shared" if m.num_shared_experts else "")) if m.is_moe else "-"
        table.add_row(mid, str(m.num_layers), str(m.hidden_size), str(m.num_attention_heads),
                      str(m.kv_heads), str(m.ffn_size), m.mlp, str(m.vocab_size), experts,
                      f"{total_params(m) / 1e9:.2f} B", (m.source or "")[:40])
    console().print(table)
