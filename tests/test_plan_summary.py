"""What `planner plan` shows a user: egress beside the total with a warning above a fifth of
the cost, a tokens/s floor alone selecting its objective, tables whole at 80 columns piped
(issue 19, "What a user sees")."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from planner.cli.main import main
from planner.cli.plan import EGRESS_WARN_SHARE, budget_warning, cost_text, egress_warning
from planner.search.objectives import ObjectiveSpec

CLUSTER = "cluster_specs/tiny-2gpu.yaml"
BASE = ["plan", CLUSTER, "--model", "opt-350m", "--global-batch-size", "4", "--seq-len", "256",
        "--time-limit", "60"]


def _ev(total: float | None, egress: float) -> SimpleNamespace:
    return SimpleNamespace(usd_per_hour=total, egress_usd_per_hour=egress, usd_per_million_tokens=0.5)


def test_egress_is_shown_beside_the_total_with_its_share():
    assert cost_text(_ev(10.0, 0.0)) == ", 10.00 USD/hour, 0.5000 USD per million tokens"
    assert cost_text(_ev(10.0, 1.5)) == ", 10.00 USD/hour (1.50 of it egress, 15%), 0.5000 USD per million tokens"
    assert "cost unknown" in cost_text(_ev(None, 0.0))


@pytest.mark.parametrize("egress, warned", [(1.5, False), (2.0, False), (2.01, True), (6.0, True)])
def test_egress_over_a_fifth_of_the_cost_is_a_warning(egress, warned):
    assert EGRESS_WARN_SHARE == 0.2
    text = egress_warning(_ev(10.0, egress))
    assert (text is not None) == warned
    if warned:
        assert text.startswith("warning: egress is") and f"{egress:,.2f} of 10.00 USD/hour" in text
    assert egress_warning(_ev(None, egress)) is None


def test_a_plan_over_its_budget_with_egress_is_a_warning():
    """The search holds node rent to the budget; egress can take the plan over it."""
    budget = ObjectiveSpec(kind="throughput-under-budget", budget_usd_per_hour=40.0)
    text = budget_warning(_ev(86.39, 47.39), budget)
    assert text.startswith("warning: this plan costs 86.39 USD/hour, over the budget of 40.00")
    assert "node rent to the budget (39.00 here)" in text and "egress (47.39" in text
    assert budget_warning(_ev(40.0, 5.0), budget) is None          # at the budget, egress included
    assert budget_warning(_ev(86.39, 47.39), ObjectiveSpec()) is None     # no budget asked
    assert budget_warning(_ev(None, 0.0), budget) is None


TWO_ZONES_EGRESS = """name: twoz
zones:
  - {name: za, region: r1}
  - {name: zb, region: r2}
nodes:
  - {name: a, count: 2, zone: za, gpu: A100-SXM4-80GB, gpus_per_node: 4, network_bandwidth: 100 Gbit/s, price_per_hour: 14}
  - {name: b, count: 2, zone: zb, gpu: A100-SXM4-40GB, gpus_per_node: 4, network_bandwidth: 100 Gbit/s, price_per_hour: 11}
links:
  - {between: [za, zb], bandwidth: 25 Gbit/s, latency: 10 ms, egress_price_per_gb: 0.02}
"""


def test_a_budget_answer_over_budget_through_egress_says_so(capsys, tmp_path):
    """A metamorphic sweep's case: under a budget of 40 USD/hour the answer pipelines across
    the priced zone link, 39 USD/hour of rent and 47 of egress; the run says it is over."""
    cluster = tmp_path / "twoz.yaml"
    cluster.write_text(TWO_ZONES_EGRESS)
    args = ["plan", str(cluster), "--model", "llama3-8b", "--global-batch-size", "64", "--seq-len", "2048",
            "--time-limit", "30", "--json", "--quiet"]
    assert main([*args, "--budget-usd-per-hour", "40"]) == 0
    captured = capsys.readouterr()
    plan = json.loads(captured.out)
    assert plan["predicted"]["usd_per_hour"] > 40.0, "the case no longer goes over: find another"
    assert "over the budget of 40.00" in captured.err


def test_a_tokens_per_s_floor_alone_selects_cost_above_floor(capsys):
    assert main([*BASE, "--min-tokens-per-s", "1000", "--json", "--quiet"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["objective"] == {"kind": "cost-above-floor", "min_tokens_per_s": 1000.0}
    assert plan["predicted"]["tokens_per_s"] >= 1000.0
    # a contradiction is still refused, as a budget with --objective cost is
    assert main([*BASE, "--objective", "throughput", "--min-tokens-per-s", "1000"]) == 2
    assert "tokens/s floor goes with the cost objective" in capsys.readouterr().err


NAMES = ["us-central1-a", "us-west1-b", "us-east4-c", "H100-SXM5-80GB", "A100-SXM4-40GB", "L40S-48GB"]


def test_tables_piped_keep_every_name_whole(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["validate", "cluster_specs/three-zone.yaml"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    for name in NAMES:
        assert name in out, name


@pytest.mark.parametrize("spec", ["three-zone.yaml", "tiny-2zone.yaml", "lab-mixed.yaml"])
def test_tables_at_80_columns_cut_nothing(capsys, monkeypatch, spec):
    """An 80-column terminal: every line fits, no cell ends in "…", no column is dropped,
    and each GPU type and zone name is whole on one line (three-zone's are too long to fit
    beside the numbers: they fold, and still nothing is cut)."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["validate", f"cluster_specs/{spec}"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in out
    for header in ("zone", "GPU type", "USD/h"):
        assert header in out
    from planner.spec import load_cluster
    cluster = load_cluster(f"cluster_specs/{spec}")
    names = {g.gpu.name for g in cluster.nodes} | set(cluster.zone_names)
    for name in names:
        assert any(name in line for line in lines), name


