"""The CLI is a thin layer on planner.api (DESIGN §7): it imports nothing of the package but
planner.api, planner.cli and planner.errors; calibration is a parameter of each API call."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from planner import api

ROOT = Path(__file__).parent.parent
ALLOWED = ("planner.api", "planner.cli", "planner.errors")
SMALL = ROOT / "profiles" / "models" / "cpu-small.yaml"


def planner_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import of the package in ``path``, nested ones included;
    ``from planner import x`` counts as planner.x."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "planner":
                found += [(node.lineno, f"planner.{a.name}") for a in node.names]
            elif node.module.startswith("planner."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "planner"]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and str(arg.value).startswith("planner."):
                found.append((node.lineno, arg.value))
    return found


def test_cli_imports_only_the_api():
    files = sorted((ROOT / "planner" / "cli").glob("*.py"))
    assert len(files) > 10
    bad = [f"{f.name}:{line}: {mod}" for f in files for line, mod in planner_imports(f)
           if not any(mod == ok or mod.startswith(ok + ".") for ok in ALLOWED)]
    assert bad == []


def test_the_walk_sees_every_import_form(tmp_path):
    """The checker itself: top-level, nested and ``from planner import`` forms are all caught."""
    src = tmp_path / "m.py"
    src.write_text("import planner.cost\nfrom planner import search, api\n"
                   "def f():\n    from planner.spec import load_model\n    import planner.api\n")
    assert [m for _, m in planner_imports(src)] == ["planner.cost", "planner.search", "planner.api",
                                                     "planner.spec", "planner.api"]


def test_every_api_name_resolves():
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    with pytest.raises(AttributeError):
        api.no_such_name  # noqa: B018


@pytest.fixture(scope="module")
def small_plan():
    cluster = api.load_cluster(ROOT / "cluster_specs" / "tiny-2gpu.yaml")
    result = api.plan(cluster, api.load_model(SMALL), api.Training(global_batch_size=4, seq_len=128),
                      time_limit_s=30)
    return cluster, result.plan


def slow_calibration(tmp_path) -> Path:
    from planner.cost.calibration import default_calibration

    data = default_calibration().to_mapping()
    for entry in list(data["gpus"].values()) + list(data["architectures"].values()):
        entry["matmul_ceiling"] = 0.4
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_calibration_is_a_parameter_of_each_call(small_plan, tmp_path):
    cluster, plan = small_plan
    slow = slow_calibration(tmp_path)
    shipped = api.evaluate(cluster, plan).breakdown_s["compute"]
    assert api.evaluate(cluster, plan, calibration=slow).breakdown_s["compute"] > shipped
    assert api.evaluate(cluster, plan).breakdown_s["compute"] == shipped      # not left behind
    sim = api.simulate(cluster, plan, calibration=slow)
    assert sim.evaluation.breakdown_s["compute"] > shipped
    assert api.simulate(cluster, plan).evaluation.breakdown_s["compute"] == shipped


def test_plan_takes_calibration(small_plan, tmp_path):
    cluster, _ = small_plan
    slow = slow_calibration(tmp_path)
    training = api.Training(global_batch_size=4, seq_len=128)
    fast = api.plan(cluster, api.load_model(SMALL), training, time_limit_s=30)
    slowed = api.plan(cluster, api.load_model(SMALL), training, time_limit_s=30, calibration=slow)
    assert slowed.evaluation.iteration_time_s > fast.evaluation.iteration_time_s
    assert api.evaluate(cluster, fast.plan).iteration_time_s == pytest.approx(fast.evaluation.iteration_time_s)
