"""Measured reference runs as (cluster spec, plan, measured iteration time).

Each set lives in ``tests/fidelity/<set>/``: ``clusters/*.yaml`` (DESIGN §2 cluster specs),
``rows.yaml`` (one entry per measured row, duplicates kept) and, except for ``vtrain-single``,
``plans/<row id>.json`` (DESIGN §4 plan files).  ``generate.py`` writes them from
``shared/reference``; this module reads them back, and is also where the per-row plan is built
from a row's compact ``config``, so that the generator and ``load_set`` agree by construction.

Usage (from the repository root, or anywhere with the root on ``sys.path``)::

    from tests.fidelity.rows import load_set
    for row in load_set("sailor"):
        if row.plan is None:        # a row the plan format cannot express; see row.unexpressible
            continue
        cluster = planner.spec.load_cluster(row.cluster_path)
        ...  row.plan, row.measured_iteration_time_s, row.extras

The conventions behind every field are in ``tests/fidelity/README.md``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from planner.plan import Plan
from planner.spec import Cluster, load_cluster, load_model

HERE = Path(__file__).resolve().parent

SETS = ("vtrain-single", "vtrain-multi", "megatron-core-h100", "sailor", "torchtitan-h100")
EXPECTED_COUNTS = {"vtrain-single": 1440, "vtrain-multi": 109, "megatron-core-h100": 9, "sailor": 36,
                   "torchtitan-h100": 18}


class Unexpressible(ValueError):
    """A measured configuration that the plan space of DESIGN §3 cannot hold."""


@dataclass(frozen=True)
class FidelityRow:
    id: str
    set: str
    source_index: int                  # position of the row in the reference file's ``rows``
    cluster_path: Path
    plan: Plan | None                  # None only when ``unexpressible`` says why
    measured_iteration_time_s: float
    extras: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()        # caveats on this row (suspect measurements, assumptions)
    unexpressible: str | None = None
    plan_path: Path | None = None      # the plan file on disk, where the set has them
    config: dict[str, Any] = field(default_factory=dict)  # the compact form the plan is built from


# -- building plans -------------------------------------------------------------------------

def split_blocks(num_blocks: int, num_stages: int) -> list[tuple[int, int]]:
    """Contiguous, as even as possible; the remainder goes to the later stages."""
    base, extra = divmod(num_blocks, num_stages)
    sizes = [base + (1 if s >= num_stages - extra else 0) for s in range(num_stages)]
    out, first = [], 0
    for size in sizes:
        out.append((first, first + size))
        first += size
    return out


def allocate_devices(cluster: Cluster, stages: list[list[tuple[str, int]]]) -> list[list[list[str]]]:
    """Name devices for ``stages[s][r] = (gpu_type, tp)``, walking stages, then replicas.

    Per GPU type, devices are taken in cluster order (node by node, local index ascending);
    a replica takes the next ``tp`` devices of its type and never straddles two nodes.  For a
    Megatron-style plan (same replicas in every stage) this is Megatron's rank order: TP
    innermost, then DP, then PP, filling nodes in order.
    """
    pools: dict[str, list[list[str]]] = {}
    for node in cluster.node_list:
        pools.setdefault(node.gpu.name.lower(), []).append(node.device_ids())
    cursor = {k: (0, 0) for k in pools}  # (node index in pool, next local index)
    out = []
    for s, replicas in enumerate(stages):
        row = []
        for r, (gpu_type, tp) in enumerate(replicas):
            key = gpu_type.lower()
            if key not in pools:
                raise Unexpressible(f"stage {s} replica {r}: the cluster has no {gpu_type} nodes")
            nodes = pools[key]
            n, i = cursor[key]
            while n < len(nodes) and i + tp > len(nodes[n]):
                if tp > len(nodes[n]):
                    raise Unexpressible(f"stage {s} replica {r}: tp={tp} exceeds the {len(nodes[n])} "
                                        f"GPUs of a {gpu_type} node; a replica must sit in one node "
                                        "(DESIGN §3)")
                n, i = n + 1, 0
            if n >= len(nodes):
                raise Unexpressible(f"stage {s} replica {r}: not enough {gpu_type} devices in the cluster")
            row.append(nodes[n][i:i + tp])
            cursor[key] = (n, i + tp)
        out.append(row)
    return out


def _stage_layout(kind: str, cfg: dict, set_meta: dict) -> tuple[dict, list[tuple[int, int]],
                                                                  list[list[tuple[str, int]]], list[str]]:
    """-> (model mapping, blocks per stage, replicas per stage, notes)."""
    notes: list[str] = []
    if kind == "megatron":
        model = {**set_meta["model_defaults"], "name": cfg["model_name"],
                 "num_layers": cfg["num_layers"], "hidden_size": cfg["hidden_size"],
                 "num_attention_heads": cfg["num_attention_heads"]}
        blocks = split_blocks(cfg["num_layers"], cfg["pp"])
        gpu = set_meta["gpu_type"]
        replicas = [[(gpu, cfg["tp"])] * cfg["dp"] for _ in range(cfg["pp"])]
        return model, blocks, replicas, notes
    if kind == "sailor":
        mdl = set_meta["models"][cfg["model"]]
        model = {k: v for k, v in mdl.items() if k not in ("seq_len", "num_all_layers")}
        lps = list(cfg["layers_per_stage"])
        p = len(lps)
        num_blocks = mdl["num_layers"]
        if p == 1:
            sizes = [num_blocks]
            if lps[0] != mdl["num_all_layers"]:
                notes.append(f"layers_per_stage {lps} does not add up to the model's {mdl['num_all_layers']} "
                             "layers (embedding + blocks + head); a one-stage plan holds the whole model "
                             "regardless")
        else:
            if sum(lps) != mdl["num_all_layers"]:
                raise Unexpressible(f"layers_per_stage {lps} sums to {sum(lps)}, not the model's "
                                    f"{mdl['num_all_layers']} layers")
            # The first stage's first layer is the embedding, the last stage's last the head.
            sizes = [n - (1 if s in (0, p - 1) else 0) for s, n in enumerate(lps)]
        blocks, first = [], 0
        for size in sizes:
            blocks.append((first, first + size))
            first += size
        replicas = [[(r["gpu_type"], r["tp"]) for r in stage] for stage in cfg["stages"]]
        return model, blocks, replicas, notes
    if kind == "torchtitan":
        # torch.compile is priced as fused elementwise ops (the row's plan sets elementwise:
        # fused; what else compile changes is not priced: tests/fidelity/README.md)
        not_modelled = {"float8": "Float8 linear layers (the planner prices bf16, fp16, tf32 and fp32)",
                        "async-tp": "asynchronous TP (not modelled)"}
        missing = [not_modelled[t] for t in cfg.get("techniques", ()) if t in not_modelled]
        if missing:
            raise Unexpressible("uses " + "; ".join(missing))
        model = load_model(cfg["model"]).to_mapping()
        blocks = split_blocks(model["num_layers"], cfg["pp"])
        replicas = [[(set_meta["gpu_type"], cfg["tp"])] * cfg["dp"] for _ in range(cfg["pp"])]
        return model, blocks, replicas, notes
    raise ValueError(f"unknown set kind {kind!r}")


@cache
def _model_mapping(items: tuple) -> dict:
    return load_model(dict(items)).to_mapping()


def build_plan(kind: str, cfg: dict, set_meta: dict, cluster: Cluster) -> Plan:
    """The plan of one row, from its compact ``config`` and the set's shared fields."""
    model_map, blocks, replicas, _ = _stage_layout(kind, cfg, set_meta)
    model = _model_mapping(tuple(sorted(model_map.items())))
    devices = allocate_devices(cluster, replicas)
    knobs = {**set_meta["plan_defaults"], **cfg.get("plan", {})}
    share = cfg["micro_batch_per_replica"]
    widths = {len(r) for r in replicas}
    if len(widths) != 1:
        raise Unexpressible("stages with different replica counts need uneven shares; not used here")
    micro_batch_size = share * widths.pop()
    gbs = cfg["global_batch_size"]
    if gbs % micro_batch_size:
        raise Unexpressible(f"global batch {gbs} is not a multiple of the micro-batch "
                            f"{micro_batch_size} (= {share} per replica x replicas)")
    p = len(blocks)
    stages = []
    for s in range(p):
        stages.append({
            "index": s, "blocks": list(blocks[s]), "embedding": s == 0, "head": s == p - 1,
            "replicas": [{"gpu_type": gpu, "tp": tp, "micro_batch_share": share, "devices": devs}
                         for (gpu, tp), devs in zip(replicas[s], devices[s])],
        })
    data = {
        "schema": "planner.plan/v1",
        "inputs": {"cluster": cluster.name, "cluster_sha256": cluster.sha256(), "model": model,
                   "training": {"global_batch_size": gbs, "seq_len": cfg["seq_len"],
                                "precision": knobs["precision"],
                                **{k: knobs[k] for k in ("cross_entropy", "attention") if k in knobs},
                                # off its default only, as Training.io_mapping writes it
                                **({"elementwise": knobs["elementwise"]}
                                   if knobs.get("elementwise", "fused") != "fused" else {})}},
        "objective": {"kind": "throughput"},
        "micro_batch_size": micro_batch_size,
        "num_micro_batches": gbs // micro_batch_size,
        "schedule": knobs["schedule"], "virtual_stages": 1,
        "recompute": knobs["recompute"], "zero_stage": knobs["zero_stage"],
        "sequence_parallel": bool(knobs["sequence_parallel"]),
        "stages": stages,
    }
    if "reshard_after_forward" in knobs:
        data["reshard_after_forward"] = knobs["reshard_after_forward"]
    return Plan.from_json(data)


