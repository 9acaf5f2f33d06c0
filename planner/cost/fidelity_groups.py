"""A fidelity set's error grouped by the measured runs' own configuration fields.

``python -m planner.cost.fidelity_groups vtrain-single tp,micro_batch_per_replica,hidden_size``
prints, per distinct value of those fields, the rows, the mean signed error (negative:
predicted too fast), its spread and the MAPE.  A small spread inside groups whose means differ
says the miss is a function of those fields, not run-to-run noise: on vtrain-single the
(tp, micro-batch, hidden) groups' spreads are 0.0-5.5% while their means run from -29% to +27%,
so what is left there is the per-shape cost of a block, not the measurements.

The fields are those of each row's ``config`` in ``tests/fidelity/<set>/rows.yaml``;
``micro_batches`` (global batch / dp / micro-batch) is derived.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass

from planner.cost.fidelity import SETS, predict_set

DERIVED = {"micro_batches": lambda c: c["global_batch_size"] // c["dp"] // c["micro_batch_per_replica"]}


@dataclass(frozen=True)
class Group:
    key: tuple
    rows: int
    mean_signed: float
    spread: float        # population standard deviation of the signed errors
    mape: float


def _value(config: dict, field: str):
    return DERIVED[field](config) if field in DERIVED else config[field]


def group_errors(set_name: str, fields: list[str], calibration=None) -> list[Group]:
    """The set's rows grouped by ``fields``; a field no row has is a ValueError naming the
    fields that exist."""
    if set_name not in SETS:
        raise ValueError(f"unknown set {set_name!r}; sets: {', '.join(SETS)}")
    results = predict_set(set_name, calibration)
    known = set().union(*(r.config.keys() for r in results)) | set(DERIVED)
    missing = [f for f in fields if f not in known]
    if missing:
        raise ValueError(f"{set_name} rows have no field {missing[0]!r}; fields: {', '.join(sorted(known))}")
    errors: dict[tuple, list[float]] = defaultdict(list)
    for r in results:
        errors[tuple(_value(r.config, f) for f in fields)].append(r.signed_error)
    return [Group(k, len(e), statistics.fmean(e), statistics.pstdev(e), statistics.fmean(abs(x) for x in e))
            for k, e in sorted(errors.items())]


def format_groups(fields: list[str], groups: list[Group]) -> str:
    head = ", ".join(fields)
    width = max(len(head), *(len(str(g.key)) for g in groups)) if groups else len(head)
    lines = [f"{head:<{width}}  {'rows':>5}  {'mean signed':>11}  {'spread':>7}  {'MAPE':>6}", "-" * (width + 39)]
    for g in groups:
        lines.append(f"{g.key!s:<{width}}  {g.rows:>5}  {100 * g.mean_signed:>+10.1f}%  {100 * g.spread:>6.1f}%"
                     f"  {100 * g.mape:>5.1f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.cost.fidelity_groups", description=__doc__.split("\n")[0])
    ap.add_argument("set", help=f"a fidelity set: {', '.join(SETS)}")
    ap.add_argument("fields", help="comma-separated fields of the rows' config, e.g. tp,micro_batch_per_replica")
    args = ap.parse_args(argv)
    fields = [f.strip() for f in args.fields.split(",") if f.strip()]
    try:
        groups = group_errors(args.set, fields)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_groups(fields, groups))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
