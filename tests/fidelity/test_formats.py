"""The fidelity sets: every measured row is a valid cluster spec plus a valid plan.

These tests read only the committed files under tests/fidelity/<set>/; the last one also
regenerates them from shared/reference when that folder is present and checks they are current.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from planner.plan import Plan
from planner.spec import load_cluster

from .rows import EXPECTED_COUNTS, HERE, SETS, build_plan, load_set, read_rows_yaml

# The only rows the plan format cannot hold: vTrain multi-node runs with tensor parallelism 16
# across two 8-GPU nodes (a replica is tp GPUs inside one node, DESIGN §3).
EXPECTED_UNEXPRESSIBLE = {"vtrain-multi": {"vtrain-multi-021", "vtrain-multi-022", "vtrain-multi-023",
                                           "vtrain-multi-024", "vtrain-multi-025", "vtrain-multi-039"},
                          # every torchtitan row but the FSDP ones of Tables 1 and 3 without Float8
                          # (eager, and torch.compile as elementwise: fused) uses Float8
                          "torchtitan-h100": {f"torchtitan-t{t}" for t in (
                              "1-llama3-8b-8gpu-cp1-compile-float8",
                              "2-llama3-8b-8gpu-cp1-compile-float8", "2-llama3-8b-8gpu-cp2-compile-float8",
                              "2-llama3-8b-8gpu-cp4-compile-float8", "2-llama3-8b-8gpu-cp8-compile-float8",
                              "3-llama3-8b-128gpu-cp1-compile-float8",
                              "4-llama3-70b-256gpu-cp1-compile-float8",
                              "4-llama3-70b-256gpu-cp1-compile-float8-async-tp",
                              "5-llama3-405b-512gpu-cp1-1f1b-compile-float8-async-tp",
                              "5-llama3-405b-512gpu-cp1-interleaved-1f1b-compile-float8-async-tp",
                              "6-llama3-405b-512gpu-cp1-1f1b-compile-float8-async-tp",
                              "6-llama3-405b-512gpu-cp2-1f1b-compile-float8-async-tp",
                              "6-llama3-405b-512gpu-cp4-1f1b-compile-float8-async-tp",
                              "6-llama3-405b-512gpu-cp8-1f1b-compile-float8-async-tp")}}


_LOADED: dict[str, list] = {}


def _rows(name: str) -> list:
    if name not in _LOADED:
        _LOADED[name] = load_set(name)
    return _LOADED[name]


@pytest.fixture(scope="module", params=SETS)
def fidelity_set(request):
    return request.param, _rows(request.param)


def test_counts_and_ids(fidelity_set):
    name, rows = fidelity_set
    assert len(rows) == EXPECTED_COUNTS[name]
    assert len({r.id for r in rows}) == len(rows)
    assert [r.source_index for r in rows] == list(range(len(rows)))
    assert all(r.measured_iteration_time_s > 0 for r in rows)


def test_unexpressible_rows_are_the_known_ones(fidelity_set):
    name, rows = fidelity_set
    missing = {r.id for r in rows if r.plan is None}
    assert missing == EXPECTED_UNEXPRESSIBLE.get(name, set())
    assert all(r.unexpressible for r in rows if r.plan is None)
    if name != "vtrain-single":  # (that one would rebuild 1440 plans)
        assert len(load_set(name, expressible_only=True)) == len(rows) - len(missing)


def test_clusters_load(fidelity_set):
    _, rows = fidelity_set
    for path in sorted({r.cluster_path for r in rows}):
        cluster = load_cluster(path)
        assert cluster.num_gpus > 0


@cache
def _cluster(path: Path):
    return load_cluster(path)


def _check_plan(plan: Plan, cluster) -> None:
    used = Counter(plan.devices())
    twice = [d for d, n in used.items() if n > 1]
    assert not twice, f"devices used twice: {twice[:5]}"
    for stage in plan.stages:
        assert sum(r.micro_batch_share for r in stage.replicas) == plan.micro_batch_size
        for rep in stage.replicas:
            assert len(rep.devices) == rep.tp
            assert len({d.rpartition(":")[0] for d in rep.devices}) == 1, "a replica spans nodes"
            node = cluster.node_by_name.get(rep.node)
            assert node is not None, f"unknown node {rep.node}"
            assert node.gpu.name == rep.gpu_type
            local = set(node.device_ids())
            for d in rep.devices:
                assert d in local, f"{d} is not a device of {node.name}"
    training = plan.inputs.training
    assert plan.micro_batch_size * plan.num_micro_batches == training["global_batch_size"]
    # Stages hold contiguous blocks covering the model, embedding first and head last.
    num_layers = plan.inputs.model["num_layers"]
    edges = [b for s in plan.stages for b in s.blocks]
    assert edges[0] == 0 and edges[-1] == num_layers
    assert all(edges[i] == edges[i + 1] for i in range(1, len(edges) - 1, 2))
    assert [s.index for s in plan.stages] == list(range(plan.num_stages))
    assert [s.embedding for s in plan.stages] == [i == 0 for i in range(plan.num_stages)]
    assert [s.head for s in plan.stages] == [i == plan.num_stages - 1 for i in range(plan.num_stages)]
    assert plan.inputs.cluster == cluster.name
    assert plan.inputs.cluster_sha256 == cluster.sha256()


def test_plans_fit_their_clusters(fidelity_set):
    name, rows = fidelity_set
    for row in rows:
        if row.plan is None:
            continue
        cluster = _cluster(row.cluster_path)
        try:
            _check_plan(row.plan, cluster)
        except AssertionError as exc:
            raise AssertionError(f"{name} {row.id}: {exc}") from None


def test_plan_files_are_canonical_and_match_the_builder(fidelity_set):
    name, rows = fidelity_set
    doc = read_rows_yaml(name)
    with_files = [r for r in rows if r.plan_path is not None]
    if name == "vtrain-single":
        assert not with_files  # the compact form: plans are built in memory
        return
    assert len(with_files) == sum(r.plan is not None for r in rows)
    for row in with_files:
        text = row.plan_path.read_text(encoding="utf-8")
        assert Plan.from_json(json.loads(text)).dumps() == text, row.id
        cluster = _cluster(row.cluster_path)
        assert build_plan(doc["kind"], row.config, doc, cluster).dumps() == text, row.id
    on_disk = {p.name for p in (HERE / name / "plans").glob("*.json")}
    assert on_disk == {r.plan_path.name for r in with_files}


def test_plans_pass_the_schema_and_check_plan(fidelity_set):
    """The plan package's own checks: JSON Schema on every file, cross-checks on every plan."""
    from planner.plan.check import check_plan, load_plan
    from planner.plan.schema import validate_plan_json

    _, rows = fidelity_set
    for i, row in enumerate(rows):
        if row.plan is None:
            continue
        if row.plan_path is not None:
            validate_plan_json(json.loads(row.plan_path.read_text(encoding="utf-8")), str(row.plan_path))
            assert load_plan(row.plan_path) == row.plan
        elif i % 10 == 0:
            # vtrain-single's 1440 in-memory plans come from the builder that wrote the other
            # sets' files; the schema (slow) sees every tenth of them, check_plan sees all.
            validate_plan_json(row.plan.to_json(), row.id)
        cluster = _cluster(row.cluster_path)
        check_plan(cluster, row.plan, file=row.id)