def row_notes(kind: str, cfg: dict, set_meta: dict) -> list[str]:
    return _stage_layout(kind, cfg, set_meta)[3]


# -- loading --------------------------------------------------------------------------------

@cache
def _cluster(path: Path) -> Cluster:
    return load_cluster(path)


def read_rows_yaml(name: str, base: Path = HERE) -> dict:
    if name not in SETS:
        raise KeyError(f"unknown fidelity set {name!r}; sets: {', '.join(SETS)}")
    with open(base / name / "rows.yaml", encoding="utf-8") as fh:
        return yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_set(name: str, *, expressible_only: bool = False, build: bool = False) -> list[FidelityRow]:
    """Every measured row of a set, duplicates included, in reference-file order.

    Where a row has a plan file, the plan is read from it (``Plan.from_json``); otherwise
    (``vtrain-single``, or ``build=True``) it is built in memory from the row's ``config`` by
    the same code the generator used.  Rows the plan format cannot express come with
    ``plan=None`` and the reason in ``unexpressible``, unless ``expressible_only``.
    """
    doc = read_rows_yaml(name)
    base = HERE / name
    kind = doc["kind"]
    out = []
    for entry in doc["rows"]:
        cluster_path = base / entry["cluster"]
        plan_path = base / entry["plan"] if entry.get("plan") else None
        plan = None
        if entry.get("unexpressible"):
            if expressible_only:
                continue
        elif plan_path is not None and not build:
            with open(plan_path, encoding="utf-8") as fh:
                plan = Plan.from_json(json.load(fh))
        else:
            plan = build_plan(kind, entry["config"], doc, _cluster(cluster_path))
        out.append(FidelityRow(
            id=entry["id"], set=name, source_index=entry["source_index"], cluster_path=cluster_path,
            plan=plan, measured_iteration_time_s=float(entry["measured_iteration_time_s"]),
            extras=dict(entry.get("extras") or {}), notes=tuple(entry.get("notes") or ()),
            unexpressible=entry.get("unexpressible"), plan_path=plan_path,
            config=dict(entry["config"])))
    return out
