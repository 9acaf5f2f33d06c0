"""A relaxation of a CoreProblem that keeps the sends: options grouped, one stand-in per group.

A knob tuple with many options is too big for the exact MILP (its send terms grow as K^2 per
boundary, solve.py's MAX_PAIR_TERMS); dropping the sends instead (``Pricer.price(sends=False)``)
gives a relaxation that cannot see what makes a plan across a zone link slow.  Here the
options are split into groups and each group becomes one *representative* that is no worse
than any member in every respect the rows and constraints read:

- per quantity, the least line over the members (least slope, least intercept per position:
  below every member's line at every block count >= 0), or the most line where a row reads
  the quantity with a negative effective sign (below);
- per position, the fewest least blocks and the most max blocks of the members allowed there
  (a member not allowed at a position adds nothing there);
- per resource, the fewest units any member holds (0 where some member holds none), and the
  least option price;
- per pair of groups and boundary kind, the least send over the member pairs.

Any assignment of the original maps (each option to its group's representative, the same
block counts) to an assignment of the aggregate that is feasible and whose every row is on
the right side of the original's, so the aggregate's optimum, or the dual bound of its capped
MILP, is a lower bound on the original's optimum.  With groups of options that hold the same
units (the default grouping) capacity stays exact; only the merging (``max_pairs``) loosens it.

Monotonicity (what "least per member" needs).  A row enters the objective with a direction:
+1 in a max or sum term of weight >= 0 (the objective grows with the row), -1 in a min term
(weight <= 0: the least stage's row is subtracted).  The aggregate must not exceed the
original, so a coefficient c on quantity k whose sign times the direction is >= 0 reads the
least line of k, one below 0 the most line (largest slope, largest intercept: above every
member's line for block counts >= 0), both kept as separate quantities of the aggregate.
Hinges ``max(0, h . q)`` grow with their argument, so each hinge coefficient is treated the
same way (ZB-H1's rows read the backward less its input part, ``b - i``, in a min term: the
aggregate reads the most ``b`` and the least ``i`` there).  A row used in both directions is
split in two.  Sends are taken at their least, which needs every send coefficient times its
row's direction >= 0 (problem.py asks the non-negative coefficients of every schedule); a
problem breaking that, or with a max or sum term of negative weight, is not aggregated.

Not used by the search yet: on bench e's tuples too big for the exact MILP its MILP, capped
as ``incumbent.relaxed`` caps one, bounds 1.43-1.98 s against their knob bounds of 2.05-2.26 s
(the exact and the send-free MILPs do no better: their LP relaxations are the weak side, not
the sends; docs/search-space.md, "Bounds for the tuples too big for the exact MILP").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np

from planner.search.core.problem import CoreOption, CoreProblem, Row, Term


def uses_key(prob: CoreProblem, o: int) -> Hashable:
    """The default grouping: options holding the same (resource, units) pairs (and, with
    ``same_group``, of the same group) are interchangeable for the capacity and budget rows."""
    opt = prob.options[o]
    return (opt.uses(), opt.group if prob.same_group else None)


def group_options(prob: CoreProblem, key: Callable[[CoreProblem, int], Hashable] = uses_key,
                  max_pairs: int | None = None) -> list[list[int]]:
    """The option indices of each group: by ``key``; then, while ``groups^2 x boundaries``
    exceeds ``max_pairs``, neighbours in units of the same primary resource (and group) merge
    pairwise (the merged group holds the fewer units: a looser bound, a smaller MILP)."""
    by_key: dict = {}
    for o in range(len(prob.options)):
        by_key.setdefault(key(prob, o), []).append(o)
    groups = list(by_key.values())
    bounds = max(1, prob.num_boundaries)
    while max_pairs is not None and len(groups) ** 2 * bounds > max_pairs:
        buckets: dict = {}
        for g in groups:
            first = prob.options[g[0]]
            buckets.setdefault((first.resource, first.group if prob.same_group else None), []).append(g)
        merged = []
        for members in buckets.values():
            members.sort(key=lambda g: (min(prob.options[o].units for o in g), g[0]))
            merged += [[o for g in members[i:i + 2] for o in g] for i in range(0, len(members), 2)]
        if len(merged) == len(groups):
            break           # one group per bucket: nothing left to merge
        groups = merged
    return [sorted(g) for g in groups]


def _directions(prob: CoreProblem) -> list[tuple[int, int]]:
    """(row, direction) pairs the terms read, in first-use order; raises ValueError where the
    aggregate cannot bound a term (a max or sum term of negative weight)."""
    out: list[tuple[int, int]] = []
    for t in prob.terms:
        if t.weight == 0:
            continue
        if t.kind == "min":
            d = -1
        elif t.weight > 0:
            d = 1
        else:
            raise ValueError(f"a {t.kind} term of weight {t.weight} < 0 has no least-per-member bound")
        if (t.row, d) not in out:
            out.append((t.row, d))
    return out


def aggregate(prob: CoreProblem, groups: Sequence[Sequence[int]] | None = None,
              max_pairs: int | None = None) -> tuple[CoreProblem, list[list[int]]]:
    """(the aggregate, its groups of ``prob`` 's option indices); its option g stands for the
    members ``groups[g]`` (``group_options`` unless given).  Raises ValueError where a term or
    a send coefficient has the wrong sign (module docstring)."""
    groups = [list(g) for g in (groups if groups is not None else group_options(prob, max_pairs=max_pairs))]
    Q, R = prob.num_quantities, prob.num_boundary_kinds
    pairs = _directions(prob)
    # which quantities need their most line: a negative effective sign anywhere
    most_needed: set[int] = set()
    for j, d in pairs:
        row = prob.rows[j]
        for vec in (row.stage, *row.hinges):
            most_needed |= {k for k, c in enumerate(vec) if c * d < 0}
        if any(c * d < 0 for c in (*row.out, *row.inn)):
            raise ValueError(f"row {j} reads a send with a sign its term cannot bound from below")
    most = sorted(most_needed)
    most_at = {k: Q + i for i, k in enumerate(most)}

    def rewrite(vec: Sequence[float], d: int) -> tuple[float, ...]:
        out = [0.0] * (Q + len(most))
        for k, c in enumerate(vec):
            out[most_at[k] if c * d < 0 else k] += c
        return tuple(out)

    new_row: dict[tuple[int, int], int] = {}
    rows: list[Row] = []
    for j, d in pairs:
        row = prob.rows[j]
        new_row[j, d] = len(rows)
        rows.append(Row(stage=rewrite(row.stage, d), out=row.out, inn=row.inn,
                        hinges=tuple(rewrite(h, d) for h in row.hinges)))
    terms = [Term(t.kind, new_row[t.row, -1 if t.kind == "min" else 1], t.weight)
             for t in prob.terms if t.weight != 0]
    options = [_representative(prob, g, most) for g in groups]
    boundary = None
    if prob.boundary is not None:
        boundary = np.empty((R, len(groups), len(groups)))
        for a, ga in enumerate(groups):
            block = prob.boundary[:, ga, :]
            for b, gb in enumerate(groups):
                boundary[:, a, b] = block[:, :, gb].min(axis=(1, 2))
    agg = CoreProblem(num_blocks=prob.num_blocks, num_stages=prob.num_stages, capacity=list(prob.capacity),
                      options=options, rows=rows, terms=terms, boundary=boundary,
                      budget_usd_per_hour=prob.budget_usd_per_hour, wrap=prob.wrap,
                      resource_price=None if prob.resource_price is None else list(prob.resource_price),
                      same_group=prob.same_group)
    return agg, groups


def _representative(prob: CoreProblem, members: Sequence[int], most: Sequence[int]) -> CoreOption:
    """One option no worse than any of ``members`` (module docstring); quantities: the least
    lines, then the most lines of the quantities ``most``."""
    opts = [prob.options[o] for o in members]
    p = prob.num_stages
    slopes = np.array([o.slope for o in opts], dtype=float)
    slope = (*slopes.min(axis=0), *(slopes[:, k].max() for k in most))
    fixed: list[tuple[float, ...] | None] = []
    max_blocks, min_blocks = [], []
    for s in range(p):
        here = [o for o in opts if o.allowed(s)]
        if not here:
            fixed.append(None)
            max_blocks.append(0)
            min_blocks.append(1)
            continue
        f = np.array([o.fixed[s] for o in here], dtype=float)
        fixed.append((*f.min(axis=0), *(f[:, k].max() for k in most)))
        max_blocks.append(max(o.max_blocks[s] for o in here))
        min_blocks.append(min(o.least_blocks(s) for o in here))
    # per resource the fewest units any member holds (a member without the resource: none)
    held = [dict(o.uses()) for o in opts]
    first = opts[0]
    units = {c: min(h.get(c, 0) for h in held) for c in {c for h in held for c in h}}
    # the first member's order (a member lacking a resource it holds makes that resource 0)
    extra = tuple((c, units[c]) for c, _ in first.extra_uses if units[c] > 0)
    return CoreOption(resource=first.resource, units=units.get(first.resource, 0), slope=slope, fixed=fixed,
                      max_blocks=max_blocks, price_usd_per_hour=min(o.price_usd_per_hour for o in opts),
                      label=tuple(o.label for o in opts), group=first.group, extra_uses=extra,
                      min_blocks=None if all(b == 1 for b in min_blocks) else min_blocks)

