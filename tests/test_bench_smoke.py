"""The bench's smoke mode runs, so `make bench` cannot rot; timing is not asserted."""

from __future__ import annotations

from planner import bench


def test_bench_smoke_prints_rows_with_numeric_gaps(capsys):
    assert bench.main(["--smoke", "--json"]) == 0
    import json
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(bench.scenarios(smoke=True))
    for row in rows:
        assert "error" not in row, row
        assert isinstance(row["gap"], float) and 0 <= row["gap"] < 1
        assert row["tokens_per_s"] > 0 and row["peak_mb"] > 0
        assert row["status"] in ("optimal", "feasible")
    table = bench.format_table(rows)
    assert table.count("\n") == len(rows) + 1 and "smoke-2zone" in table


def test_bench_profile_names_the_slowest_scenario_and_its_search(capsys):
    assert bench.main(["--smoke", "--profile"]) == 0
    out = capsys.readouterr().out
    table, _, prof = out.partition("\nprofile of ")
    assert prof and "smoke-2zone" in table, out
    name = prof.split(" (")[0]
    assert name in {s.name for s in bench.scenarios(smoke=True)}
    assert "search/solve.py" in prof and "cumulative" in prof
    assert "<module>" not in prof          # the search alone, not the imports


def test_slowest_prefers_a_missed_target():
    scs = bench.scenarios(smoke=True)
    rows = [{"met": True, "wall_median_s": 29.0}, {"met": False, "wall_median_s": 1.0}]
    assert bench._slowest(scs, rows) is scs[1]
    rows = [{"met": True, "wall_median_s": 3.0}, {"met": True, "wall_median_s": 1.0}]
    assert bench._slowest(scs, rows) is scs[0]
