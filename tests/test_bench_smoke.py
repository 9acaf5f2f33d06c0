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
