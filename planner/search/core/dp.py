"""DP for the contiguous partition of blocks into pipeline stages.

Given ``cost[s][i][j]``, the time of stage ``s`` holding blocks ``[i, j)`` (``inf`` where it
does not fit in memory), find the split minimising ``alpha * max_s t_s + beta * sum_s t_s``
(1F1B: alpha = m - 1, beta = 1; a plain bottleneck: beta = 0).  The max makes the objective
non-separable, so we fix a threshold ``M`` on the largest stage, solve the separable
``min sum`` with every stage <= M by a DP over (stage, blocks used), and take the best
``alpha * M + beta * sum`` over the candidate thresholds (the distinct stage costs; the
optimum's own maximum is one of them).  Thresholds go up, and we stop once
``alpha * M + beta * (unconstrained min sum)`` can no longer beat the best found.
"""

from __future__ import annotations

import itertools

import numpy as np

from planner.search.core.problem import CoreProblem, CoreSolution


def _min_sum(cost: np.ndarray, limit: float) -> tuple[float, list[int]]:
    """min sum over splits with every stage cost <= limit; returns (value, cut points)."""
    p, n1, _ = cost.shape
    L = n1 - 1
    c = np.where(cost <= limit, cost, np.inf)
    f = np.full((p + 1, L + 1), np.inf)
    arg = np.zeros((p + 1, L + 1), dtype=int)
    f[0, 0] = 0.0
    for s in range(1, p + 1):
        # f[s, j] = min_i f[s-1, i] + c[s-1, i, j]
        tot = f[s - 1][:, None] + c[s - 1]
        arg[s] = np.argmin(tot, axis=0)
        f[s] = tot[arg[s], np.arange(L + 1)]
    if not np.isfinite(f[p, L]):
        return np.inf, []
    cuts, j = [L], L
    for s in range(p, 0, -1):
        j = int(arg[s, j])
        cuts.append(j)
    return float(f[p, L]), cuts[::-1]


def dp_partition(cost, alpha: float, beta: float) -> tuple[float, list[tuple[int, int]], int]:
    """Best split; returns (objective, [(first, last)] per stage, thresholds tried).

    ``cost``: array-like [p][L+1][L+1]; entries with j <= i are ignored (each stage holds at
    least one block).  Objective ``inf`` and no split when nothing fits.
    """
    cost = np.array(cost, dtype=float)
    _p, n1, _ = cost.shape
    i, j = np.indices((n1, n1))
    cost = np.where(j > i, cost, np.inf)            # at least one block per stage
    base, cuts = _min_sum(cost, np.inf)
    if not np.isfinite(base):
        return np.inf, [], 0
    if alpha == 0:
        return beta * base, list(itertools.pairwise(cuts)), 1
    levels = np.unique(cost[np.isfinite(cost)])
    best, best_cuts, tried = np.inf, [], 0
    for m in levels:
        if alpha * m + beta * base >= best:
            break                                   # later thresholds only grow
        tried += 1
        total, cs = _min_sum(cost, m)
        if not np.isfinite(total):
            continue
        real_max = max(cost[s, a, b] for s, (a, b) in enumerate(itertools.pairwise(cs)))
        val = alpha * real_max + beta * total
        if val < best:
            best, best_cuts = val, cs
    return float(best), list(itertools.pairwise(best_cuts)), tried


def dp_fixed_options(prob: CoreProblem, options: list[int]) -> CoreSolution:
    """Solve ``prob`` exactly by the DP when each stage's option is fixed.

    Needs an objective of at most one max term and sum terms (a pipeline form); with the
    options fixed the boundary quantities are constants and fold into the stage costs.
    """
    maxes = [t for t in prob.terms if t.kind == "max"]
    if any(t.kind == "min" for t in prob.terms):
        raise ValueError("the DP handles no min term; use the MILP")
    if len(maxes) > 1:
        raise ValueError("the DP handles one max term; use the MILP")
    if prob.boundary is not None and prob.boundary.any():
        raise ValueError("the DP takes boundary quantities folded into the stage costs")
    p, L = prob.num_stages, prob.num_blocks
    alpha = maxes[0].weight if maxes else 0.0
    # stage cost table per (s, nb): value of the max row, and of the summed rows
    mrow = maxes[0].row if maxes else None
    cost = np.full((p, L + 1, L + 1), np.inf)
    extra = np.full((p, L + 1, L + 1), np.inf)      # summed part, per stage and range
    for s in range(p):
        opt = prob.options[options[s]]
        if not opt.allowed(s):
            return CoreSolution(status="infeasible")
        for nb in range(opt.least_blocks(s), min(opt.max_blocks[s], L) + 1):
            q = [a * nb + b for a, b in zip(opt.slope, opt.fixed[s])]
            vals = [float(np.dot(row.stage, q)) + sum(max(0.0, float(np.dot(h, q))) for h in row.hinges)
                    for row in prob.rows]
            mval = vals[mrow] if mrow is not None else 0.0
            sval = sum(t.weight * vals[t.row] for t in prob.terms if t.kind == "sum")
            for i in range(L - nb + 1):
                cost[s, i, i + nb] = mval
                extra[s, i, i + nb] = sval
    # The DP minimises alpha*max(cost) + sum(extra) with the max on the max row only: run it
    # on the threshold of the max row, summing ``extra``.
    best, best_split = np.inf, []
    base, _ = _min_sum(np.where(np.isfinite(cost), extra, np.inf), np.inf)
    levels = np.unique(cost[np.isfinite(cost)]) if alpha else [np.inf]
    tried = 0
    for m in levels:
        if alpha and alpha * max(m, 0.0) + base >= best:
            break
        tried += 1
        total, cs = _min_sum(np.where(cost <= m, extra, np.inf), np.inf)
        if not np.isfinite(total):
            continue
        split = list(itertools.pairwise(cs))
        assign = [(options[s], b - a) for s, (a, b) in enumerate(split)]
        if not prob.feasible(assign):
            continue
        val = prob.objective(assign)
        if val < best:
            best, best_split = val, assign
    if not best_split:
        return CoreSolution(status="infeasible", nodes=tried)
    return CoreSolution(status="optimal", assign=best_split, objective=best, bound=best, gap=0.0,
                        nodes=tried)
