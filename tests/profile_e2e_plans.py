"""Hand-built plans of the CPU end-to-end check (docs/profiles.md), shared by its test and its
report script; the search is not needed to lay out these few devices."""

from __future__ import annotations

from pathlib import Path

from planner.plan import Plan
from planner.spec import load_model

ROOT = Path(__file__).resolve().parents[1]
MODEL_FILE = ROOT / "profiles" / "models" / "cpu-small.yaml"
PROFILE_FILE = ROOT / "profiles" / "cpu-small.yaml"
SEQ_LEN = 128


def _plan(stages: list[dict], micro_batch_size: int, num_micro_batches: int,
          cluster: str, schedule: str = "1f1b") -> Plan:
    model = load_model(MODEL_FILE).to_mapping()
    return Plan.from_json({
        "schema": "planner.plan/v1",
        "inputs": {"cluster": cluster, "model": model,
                   # bf16 is what the cost model knows; it sets 4-byte (fp32) gradients, as the
                   # runner's float32 training has.
                   "training": {"global_batch_size": micro_batch_size * num_micro_batches,
                                "seq_len": SEQ_LEN, "precision": "bf16"}},
        "micro_batch_size": micro_batch_size, "num_micro_batches": num_micro_batches,
        "schedule": schedule, "stages": stages})


def _stage(i: int, blocks: tuple[int, int], last: bool, replicas: list[tuple[str, int]]) -> dict:
    return {"index": i, "blocks": list(blocks), "embedding": i == 0, "head": last,
            "replicas": [{"gpu_type": "cpu", "tp": 1, "micro_batch_share": share,
                          "devices": [dev]} for dev, share in replicas]}


def pipeline_plan(num_stages: int, micro_batch_size: int = 2, num_micro_batches: int = 4,
                  cluster: str = "cpu-local") -> Plan:
    """``num_stages`` stages of 4/num_stages blocks, one process each."""
    per = 4 // num_stages
    stages = [_stage(i, (i * per, (i + 1) * per), i == num_stages - 1, [(f"cpu:{i}", micro_batch_size)])
              for i in range(num_stages)]
    return _plan(stages, micro_batch_size, num_micro_batches, cluster)


def data_parallel_plan(num_stages: int, replicas: int, micro_batch_size: int = 2,
                       num_micro_batches: int = 4, cluster: str = "cpu-local") -> Plan:
    """``num_stages`` stages, each with ``replicas`` single-process replicas sharing equally."""
    per = 4 // num_stages
    share = micro_batch_size // replicas
    stages = []
    for i in range(num_stages):
        devs = [(f"cpu:{i * replicas + j}", share) for j in range(replicas)]
        stages.append(_stage(i, (i * per, (i + 1) * per), i == num_stages - 1, devs))
    return _plan(stages, micro_batch_size, num_micro_batches, cluster)
