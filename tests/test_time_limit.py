"""``plan --time-limit`` is honoured within one second on the largest bench scenario
(planner.bench scenario c: 16,384 H100/A100/V100 GPUs in three zones, GPT-3 175B): the
command, from reading the cluster to the written plan, not only the search (issue 19)."""

from __future__ import annotations

import importlib
import json
import time

import pytest
import yaml

from planner.bench import scenarios
from planner.cli.main import main
from planner.plan.schema import validate_plan_json

SLACK_S = 1.0


@pytest.mark.slow
@pytest.mark.parametrize("limit_s", [5.0, 12.0])
def test_time_limit_is_honoured_on_the_largest_bench_scenario(tmp_path, capsys, limit_s):
    sc = max(scenarios(smoke=False), key=lambda s: sum(n.get("count", 1) * n["gpus_per_node"]
                                                       for n in s.cluster["nodes"]))
    spec = tmp_path / "cluster.yaml"
    spec.write_text(yaml.safe_dump(sc.cluster))
    out = tmp_path / "plan.json"
    args = ["plan", str(spec), "--model", sc.model, "--global-batch-size", str(sc.global_batch_size),
            "--seq-len", str(sc.seq_len), "--precision", sc.precision, "--time-limit", str(limit_s),
            "-o", str(out), "--quiet"]
    for module in ("planner.cost", "planner.search"):   # imports are not the command's work
        importlib.import_module(module)
    t0 = time.monotonic()
    code = main(args)
    wall_s = time.monotonic() - t0
    err = capsys.readouterr().err
    assert wall_s <= limit_s + SLACK_S, f"{wall_s:.2f} s for --time-limit {limit_s}"
    # within the limit the search may find no plan yet (exit 1, saying so) or a plan (exit 0)
    assert code in (0, 1), err
    if code == 1:
        assert "no plan found within the time limit" in err
    else:
        validate_plan_json(json.loads(out.read_text()))


# Six node classes in four zones: 9,810 knob tuples.  The cost objectives price a floor for each
# ranked tuple before the search proper; that pass ignored the deadline and took 34 s here, so
# `--objective cost --time-limit 3` answered after 28 s (scripts/fuzz_plans.py found it).
SIX_CLASSES = """\
name: six-classes
zones:
  - {name: z0, region: r0}
  - {name: z1, region: r0}
  - {name: z2, region: r1}
  - {name: z3, region: r2}
nodes:
  - {name: h, count: 64, zone: z0, gpu: H100-SXM5-80GB, gpus_per_node: 8, network_bandwidth: 3200 Gbit/s}
  - {name: a, count: 48, zone: z1, gpu: A100-SXM4-40GB, gpus_per_node: 8, network_bandwidth: 400 Gbit/s}
  - {name: l, count: 40, zone: z2, gpu: L40S-48GB, gpus_per_node: 4, network_bandwidth: 200 Gbit/s}
  - {name: t, count: 30, zone: z3, gpu: T4-16GB, gpus_per_node: 1, network_bandwidth: 50 Gbit/s}
  - {name: g, count: 7, zone: z3, gpu: GH200-96GB, gpus_per_node: 1, network_bandwidth: 200 Gbit/s}
  - {name: m, count: 5, zone: z2, gpu: MI300X-192GB, gpus_per_node: 8, network_bandwidth: 400 Gbit/s}
links:
  - {between: [z0, z1], bandwidth: 100 Gbit/s, latency: 1 ms}
  - {between: [r0, r1], bandwidth: 10 Gbit/s, latency: 30 ms}
  - {between: [r0, r2], bandwidth: 5 Gbit/s, latency: 60 ms}
  - {between: [r1, r2], bandwidth: 5 Gbit/s, latency: 40 ms}
"""


@pytest.mark.parametrize("objective", [["--objective", "cost"], ["--budget-usd-per-hour", "500"],
                                       ["--min-tokens-per-s", "1000"]])
def test_time_limit_is_honoured_by_the_cost_objectives(tmp_path, capsys, objective):
    spec = tmp_path / "cluster.yaml"
    spec.write_text(SIX_CLASSES)
    out = tmp_path / "plan.json"
    limit_s = 2.0
    for module in ("planner.cost", "planner.search"):   # imports are not the command's work
        importlib.import_module(module)
    t0 = time.monotonic()
    code = main(["plan", str(spec), "--model", "llama3-70b", "--global-batch-size", "512", "--seq-len", "4096",
                 "--time-limit", str(limit_s), "-o", str(out), "--quiet", *objective])
    wall_s = time.monotonic() - t0
    err = capsys.readouterr().err
    assert wall_s <= limit_s + SLACK_S, f"{wall_s:.2f} s for --time-limit {limit_s}"
    assert code in (0, 1), err
    assert code == 0 or ("no plan found within the time limit" in err and not out.exists())
