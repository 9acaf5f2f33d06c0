"""The measurements file of ``planner run --measurements FILE`` (docs/runner.md, "Measurements").

Per step and per replica: the share it took, its forward and backward time (each the sum over
its actions, receive waits included), the part of those spent waiting on receives, its
gradient-sync time (the all-reduce over the stage's replicas, waiting for the slowest
included) and its compute time (forward + backward - receive waits), the slowest tp rank's
value of each. Tied to the plan it measured by the sha256 of the plan's canonical bytes, so a
file of another plan is refused. Torch-free.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import platform
from dataclasses import dataclass
from pathlib import Path

from planner.errors import InputError

SCHEMA_ID = "planner.measurements/v1"
FIELDS = ("forward_s", "backward_s", "recv_wait_s", "sync_wait_s")


def plan_sha256(plan) -> str:
    return hashlib.sha256(plan.dumps().encode()).hexdigest()


def cpu_model_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def trained_record(shape: dict, dtype: str, backend: str, allow_tf32: bool, slowdown: dict | None) -> dict:
    """What the run actually trained and on what: the model the runner built (``--tiny`` and
    ``--seq-len`` change it), its dtype, the backend, any ``--slow-rank``. ``planner profile
    --from-run`` needs it to tell which model and precision the times are of."""
    try:
        torch_version = importlib.metadata.version("torch")   # no import: seconds per process
    except importlib.metadata.PackageNotFoundError:
        torch_version = "unknown"
    return {"shape": dict(shape), "dtype": dtype, "backend": backend, "allow_tf32": allow_tf32,
            "slowdown": dict(slowdown) if slowdown else None, "torch_version": torch_version,
            "host_cpu": cpu_model_name()}


def build(plan, ranks, per_rank: dict[int, list[dict]], step_time_s: list[float],
          dynamic: dict | None, trained: dict | None = None) -> dict:
    """The document from each rank's records (``measure_worker``) and the step times;
    ``trained`` is ``trained_record``'s (None: not recorded)."""
    slots = {}
    for r in ranks:
        slots.setdefault((r.stage, r.replica), []).append(r.rank)
    replicas = [{"stage": s.index, "replica": j, "gpu_type": rep.gpu_type, "devices": list(rep.devices),
                 "ranks": slots[(s.index, j)]} for s in plan.stages for j, rep in enumerate(s.replicas)]
    steps = []
    for i, t in enumerate(step_time_s):
        rows = []
        for rp in replicas:
            recs = [per_rank[rk][i] for rk in rp["ranks"]]
            row = {"stage": rp["stage"], "replica": rp["replica"], "share": recs[0]["share"]}
            row.update({f: max(rec[f] for rec in recs) for f in FIELDS})
            row["compute_s"] = max(rec["forward_s"] + rec["backward_s"] - rec["recv_wait_s"] for rec in recs)
            rows.append(row)
        steps.append({"step": i, "step_time_s": t, "replicas": rows})
    return {"schema": SCHEMA_ID, "plan_sha256": plan_sha256(plan),
            "micro_batch_size": plan.micro_batch_size, "num_micro_batches": plan.num_micro_batches,
            "dynamic_batching": dynamic, "trained": trained, "replicas": replicas, "steps": steps}


@dataclass(frozen=True)
class ReplicaTimes:
    """One replica's measured steps: the shares it took and its compute / sync times."""

    stage: int
    replica: int
    shares: tuple[int, ...]
    compute_s: tuple[float, ...]
    sync_wait_s: tuple[float, ...]


def load(path: str, plan) -> tuple[dict, dict[tuple[int, int], ReplicaTimes]]:
    """Read and check a measurements file against ``plan``; every problem is an ``InputError``
    naming the file and field. Returns the document and each replica's times."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"{path}: no such measurements file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        # a binary or non-UTF-8 file is a bad input like a truncated one, not a planner bug
        raise InputError(f"{path}: not a readable JSON measurements file ({exc})") from None

    def bad(field: str, why: str):
        return InputError(f"{path}: {field}: {why}")

    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA_ID:
        raise bad("schema", f"must be {SCHEMA_ID!r} (a file written by `planner run --measurements`)")
    if doc.get("plan_sha256") != plan_sha256(plan):
        raise bad("plan_sha256", "these measurements are of another plan (its sha256 differs from "
                  "this plan's); measure this plan with `planner run PLAN --measurements FILE`")
    steps = doc.get("steps")
    if not isinstance(steps, list) or not steps:
        raise bad("steps", "must be a non-empty list of measured steps")
    want = {(s.index, j) for s in plan.stages for j in range(len(s.replicas))}
    out: dict[tuple[int, int], dict[str, list]] = {k: {"shares": [], "compute_s": [], "sync_wait_s": []}
                                                   for k in want}
    for i, step in enumerate(steps):
        rows = step.get("replicas") if isinstance(step, dict) else None
        if not isinstance(rows, list):
            raise bad(f"steps[{i}].replicas", "must be a list")
        t = step.get("step_time_s")
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
            raise bad(f"steps[{i}].step_time_s", f"must be a positive number of seconds, got {t!r}")
        seen = set()
        for k, row in enumerate(rows):
            where = f"steps[{i}].replicas[{k}]"
            key = (row.get("stage"), row.get("replica")) if isinstance(row, dict) else None
            if key not in want:
                raise bad(where, f"stage/replica {key} is not in the plan")
            seen.add(key)
            share = row.get("share")
            if not isinstance(share, int) or share < 1:
                raise bad(f"{where}.share", f"must be a positive whole number of sequences, got {share!r}")
            for f in ("compute_s", "sync_wait_s"):
                v = row.get(f)
                ok = isinstance(v, (int, float)) and math.isfinite(v)
                if not ok or (f == "compute_s" and v <= 0) or v < 0:
                    need = "positive" if f == "compute_s" else "zero or positive"
                    raise bad(f"{where}.{f}", f"must be a {need} number of seconds, got {v!r}")
            out[key]["shares"].append(share)
            out[key]["compute_s"].append(float(row["compute_s"]))
            out[key]["sync_wait_s"].append(float(row["sync_wait_s"]))
        missing = sorted(want - seen)
        if missing:
            raise bad(f"steps[{i}].replicas", "no measurement of stage/replica "
                      + ", ".join(f"{s}/{r}" for s, r in missing))
    times = {k: ReplicaTimes(k[0], k[1], tuple(v["shares"]), tuple(v["compute_s"]), tuple(v["sync_wait_s"]))
             for k, v in out.items()}
    return doc, times
