"""Pydantic field types for quantities with units (values stored in SI base units)."""

from __future__ import annotations

import contextvars
from typing import Annotated

from pydantic import BeforeValidator, Field

from planner.spec import units


def _passthrough_float(parse):
    """Accept already-parsed floats from code (api users), parse strings from files."""

    def inner(value):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and _from_code.get():
            return float(value)
        return parse(value)

    return inner


# When specs are built in Python (api), numbers are already in base units; a context flag
# lets validators accept them.  Files always go through the unit parser.
_from_code: contextvars.ContextVar[bool] = contextvars.ContextVar("planner_from_code", default=False)

BandwidthBps = Annotated[float, BeforeValidator(_passthrough_float(units.parse_bandwidth_Bps))]
SizeBytes = Annotated[float, BeforeValidator(_passthrough_float(units.parse_size_bytes))]
TimeS = Annotated[float, BeforeValidator(_passthrough_float(units.parse_time_s))]
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
# No node-hour, GPU-hour or gigabyte of egress costs ten million dollars; the cap keeps a
# mistyped price from overflowing the objective's sums to inf (Infinity / NaN in a plan file).
MAX_PRICE_USD = 1e7


class numbers_in_base_units:
    """Context manager: inside it, bare numbers for quantities are taken as base units."""

    def __enter__(self):
        self._token = _from_code.set(True)

    def __exit__(self, *exc):
        _from_code.reset(self._token)
