"""Prediction error of the cost model on every measured set (prints the table).

Calibration sets: vtrain-single (A100), megatron-core-h100 (H100).  Predicted without any
fitting: vtrain-multi, sailor (GH200 and the mixed RTX cluster).  The bounds are the levels
reached, rounded up a little; a change that makes a set worse fails here.
`python -m planner.cost.fidelity` (or `make fidelity`) prints the same table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not (Path(__file__).parent / "fidelity" / "rows.py").exists(),
                                reason="fidelity sets not present")

# MAPE bounds (fraction), the level reached rounded up; see the module docstring.
BOUNDS = {
    "vtrain-single": 0.08,
    "megatron-core-h100": 0.07,
    "vtrain-multi": 0.105,
    "sailor/GH200": 0.43,
    "sailor/MIT-mixed": 0.71,
}


@pytest.fixture(scope="module")
def table():
    from planner.cost.fidelity import fidelity_table
    return fidelity_table()


def test_fidelity_table_prints_and_meets_bounds(table, capsys):
    from planner.cost.fidelity import format_table
    with capsys.disabled():
        print("\n" + format_table(table))
    by_name = {s.name: s for s in table}
    assert by_name["vtrain-single"].rows == 1440 and by_name["sailor"].rows == 36
    for name, bound in BOUNDS.items():
        assert by_name[name].mape <= bound, f"{name}: MAPE {by_name[name].mape:.3f} > {bound}"
        assert by_name[name].median_ape <= by_name[name].mape * 1.5


def test_every_row_is_predicted_finite(table):
    for s in table:
        assert s.rows > 0 and 0 <= s.mape < 10 and s.worst_id
