"""planner.cost.fidelity_groups: a set's error by its rows' configuration fields."""

from __future__ import annotations

import statistics

import pytest

from planner.cost.fidelity import predict_set
from planner.cost.fidelity_groups import group_errors, main


def test_groups_partition_the_set_and_keep_its_errors():
    rows = predict_set("megatron-core-h100")
    groups = group_errors("megatron-core-h100", ["tp", "pp"])
    assert sum(g.rows for g in groups) == len(rows)
    # the rows' mean signed error is the groups' mean weighted by their rows
    weighted = sum(g.mean_signed * g.rows for g in groups) / len(rows)
    assert weighted == pytest.approx(statistics.fmean(r.signed_error for r in rows))
    assert {g.key for g in groups} >= {(1, 1), (8, 16)}      # the 1.7B and 462B rows' layouts


def test_derived_micro_batches_field():
    groups = group_errors("megatron-core-h100", ["micro_batches"])
    # 192 sequences over dp 48 at micro-batch 1: 4 micro-batches (the 1.7B to 32B rows)
    assert (4,) in {g.key for g in groups}


@pytest.mark.parametrize("argv, message", [(["megatron-core-h100", "tpx"], "no field 'tpx'"),
                                           (["nope", "tp"], "unknown set 'nope'")])
def test_bad_input_exits_2_with_the_reason(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err
