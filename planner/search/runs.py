"""Plans of a few options laid out as runs: a support plan's first incumbent (support_plans.py).

On a long pipeline over a few options (the ones a tuple's position LPs weigh), a capped MILP
finds poor plans: on bench e's 12-stage interleaved tuple over three options it reached
2.22 s in 2 s (2.105 s polished), and 2.057 s only after 8 s.  Local search from there
cannot reach the better plan, which has another mix of stages (six A100 stages at TP 8
instead of five, two H100 stages at TP 8 instead of one) in another order.  Plans like it are
few and regular, so they are built here directly:

1. **Stage counts.**  How many stages each option takes: near the weight the position LP
   gave it (``weights``: e's 6, 4 and 2.19 for a 6, 4, 2 optimum), within ``SPREAD`` of it,
   p in all, within every resource's capacity.
2. **Order.**  Each option's stages side by side (a change of class is a send between
   classes, often across a zone link), the runs in every order, and mirrored (each run but
   the innermost halved around the ones inside it: the ends hold the embedding and the head,
   and e's best plan is such a layout); where the pipeline wraps (interleaving: the last
   stage sends to the first), also with the first run split between the two ends, which is
   the same cycle.
3. **Blocks.**  Balanced on the heaviest max-term row: the least bound M under which the
   stages' largest block counts (``(M - intercept) / slope``, within memory) hold all the
   blocks, by bisection, then the surplus taken off the stages whose row is highest.

Every layout is priced at once (polish.Evaluator) and the best few are polished.  Proves
nothing: incumbents only, which also give the MILP after them its cutoff.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from planner.search import clock
from planner.search.core.problem import CoreProblem
from planner.search.polish import Evaluator, polish

SPREAD = 2              # stage counts within this of the LP's weight, each way
MOST_CELLS = 400_000    # layouts x stages priced at most (~0.3 s on this machine's 2 cores)
POLISHED = 3            # the best layouts polished
CELLS_PER_UNIT = 75     # layout stages priced per unit of counted work (clock.py: 50 us; ~0.65 us each here)
BISECT_STEPS = 50


def run_layouts(prob: CoreProblem, weights: list[float], deadline: float) -> tuple[float, list] | None:
    """The best plan found (objective, assignment) among the run layouts of ``prob``'s
    options, ``weights[o]`` the LP's weight of option o; None where none is feasible."""
    p, L = prob.num_stages, prob.num_blocks
    if p < 2 or not prob.options:
        return None
    ev = Evaluator(prob)
    seqs = _sequences(prob, ev, weights, max(1, MOST_CELLS // p))
    if not len(seqs) or clock.now() > deadline:
        return None
    clock.charge(seqs.size / CELLS_PER_UNIT)      # the pricing below, for a deterministic search
    row = _heaviest_max_row(prob)
    blocks = _balanced(ev, prob, seqs, row, L)
    ok = ev.feasible(seqs, blocks)
    if not ok.any() or clock.now() > deadline:
        return None
    seqs, blocks = seqs[ok], blocks[ok]
    values = ev.objective(seqs, blocks)
    best = None
    for i in np.argsort(values, kind="stable")[:POLISHED]:
        if clock.now() > deadline:
            break
        start = [(int(o), int(nb)) for o, nb in zip(seqs[i], blocks[i])]
        t, assign = polish(prob, start, deadline=deadline)
        if best is None or t < best[0]:
            best = (t, assign)
    return best


def _sequences(prob: CoreProblem, ev: Evaluator, weights: list[float], most: int) -> np.ndarray:
    """[N, p] option per stage, N <= ``most``: the mixes of stage counts near the weights,
    within capacity, nearest the weights first, each as runs in every order (and mirrored,
    and where the pipeline wraps with the first run split)."""
    p, K = prob.num_stages, len(prob.options)
    ranges = [range(max(0, math.floor(w) - SPREAD), min(p, math.ceil(w) + SPREAD) + 1) for w in weights]
    mixes = [c for c in itertools.product(*ranges) if sum(c) == p]
    mixes.sort(key=lambda c: sum(abs(n - w) for n, w in zip(c, weights)))
    out: list[list[int]] = []
    for counts in mixes:
        units = np.asarray(counts, dtype=float) @ ev.units            # [resources]
        if (units > ev.capacity + 1e-9).any():
            continue
        used = [o for o in range(K) if counts[o]]
        for order in itertools.permutations(used):
            runs = [o for o in order for _ in range(counts[o])]
            # mirrored: every run but the innermost halved around it (e's best: three A100
            # stages, an H100 at TP 8, four at TP 4, one at TP 8, three A100 stages)
            inner = [o for o in order[:-1] for _ in range(counts[o] // 2)]
            outer = [o for o in reversed(order[:-1]) for _ in range(counts[o] - counts[o] // 2)]
            mirrored = inner + [order[-1]] * counts[order[-1]] + outer
            for seq in (runs, mirrored):
                if seq not in out[-2:]:
                    out.append(seq)
            if prob.wrap and counts[order[0]] > 1:
                half = counts[order[0]] // 2
                out.append(runs[half:] + runs[:half])
            if len(out) >= most:
                return np.array(out[:most], dtype=int)
    return np.array(out, dtype=int).reshape(-1, p)


def _heaviest_max_row(prob: CoreProblem) -> int:
    """The row of the max term with the largest weight (the pipeline's), which the blocks balance."""
    terms = [t for t in prob.terms if t.kind == "max"]
    return max(terms, key=lambda t: t.weight).row if terms else prob.terms[0].row


def _balanced(ev: Evaluator, prob: CoreProblem, seqs: np.ndarray, row: int, L: int) -> np.ndarray:
    """[N, p] block counts: per sequence, the least M under which the stages hold L blocks
    (each at most ``(M - intercept) / slope`` on ``row``, its sends in the intercept, within
    its memory and at least its least count), less the surplus taken off the stages whose
    row value is highest."""
    N, p = seqs.shape
    coef = np.asarray(prob.rows[row].stage, dtype=float)
    stages = np.arange(p)
    slope = np.maximum(ev.slope[seqs] @ coef, 1e-12)                           # [N, p]
    icpt = ev.fixed[seqs, stages] @ coef + ev.sends(seqs, row)
    cap = ev.max_blocks[seqs, stages]
    least = ev.min_blocks[seqs, stages]

    def held(M: np.ndarray) -> np.ndarray:
        # the slack: at the top of the range each stage holds its cap (not cap - 1 by rounding)
        n = np.floor((M[:, None] - icpt) / slope + 1e-9)
        return np.clip(n, least, cap)

    lo = np.zeros(N)
    hi = (icpt + slope * np.maximum(cap, 1.0)).max(axis=1)
    for _ in range(BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        holds = held(mid).sum(axis=1) >= L
        hi = np.where(holds, mid, hi)
        lo = np.where(holds, lo, mid)
    n = held(hi)
    surplus = n.sum(axis=1) - L
    rows = np.arange(N)
    for _ in range(int(max(0.0, surplus.max()))):
        value = np.where(n > least, slope * n + icpt, -np.inf)
        top = value.argmax(axis=1)
        take = surplus > 0
        n[rows[take], top[take]] -= 1
        surplus = surplus - take
    return n.astype(int)
