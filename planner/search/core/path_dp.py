"""The least summed cost of a pipeline walked stage by stage, its max rows capped and the
capacities priced (a Lagrangian relaxation): the inner step of ``path_bound``.

A plan is a path: stage s picks an option and a block count, the stages' blocks sum to L, and
each boundary pays its send, a table over the two options it joins.  For caps ``C_t`` on the
max rows (every stage's row at most C_t) and prices ``lam_r >= 0`` per unit of each resource,
``fill(caps, lam)`` is the least over paths of the sum terms plus ``lam . units``, with the
capacities dropped.  So for every plan inside the caps and the capacities,

    sum terms(plan) >= fill(caps, lam) - lam . capacity

(its units are at most the capacity and lam >= 0).  The path is exact where the position LP
(position_lp.py) is loose: one option per stage, a whole number of blocks, each boundary's
send from the two options it joins.  Two relaxations keep the DP small, both only lower the
fill: a stage's row is checked on arrival with its true incoming send and its option's least
outgoing one, and on leaving with its true outgoing send and the least incoming one; a
wrapping pipeline's last boundary is walked per (first stage's resource, last stage's
resource), each end checked with the least send from or to the other end's resource.

Runs on plain arrays (``CoreProblem``), numpy throughout: on bench c's 12-stage tuples of 133
options and 48 blocks one ``fill`` under the caps near its best plans takes 13-50 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.search import clock
from planner.search.core.problem import CoreProblem

INF = np.inf
# cells of the walk's largest arrays over all its steps (wraps x options^2 x blocks x stages,
# 8 bytes each; the way back keeps one such array a step): 2e7 is ~160 MB, with a step's
# transients ~250 MB.  c's boxes near its best plans take ~1e6, a wide one of its (30 options,
# nine wraps) 5e6, uncapped (133 options) 9e7
MAX_CELLS = 20_000_000
TOLERANCE = 1e-9            # relative: a row this close over its cap is within it
DP_CELLS_PER_UNIT = 2_000   # a unit of work stands for 50 us (clock.py); numpy does ~40 cells a us here


class PathTooBig(Exception):
    """The DP under these caps would hold more than MAX_CELLS cells over its steps."""


def applies(prob: CoreProblem) -> bool:
    """Max and sum terms only, at most one boundary kind, sends and their coefficients not
    negative, no hinges in summed rows: the forms ``PathDP`` reads (the zero-bubble schedules'
    min term is not one of them)."""
    if prob.num_stages < 2 or not prob.options or prob.num_boundary_kinds > 1:
        return False
    if prob.boundary is not None and (prob.boundary < 0).any():
        return False            # the least sends stand for the true ones only when none is negative
    if any(c < 0 for row in prob.rows for c in (*row.out, *row.inn)):
        return False
    if any(t.kind not in ("max", "sum") or t.weight < 0 for t in prob.terms):
        return False
    return not any(prob.rows[t.row].hinges for t in prob.terms if t.kind == "sum")


class PathDP:
    """The problem's per-(option, position, blocks) row values, computed once; ``fill``
    solves the path DP for given caps and prices."""

    def __init__(self, prob: CoreProblem):
        self.prob = prob
        K, p, L = len(prob.options), prob.num_stages, prob.num_blocks
        self.K, self.p, self.L = K, p, L
        blocks = np.arange(L + 1, dtype=float)
        quantities = np.zeros((K, p, L + 1, prob.num_quantities))
        self.allowed = np.zeros((K, p, L + 1), bool)         # memory and the least blocks
        for o, opt in enumerate(prob.options):
            slope = np.asarray(opt.slope, float)
            for s in range(p):
                if opt.allowed(s):
                    quantities[o, s] = blocks[:, None] * slope + np.asarray(opt.fixed[s], float)
                    self.allowed[o, s, opt.least_blocks(s):opt.max_blocks[s] + 1] = True
        self.allowed[:, :, 0] = False
        self.row_values = [_row_values(row, quantities) for row in prob.rows]   # sends apart
        self.sends = prob.boundary[0] if prob.num_boundary_kinds else np.zeros((K, K))
        self.least_out = self.sends.min(axis=1)
        self.least_in = self.sends.min(axis=0)
        self.units = prob.units_by_resource()                # [K, resources]
        self.capacity = np.asarray(prob.capacity, float)
        self.max_terms = [t for t in prob.terms if t.kind == "max"]
        sum_terms = [t for t in prob.terms if t.kind == "sum"]
        self.stage_sum = sum((t.weight * self.row_values[t.row] for t in sum_terms), np.zeros((K, p, L + 1)))
        # a boundary's send is summed once as the out of one stage and once as the in of the next
        self.send_weight = sum(t.weight * (_side(prob.rows[t.row].out) + _side(prob.rows[t.row].inn))
                               for t in sum_terms)
        self.wrap = prob.wrap
        self.resource = np.array([opt.resource for opt in prob.options])

    def least_row(self, term_index: int) -> float:
        """A floor on the max term's value over every plan: each position holds some stage,
        which pays at least the least row any option has there (sends only add)."""
        values = np.where(self.allowed, self.row_values[self.max_terms[term_index].row], INF)
        per_position = values.min(axis=(0, 2))
        return max(0.0, float(per_position.max()))

    def least_fill(self) -> float:
        """A floor on the sum terms of every plan without a DP: all L blocks at the least
        per-block slope, plus each position's least intercept (the uncapped DP over c's 133
        options takes 2-4 s; this, microseconds).  The sum rows are affine in the blocks."""
        where = self.allowed.any(axis=2)                                          # [K, p]
        if not where.any(axis=0).all():
            return INF
        slope = self.stage_sum[:, :, 1] - self.stage_sum[:, :, 0]
        least_slope = float(np.where(where, slope, INF).min())
        intercepts = np.where(where, self.stage_sum[:, :, 0], INF).min(axis=0)
        return float(self.L * least_slope + intercepts.sum())

    def most_row(self, term_index: int) -> float:
        """A ceiling on the max term's value over every plan: the most any stage's row can be,
        its sends at their most."""
        term = self.max_terms[term_index]
        row = self.prob.rows[term.row]
        stage = float(np.where(self.allowed, self.row_values[term.row], -INF).max())
        return max(0.0, stage + (_side(row.out) + _side(row.inn)) * float(self.sends.max()))

    def tolerance(self, caps) -> float:
        """How far over a cap a row may read and still count as within it (rounding): relative
        to the caps' scale, so that problems in other units keep the plans exactly at a cap."""
        finite = [abs(c) for c in caps if np.isfinite(c)]
        return TOLERANCE * max([1.0, *finite])

    def _caps_masks(self, caps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per (option, position, blocks): allowed under the caps with the least sends, and the
        largest incoming and outgoing send the caps still allow, each with the other side's
        send at its least (inf: no capped row has one)."""
        p, tol = self.p, self.tolerance(caps)
        ok = self.allowed.copy()
        allow_in, allow_out = np.full(ok.shape, INF), np.full(ok.shape, INF)
        has_out = np.array([s < p - 1 or self.wrap for s in range(p)], float)[None, :, None]
        has_in = np.array([s > 0 or self.wrap for s in range(p)], float)[None, :, None]
        for t, cap in zip(self.max_terms, caps):
            if not np.isfinite(cap):
                continue
            row = self.prob.rows[t.row]
            out_c, in_c = _side(row.out), _side(row.inn)
            slack = cap - self.row_values[t.row]
            if in_c > 0:
                allow_in = np.minimum(allow_in, (slack - out_c * self.least_out[:, None, None] * has_out) / in_c)
            if out_c > 0:
                allow_out = np.minimum(allow_out, (slack - in_c * self.least_in[:, None, None] * has_in) / out_c)
            if in_c <= 0 and out_c <= 0:
                ok &= slack >= -tol
        ok &= (allow_in >= -tol) & (allow_out >= -tol)
        return ok, allow_in, allow_out

    def fill(self, caps, lam: np.ndarray) -> tuple[float, list[tuple[int, int]] | None]:
        """The least sum terms + ``lam . units`` over paths within ``caps`` (one per max term,
        inf: uncapped), and the path that attains it, [(option, blocks)] per stage (None: no
        path)."""
        ok, allow_in, allow_out = self._caps_masks(caps)
        # the options that hold a block somewhere under the caps: c's 133 become 19-30 near
        # its best plans' caps, and the DP's work goes with their square
        keep = np.nonzero(ok.any(axis=(1, 2)))[0]
        if not len(keep):
            return INF, None
        most = int(np.nonzero(ok.any(axis=(0, 1)))[0].max())
        ok, allow_in, allow_out = (a[keep][:, :, :most + 1] for a in (ok, allow_in, allow_out))
        cost = np.where(ok, self.stage_sum[keep][:, :, :most + 1] + (self.units[keep] @ lam)[:, None, None], INF)
        walk = _Walk(self, keep, ok, allow_in, allow_out, cost, self.tolerance(caps))
        if walk.size > MAX_CELLS:
            raise PathTooBig(walk.size)
        clock.charge(walk.size / DP_CELLS_PER_UNIT)        # its work, for a deterministic search
        value, path = walk.run()
        if path is None:
            return INF, None
        return value, [(int(keep[o]), nb) for o, nb in path]

    def units_of(self, path: list[tuple[int, int]]) -> np.ndarray:
        return self.units[[o for o, _ in path]].sum(axis=0)


@dataclass(frozen=True)
class _Step:
    """What one position's step keeps for the way back: the last stage's values by room
    [G, o, j, b] with the block count of each rank, how many ranks each send leaves [o, o2],
    the values arriving by sender rank [G, rank, b, o2] and how many senders each (option,
    blocks) takes [o2, nb]."""
    ranked: np.ndarray
    by_room: np.ndarray
    fits: np.ndarray
    arrive: np.ndarray
    count: np.ndarray


class _Walk:
    """One DP over the positions on the kept options.  The state after stage s is (its
    option, its blocks, the blocks so far): its blocks fix how much of its cap is left for its
    outgoing send, which the next stage's option decides (on bench c a stage before a zone
    boundary otherwise took the 11-ms crossing as a 0.2-ms send, 0.2 s of the bound)."""

    def __init__(self, dp: PathDP, keep, ok, allow_in, allow_out, cost, tol: float):
        self.dp, self.keep, self.ok, self.cost, self.tol = dp, keep, ok, cost, tol
        self.allow_in, self.allow_out = allow_in, allow_out
        self.sends = dp.sends[np.ix_(keep, keep)]
        self.resource = dp.resource[keep]
        # a wrapping pipeline's last boundary joins its last stage to its first: walked per
        # (first stage's resource, last stage's resource), each end's check of the wrap's
        # send takes the least send from (into) the other end's resource.  With the first's
        # alone, a first stage priced its incoming send at the least of any option and c's
        # bound stalled at 1.891 s on plans whose first stage takes a zone crossing
        present = sorted(set(self.resource.tolist()))
        self.groups = [(a, b) for a in present for b in present] if dp.wrap else [None]
        self.size = len(self.groups) * len(keep) ** 2 * (dp.L + 1) * dp.p     # cells of its largest arrays

    def run(self) -> tuple[float, list[tuple[int, int]] | None]:
        dp, ok, cost = self.dp, self.ok, self.cost
        K, p, L, NB = len(self.keep), dp.p, dp.L, ok.shape[2]
        groups = self.groups
        order = self.order = np.argsort(self.sends, axis=0, kind="stable")   # per option: its senders, least send first
        sorted_sends = np.take_along_axis(self.sends, order, axis=0)
        nb = np.arange(NB)
        before = np.arange(L + 1)[None, :] - nb[:, None]                       # [nb, b']
        idx_b = np.clip(before, 0, L)[None]
        o2 = np.arange(K)[:, None, None]
        # V[g, o, nb, b]: the least cost of stages 0..s, stage s holding nb blocks of option o,
        # b blocks in all (g: the first and last stages' resources, when the pipeline wraps)
        V = np.full((len(groups), K, NB, L + 1), INF)
        for g, ends in enumerate(groups):
            first_ok = ok[:, 0, :]
            if ends is not None:
                wrap_in = self.sends[self.resource == ends[1]].min(axis=0)        # [o]: from the last's resource
                first_ok = first_ok & (self.resource == ends[0])[:, None] & (wrap_in[:, None] <= self.allow_in[:, 0, :] + self.tol)
            V[g, :, nb, nb] = np.where(first_ok, cost[:, 0, :], INF).T
        back = []
        for s in range(1, p):
            # the least over the last stage's block counts whose cap leaves room for each
            # send: its block counts by room (most first), prefix minima, cut where the room ends
            room = self.allow_out[:, s - 1, :]                                   # [o, nb]
            by_room = np.argsort(-room, axis=1, kind="stable")
            ranked = np.take_along_axis(V, by_room[None, :, :, None], axis=2)   # [G, o, j, b]
            lowest = np.minimum.accumulate(ranked, axis=2)
            fits = (np.take_along_axis(room, by_room, axis=1)[:, :, None] >= self.sends[:, None, :] - self.tol).sum(axis=1)  # [o, o2]
            j = np.maximum(fits - 1, 0)
            rows_o = np.arange(K)[:, None]
            A = np.where((fits > 0)[None, :, :, None], lowest[:, rows_o, j, :], INF)        # [G, o, o2, b]
            # senders of each option by rank (least send first), with their send priced
            arrive = A[:, order, np.arange(K)[None, :]].transpose(0, 1, 3, 2) \
                + dp.send_weight * sorted_sends[None, :, None, :]                        # [G, rank, b, o2]
            prefix = np.minimum.accumulate(arrive, axis=1)
            # how many of its senders' sends each (option, blocks) allows
            count = (sorted_sends.T[:, None, :] <= self.allow_in[:, s, :, None] + self.tol).sum(axis=2)   # [K, nb]
            valid = (before >= 0)[None] & (count > 0)[:, :, None] & ok[:, s, :, None]    # [K, nb, b']
            rank = np.maximum(count - 1, 0)[:, :, None]
            got = prefix[:, rank, idx_b, o2]                                    # [G, K, nb, b']
            V = np.where(valid[None], got + cost[:, s, :][None, :, :, None], INF)
            # the argmins are found again on the way back, for the one path taken
            back.append(_Step(ranked, by_room, fits, arrive, count))
        return self._end(V, groups, back)

    def _end(self, V, groups, back) -> tuple[float, list[tuple[int, int]] | None]:
        dp, L = self.dp, self.dp.L
        best, end = INF, None
        for g, ends in enumerate(groups):
            last = V[g, :, :, L]                                                # [o, nb]
            if ends is not None:
                # the wrap: at least the least send into the first stage's resource, within
                # the last stage's room
                last = np.where((self.resource == ends[1])[:, None], last, INF)
                wrap = self.sends[:, self.resource == ends[0]].min(axis=1)
                fits = self.allow_out[:, dp.p - 1, :] >= wrap[:, None] - self.tol
                last = np.where(fits, last + dp.send_weight * wrap[:, None], INF)
            o, n = np.unravel_index(int(np.argmin(last)), last.shape)
            if last[o, n] < best:
                best, end = float(last[o, n]), (g, int(o), int(n))
        if end is None or not np.isfinite(best):
            return INF, None
        g, o, n = end
        b, path = L, [(o, n)]
        for step in reversed(back):
            b -= n
            sender = int(np.argmin(step.arrive[g, :step.count[o, n], b, o]))
            prev = int(self.order[sender, o])
            n = int(step.by_room[prev, np.argmin(step.ranked[g, prev, :step.fits[prev, o], b])])
            o = prev
            path.append((o, n))
        return best, path[::-1]


def _side(coefs: tuple[float, ...]) -> float:
    return float(coefs[0]) if coefs else 0.0


def _row_values(row, quantities: np.ndarray) -> np.ndarray:
    """A row's stage part (hinges included, sends apart) at every (option, position, blocks)."""
    values = quantities @ np.asarray(row.stage, float)
    for hinge in row.hinges:
        values = values + np.maximum(0.0, quantities @ np.asarray(hinge, float))
    return values
