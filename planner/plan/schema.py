"""The JSON Schema of plan files (``schema.json`` beside this module) and validation with it.

The schema is the published contract for tools outside planner; ``Plan`` (pydantic) stays the
check the planner itself relies on, and a test keeps the two in agreement.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from planner.errors import InputError, InputErrors, Location
from planner.spec.source import format_field_path

SCHEMA_PATH = Path(__file__).with_name("schema.json")


@lru_cache(maxsize=1)
def plan_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


@lru_cache(maxsize=1)
def _validator():
    from jsonschema import Draft202012Validator  # imported on first use: it is slow to load

    Draft202012Validator.check_schema(plan_schema())
    return Draft202012Validator(plan_schema())


def validate_plan_json(data, file: str = "<plan>") -> None:
    """Raise ``InputErrors`` (each naming the JSON path) if ``data`` breaks the plan schema."""
    problems = sorted(_validator().iter_errors(data),
                      key=lambda e: (tuple(str(p) for p in e.absolute_path), e.message))
    if not problems:
        return
    errors = []
    for err in problems:
        field = format_field_path(tuple(err.absolute_path)) or None
        errors.append(InputError(f"does not match the plan schema: {err.message}",
                                 Location(file, field=field)))
    raise InputErrors(errors)
