"""Bounds on what an input file may ask for, checked before anything is expanded.

A cluster of ``count: 1000000000000`` nodes or a YAML alias bomb (a few hundred bytes of
nested anchors that expand to billions of values) hung ``planner validate`` for minutes while
it ate memory.  Every bound lives here, with its name, so that a refusal can say which one it
hit and a user with a truly larger input knows what to change.  The bounds are generous: the
largest bench scenario (planner.bench, scenario e) has 2,048 nodes and 16,384 GPUs.
"""

from __future__ import annotations

MAX_FILE_BYTES = 16 * 2**20      # a spec, profile or plan file (the largest shipped YAML is ~0.5 MB)
MAX_NESTING_DEPTH = 64           # mappings and lists inside each other (specs use fewer than 8)
MAX_ALIAS_VALUES = 10_000        # values reached a second time through YAML aliases (*name)
MAX_NODES = 100_000              # nodes of one cluster, all groups' count together
MAX_GPUS_PER_NODE = 1_024        # gpus_per_node of one group
MAX_GPUS = 1_000_000             # GPUs of one cluster


def named(limit: str) -> str:
    """How a refusal names a bound: its value and where it is set."""
    return f"{globals()[limit]:,} (planner.spec.limits.{limit})"