def test_a_terminal_gets_a_live_line_with_the_time_left():
    """No silent stretch: on a terminal the line below the messages is redrawn four times a
    second with the time spent and left and the last message; piped, the messages alone."""
    import io
    import time

    from rich.console import Console

    from planner.cli.progress import SearchStatus

    for terminal in (True, False):
        buf = io.StringIO()
        with SearchStatus(Console(file=buf, force_terminal=terminal, width=120), 10) as status:
            status.message("warm start p=1: 5.1 s")
            time.sleep(0.8)
        out = buf.getvalue()
        assert "warm start p=1: 5.1 s" in out
        redraws = out.count("s of 10 s left; warm start p=1: 5.1 s")
        assert (redraws >= 2) if terminal else (redraws == 0), out


def test_catalog_default_prices_are_marked_with_their_source(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(BASE) == 0
    out = capsys.readouterr().out
    assert ("price: A100-SXM4-80GB at the catalog default 3.43 USD per GPU-hour (AWS p4de.24xlarge "
            "on-demand, us-east-1, list price of 2026-08-26); set price_per_hour") in out
    own = tmp_path / "c.yaml"
    own.write_text(Path(CLUSTER).read_text().replace("gpus_per_node: 2", "gpus_per_node: 2\n    price_per_hour: 7.5"))
    assert main(["plan", str(own), *BASE[2:]]) == 0
    out = capsys.readouterr().out
    assert "catalog default" not in out and "7.50 USD/hour" in out


def test_a_default_price_note_names_cloud_instance_region_and_date_not_the_url():
    """The note reads the catalog's source format back; a source in any other form (a figure
    not re-verified, a user's own text) is shown whole, so nothing is dropped."""
    from planner.cli.prices import price_source_text

    source = ("Azure Standard_NC96ads_A100_v4 on-demand 19.108 / 4 GPUs, eastus, "
              "https://example.org/prices.json, 2026-11-09; Linux")
    assert price_source_text(source) == ("Azure Standard_NC96ads_A100_v4 on-demand, eastus, "
                                         "list price of 2026-11-09")
    undated = source.replace("2026-11-09; Linux", "date not stated")
    assert price_source_text(undated).endswith("eastus, date not stated")
    other = "not re-verified: RunPod RTX 3090 ~0.43 USD/h, recalled"
    assert price_source_text(other) == other


@pytest.mark.parametrize("gpu", [
    # a GPU of the user's own (the sweep's B200 at 9.5 USD per GPU-hour)
    ("{name: MyGPU, memory: 80 GB, peak_tflops: 312, memory_bandwidth: 2039 GB/s, "
     "intra_node_bandwidth: 300 GB/s, price_per_hour: 9.5}"),
    # the catalog's A100 written out inline at the catalog's own price: still what the user wrote
    ("{name: A100-SXM4-80GB, memory: 80 GB, peak_tflops: 312, memory_bandwidth: 2039 GB/s, "
     "intra_node_bandwidth: 300 GB/s, price_per_hour: 3.4309}"),
])
def test_a_price_on_an_inline_gpu_is_the_users_not_a_catalog_default(tmp_path, capsys, monkeypatch, gpu):
    monkeypatch.delenv("COLUMNS", raising=False)
    own = tmp_path / "c.yaml"
    own.write_text(Path(CLUSTER).read_text().replace("gpu: A100-SXM4-80GB", f"gpu: {gpu}"))
    assert main(["plan", str(own), *BASE[2:]]) == 0
    out = capsys.readouterr().out
    price = 2 * float(gpu.rpartition("price_per_hour: ")[2].rstrip("}"))
    assert "catalog default" not in out and f"{price:.2f} USD/hour" in out


def test_stage_devices_range_from_the_first_node_to_the_last_in_numeric_order():
    """A stage's nodes h-96 … h-191 were shown as "h-100 … h-99" (string order)."""
    from planner.cli.plan import node_order

    names = [f"h-{i}" for i in range(96, 192)]
    assert sorted(sorted(names), key=node_order) == names       # from string order, h-100 first
    assert sorted(["dgx-10", "dgx-9", "dgx-15", "dgx-0"], key=node_order) == ["dgx-0", "dgx-9", "dgx-10", "dgx-15"]
    # names without digits, or with several runs of them, keep a total order
    assert sorted(["b", "a-2-10", "a-2-9", "a-10-1", "a"], key=node_order) == ["a", "a-2-9", "a-2-10", "a-10-1", "b"]
    assert sorted(["h-01", "h-1"], key=node_order) == sorted(["h-1", "h-01"], key=node_order)


def test_the_summary_shows_each_stage_from_its_lowest_node_to_its_highest(capsys, monkeypatch):
    """dgx-a100-pod's GPT-3 plan puts stages on several of its 16 nodes dgx-0 … dgx-15: each
    range runs from the lowest to the highest (string order ended one at dgx-9, below dgx-10)."""
    import re

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plan", "cluster_specs/dgx-a100-pod.yaml", "--model", "gpt3-175b", "--global-batch-size",
                 "1536", "--seq-len", "2048", "--time-limit", "10"]) == 0
    ranges = re.findall(r"dgx-(\d+) … dgx-(\d+) \((\d+) nodes\)", capsys.readouterr().out)
    assert ranges
    for first, last, count in ranges:
        assert int(last) - int(first) + 1 >= int(count) > 1
