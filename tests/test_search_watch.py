"""The live line while searching carries the best plan so far, its tokens/s, the proved bound
and gap and the time left (planner.search.watch read by planner.cli.progress); piped, none."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from planner import api
from planner.cli.progress import SearchStatus

ROOT = Path(__file__).parent.parent
CLUSTER = ROOT / "cluster_specs" / "tiny-mixed.yaml"
TRAINING = api.Training(global_batch_size=32, seq_len=1024)


def _search(terminal: bool, objective="throughput"):
    buf = io.StringIO()
    cluster = api.load_cluster(CLUSTER)
    with SearchStatus(Console(file=buf, force_terminal=terminal, width=400), 30) as status:
        assert status.watch.snapshot() is None          # nothing before the search starts
        result = api.plan(cluster, "megatron-gpt-1.7b", TRAINING, objective=objective, time_limit_s=30,
                          progress=status.message, watch=status.watch)
        # a message redraws the live line below it, now with the finished search's state
        status.message("done")
        line = status.line()
    return result, status.watch.snapshot(), buf.getvalue(), line


@pytest.fixture(scope="module")
def throughput_run():
    return _search(terminal=True)


def test_snapshot_matches_the_result(throughput_run):
    result, snap, _, _ = throughput_run
    tokens_per_s = TRAINING.global_batch_size * TRAINING.seq_len / result.evaluation.iteration_time_s
    assert snap.best_tokens_per_s == pytest.approx(tokens_per_s, rel=1e-6)
    assert snap.best_value == pytest.approx(result.evaluation.iteration_time_s, rel=1e-6)
    assert snap.bound is not None and snap.bound <= snap.best_value
    # the live bound is never above the one the report proves (the heap's least is counted too)
    assert snap.bound <= result.report.bound * (1 + 1e-9)
    assert snap.gap == pytest.approx((snap.best_value - snap.bound) / snap.best_value)
    assert snap.bound_tokens_per_s >= snap.best_tokens_per_s
    assert snap.elapsed_s > 0


def test_terminal_line_carries_the_numbers(throughput_run):
    _, snap, out, line = throughput_run
    numbers = (f"s of 30 s left; best {snap.best_tokens_per_s:,.0f} tokens/s, "
               f"bound {snap.bound_tokens_per_s:,.0f}, gap {100 * snap.gap:.2f}%; {snap.best_label}")
    assert numbers in line
    assert numbers in out           # drawn on the (fake) terminal, not only computed


def test_cost_objective_line_in_usd():
    result, snap, out, line = _search(terminal=True, objective="cost")
    assert snap.objective_kind == "cost"
    ev = result.evaluation
    per_mtoken = snap.best_value / 3600 / snap.tokens_per_iteration * 1e6
    assert per_mtoken == pytest.approx(ev.usd_per_hour / (ev.tokens_per_s * 3600) * 1e6, rel=1e-6)
    numbers = (f"best {per_mtoken:.4g} USD/Mtoken ({snap.best_usd_per_hour:,.2f} USD/h, "
               f"{snap.best_tokens_per_s:,.0f} tokens/s), bound {snap.bound / 3600 / snap.tokens_per_iteration * 1e6:.4g}")
    assert numbers in line and numbers in out


def test_piped_output_has_no_live_line():
    _, snap, out, _ = _search(terminal=False)
    assert snap.best_label is not None
    assert "s of 30 s left" not in out and "tokens/s" not in out and "gap" not in out
    assert "done" in out                                 # the messages still come
