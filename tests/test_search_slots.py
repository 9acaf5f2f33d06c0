"""The per-option arrays' layouts (planner/search/slots.py): arrays and cached lines are laid
out in these orders, so they must not move."""

import pytest

from planner.search.slots import ENDS_ORDER, POSITIONS, QUANTITIES, End, Position, per_quantity


def test_layouts_keep_their_order():
    assert QUANTITIES == ("forward", "backward", "sync_less_backward", "optimizer", "gather_less_forward",
                          "backward_input")
    assert POSITIONS == ((False, False), (True, False), (False, True), (True, True))
    assert [int(p) for p in ENDS_ORDER] == [Position.FIRST, Position.MIDDLE, Position.LAST]
    assert [e.name for e in End] == [p.name for p in ENDS_ORDER]


def test_per_quantity_names_each_slot():
    assert per_quantity(forward=1, backward_input=-1) == (1, 0, 0, 0, 0, -1)
    assert per_quantity() == (0,) * len(QUANTITIES)
    with pytest.raises(ValueError, match="not a stage quantity: fwd"):
        per_quantity(fwd=1)
