"""The bench's smoke mode runs, so `make bench` cannot rot; timing is not asserted."""

from __future__ import annotations

import pytest

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
        # the answer is never slower than a baseline layout (issue 18)
        assert row["vs_best_baseline"] >= 1 - 1e-9 and row["vs_megatron"] >= row["vs_best_baseline"] - 1e-12
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


def test_bench_schedules_smoke_simulates_each_schedule_and_compares_the_choice(capsys):
    """``--schedules``: one row per schedule for the 1,024-GPU plan (every generated action
    run: the executor's pipeline time equals the closed form where it is exact, 1F1B on equal
    stages), and the scenario with and without zb-h1 (the space grows by its tuples)."""
    import json
    assert bench.main(["--smoke", "--schedules", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sim = {r["schedule"]: r for r in out["simulate"]}
    assert set(sim) == {"1f1b", "interleaved-1f1b", "zb-h1"}
    assert all(r["gpus"] == 1024 and r["micro_batches"] == 64 for r in sim.values())
    assert sim["1f1b"]["actions"] == 2 * 16 * 64 and sim["zb-h1"]["actions"] == 3 * 16 * 64
    assert abs(sim["1f1b"]["simulated_s"] - sim["1f1b"]["closed_form_s"]) <= 1e-9 * sim["1f1b"]["closed_form_s"]
    (base, with_zb), = out["choice"]
    assert "error" not in base and "error" not in with_zb
    assert int(with_zb["tuples"].split("/")[1]) > int(base["tuples"].split("/")[1])
    assert with_zb["tokens_per_s"] >= base["tokens_per_s"] * (1 - 1e-9)   # a larger space, no worse
    # the first scenario also with each V schedule: its own rows, a larger space, no worse
    assert [r["scenario"] for r in out["v_choice"]] == [base["scenario"] + " + zb-v", base["scenario"] + " + dualpipev"]
    for r in out["v_choice"]:
        assert "error" not in r and int(r["tuples"].split("/")[1]) > int(base["tuples"].split("/")[1])
        assert r["tokens_per_s"] >= base["tokens_per_s"] * (1 - 1e-9)


def test_issue_18_scenarios_hold_the_users_shapes_and_can_run_alone():
    from planner.spec import cluster_from_dict
    by_letter = {sc.name.split(":")[0]: sc for sc in bench.scenarios(smoke=False)}
    assert set(by_letter) == set("abcde")
    d, e = (cluster_from_dict(by_letter[x].cluster) for x in "de")
    assert d.num_gpus == 1200 and len({n.zone for n in d.node_list}) == 3
    assert {n.gpu.name for n in d.node_list} == {"A100-SXM4-80GB", "V100-SXM2-32GB"}
    assert by_letter["d"].model == "opt-350m" and by_letter["d"].gap_target == 0.02
    assert e.num_gpus == 16384 and len({n.zone for n in e.node_list}) == 3
    assert {n.gpu.name for n in e.node_list} == {"H100-SXM5-80GB", "A100-SXM4-80GB", "L40S-48GB"}
    assert by_letter["e"].precision == "bf16" and by_letter["e"].model == "gpt3-175b"
    assert [sc.name[0] for sc in bench.pick(bench.scenarios(smoke=False), "de")] == ["d", "e"]
    with pytest.raises(SystemExit):
        bench.pick(bench.scenarios(smoke=False), "z")
