"""Brute force over a CoreProblem: every option per stage and every block composition.

Exponential; for the tests' small cases only.  It calls nothing but ``CoreProblem.objective``
so it shares no logic with the DP or the MILP it checks.
"""

from __future__ import annotations

from collections.abc import Iterator

from planner.search.core.problem import CoreProblem, CoreSolution


def assignments(prob: CoreProblem) -> Iterator[list[tuple[int, int]]]:
    """Every feasible assignment [(option, nb)] per stage."""
    p, L = prob.num_stages, prob.num_blocks
    used = [0] * len(prob.capacity)
    cur: list[tuple[int, int]] = []

    def rec(s: int, left: int):
        if s == p:
            if left == 0 and prob.feasible(cur):
                yield list(cur)
            return
        for o, opt in enumerate(prob.options):
            uses = opt.uses()
            if not opt.allowed(s) or any(used[c] + u > prob.capacity[c] for c, u in uses):
                continue
            if prob.same_group and cur and prob.options[cur[0][0]].group != opt.group:
                continue
            hi = min(opt.max_blocks[s], left - (p - 1 - s))
            lo = max(left if s == p - 1 else 1, opt.least_blocks(s))
            for nb in range(lo, hi + 1):
                for c, u in uses:
                    used[c] += u
                cur.append((o, nb))
                yield from rec(s + 1, left - nb)
                cur.pop()
                for c, u in uses:
                    used[c] -= u

    yield from rec(0, L)


def solve_brute(prob: CoreProblem, mode: str = "time", time_cap: float | None = None,
                top_k: int = 1) -> list[CoreSolution]:
    """The ``top_k`` best assignments, best first (distinct assignments).

    ``mode="time"``: minimise the objective.  ``mode="price"``: minimise the price among
    assignments whose objective is at most ``time_cap``, ties broken by the objective.
    """
    scored = []
    for a in assignments(prob):
        obj = prob.objective(a)
        if mode == "price":
            if time_cap is not None and obj > time_cap * (1 + 1e-12):
                continue
            key = (prob.price(a), obj)
        else:
            key = (obj,)
        scored.append((key, a))
    if not scored:
        return [CoreSolution(status="infeasible", nodes=0)]
    scored.sort(key=lambda t: (t[0], t[1]))
    # Distinct = a different option sequence (another layout of GPUs), each with its best split.
    seen, picked = set(), []
    for key, a in scored:
        sig = tuple(o for o, _ in a)
        if sig not in seen:
            seen.add(sig)
            picked.append((key, a))
        if len(picked) == top_k:
            break
    out = []
    for key, a in picked:
        val = key[0]
        out.append(CoreSolution(status="optimal", assign=a, objective=prob.objective(a),
                                bound=val, gap=0.0, nodes=len(scored)))
    return out