def test_set_conventions():
    single = _rows("vtrain-single")
    assert {r.plan.recompute for r in single} == {"full"}
    assert {r.plan.inputs.training["precision"] for r in single} == {"fp16"}
    mcore = _rows("megatron-core-h100")
    for r in mcore:
        tp = r.plan.stages[0].replicas[0].tp
        assert r.plan.sequence_parallel == (tp > 1)
        assert r.plan.zero_stage == 1 and r.plan.inputs.training["precision"] == "bf16"
        assert r.extras["iteration_time_derived"] is True
    sailor = {r.id: r for r in _rows("sailor")}
    assert len([r for r in sailor.values() if r.id.startswith("mit-")]) == 9
    # Sailor's layers_per_stage count the embedding and the head as layers.
    r = sailor["clariden-gpt-neo-N64-D8"]
    assert [s.num_blocks for s in r.plan.stages] == [2, 5, 5, 5, 4, 4, 4, 3]
    assert all("measured_max_mem_bytes" in x.extras and "measured_grad_reduce_s" in x.extras
               for x in sailor.values())
    # Heterogeneous replicas of one stage keep their own GPU types.
    mixed = sailor["mit-opt-350-N6-D3"].plan.stages[1].replicas
    assert [x.gpu_type for x in mixed] == ["TITANRTX-24GB", "RTX2080TI-11GB", "TITANRTX-24GB"]


def test_mit_clusters_put_each_gpu_type_in_its_own_zone():
    for path in sorted((HERE / "sailor" / "clusters").glob("mit-*.yaml")):
        cluster = load_cluster(path)
        zone_types = {}
        for node in cluster.node_list:
            zone_types.setdefault(node.zone, set()).add(node.gpu.name)
        assert all(len(t) == 1 for t in zone_types.values())
        zones = sorted(zone_types)
        for i, a in enumerate(zones):
            for b in zones[i + 1:]:
                link = cluster.link(a, b)
                assert link is not None and link.bandwidth_Bps < 2e8  # ~0.92 Gbit/s measured


def _reference_dir() -> Path:
    return Path(os.environ.get("PLANNER_REFERENCE_DIR", "/work/shared/reference"))


@pytest.mark.skipif(not (_reference_dir() / "sailor_validation_measured.yaml").exists(),
                    reason="shared/reference is not available")
def test_generated_files_are_current(tmp_path):
    import subprocess
    import sys
    subprocess.run([sys.executable, str(HERE / "generate.py"), str(_reference_dir()), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    for name in SETS:
        fresh = sorted(p.relative_to(tmp_path) for p in (tmp_path / name).rglob("*") if p.is_file())
        committed = sorted(p.relative_to(HERE) for p in (HERE / name).rglob("*") if p.is_file())
        assert fresh == committed, f"{name}: run tests/fidelity/generate.py"
        for rel in fresh:
            assert (tmp_path / rel).read_bytes() == (HERE / rel).read_bytes(), \
                f"{rel} is stale: run tests/fidelity/generate.py"
