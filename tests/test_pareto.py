"""``planner pareto``: the plans on the front of USD/hour against tokens/s (issue 19)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from planner.cli.main import main
from planner.pareto import FrontPoint, non_dominated

JOB = ["pareto", "cluster_specs/tiny-2zone.yaml", "--model", "opt-350m", "--global-batch-size", "8",
       "--seq-len", "256", "--time-limit", "60"]


def _p(tps: float, usd: float) -> FrontPoint:
    return FrontPoint(tps, usd, "x", "optimal", 0.0, SimpleNamespace())


def test_non_dominated_keeps_the_front_once_sorted_by_speed():
    pts = [_p(10, 5), _p(20, 9), _p(15, 9), _p(20, 9), _p(5, 6), _p(30, 20), _p(25, 25)]
    front = non_dominated(pts)
    assert [(p.tokens_per_s, p.usd_per_hour) for p in front] == [(10, 5), (20, 9), (30, 20)]


def test_the_front_is_a_table_json_and_a_picture(tmp_path, capsys):
    # into a folder that does not exist yet: created, as plan -o does (it failed after the
    # searches, throwing the front away)
    picture = tmp_path / "figures" / "front.png"
    assert main([*JOB, "--json", "--plot", str(picture)]) == 0
    points = json.loads(capsys.readouterr().out)
    assert len(points) >= 2
    speeds = [p["tokens_per_s"] for p in points]
    prices = [p["usd_per_hour"] for p in points]
    assert speeds == sorted(speeds) and prices == sorted(prices)     # faster costs more on a front
    assert points[0]["objective"] == "cost" and points[-1]["objective"] == "throughput"
    for p in points:    # each point is its plan's own prediction
        assert p["plan"]["predicted"]["tokens_per_s"] == p["tokens_per_s"]
        assert p["plan"]["predicted"]["usd_per_hour"] == p["usd_per_hour"]
    import matplotlib.image

    image = matplotlib.image.imread(picture)
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.shape[0] > 100 and image.shape[1] > 100
    assert main(JOB) == 0
    out = capsys.readouterr().out
    assert "Plans on the front" in out and "throughput" in out and "cost" in out


def test_help_tells_the_rows_order_the_table_prints(capsys):
    # the rows are sorted by tokens/s (non_dominated); help said "from the cheapest per token",
    # which a time-limited cost search need not be
    assert main(["pareto", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "by tokens/s: the slowest" in text and "the fastest last" in text
    assert "cheapest per token to the fastest" not in text


@pytest.mark.parametrize("extra, needle", [(["--floors", "-1"], "--floors must be between"),
                                           (["--plot", "front.jpg"], "must end in .png or .svg"),
                                           (["--time-limit", "0"], "time limit")])
def test_bad_flags_exit_2(extra, needle, capsys, tmp_path):
    extra = [str(tmp_path / e) if e.endswith(".jpg") else e for e in extra]
    assert main([*JOB, *extra]) == 2
    assert needle in capsys.readouterr().err


def test_pareto_takes_the_elementwise_flag_under_the_training_file_rule(tmp_path, capsys):
    t = tmp_path / "t.yaml"
    t.write_text("global_batch_size: 8\nseq_len: 256\n")
    job = ["pareto", "cluster_specs/tiny-2zone.yaml", "--model", "opt-350m", "--training", str(t)]
    assert main([*job, "--elementwise", "eager"]) == 2
    assert "--elementwise eager contradicts elementwise: fused" in capsys.readouterr().err


def test_an_unpriced_cluster_is_refused_naming_its_groups(tmp_path, capsys):
    # the front said "a node the plan uses has none"; the spec's groups without a price are named,
    # at the group's line and column (a sweep found this the one input error without them)
    spec = tmp_path / "c.yaml"
    spec.write_text("name: c\nnodes:\n  - {name: amd, gpu: MI250X-128GB, gpus_per_node: 2, "
                    "network_bandwidth: 100 Gbit/s}\n")
    assert main(["pareto", str(spec), "--model", "opt-350m", "--global-batch-size", "8", "--seq-len", "256",
                 "--time-limit", "6"]) == 2
    assert f"{spec}:3:5: nodes[0].price_per_hour: the Pareto front needs prices, but nodes[0] (amd, MI250X-128GB)" \
        in capsys.readouterr().err
