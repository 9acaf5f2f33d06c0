"""The plain-array problem the solvers share.

A pipeline of ``num_stages`` stages takes ``num_blocks`` identical blocks in contiguous
ranges, at least one each.  Every stage picks one *option* (in the search: a node class, a TP
degree and a replica count) and a block count ``nb``.  An option fixes, for the stage at
position ``s``:

- per-stage quantities ``q[k] = slope[k] * nb + fixed[s][k]`` (forward time, backward time,
  gradient-sync time less its overlap, optimizer time, ...), affine in ``nb`` because every
  block costs the same while the embedding and head add a constant at the ends;
- the largest ``nb`` that fits in memory at that position (``max_blocks[s]``; 0 = never);
- the least ``nb`` at that position (``min_blocks[s]``; None = 1 everywhere), e.g. a mixed
  stage's option holds only the block range over which one kind stays its slowest;
- the resources it holds: ``units`` GPUs of resource (node class) ``resource`` and, for such
  mixed stages, ``extra_uses`` (resource, units) pairs of other resources; and a price.

Adjacent stages add boundary quantities ``E[r] = boundary[r][o_s][o_{s+1}]`` (the pipeline
sends), a table over option pairs since they depend on both sides.

The objective is a sum of terms over *rows*; a row is a linear combination per stage of its
quantities and of the boundary quantities on its outgoing / incoming side.  A term is
``weight * max_s row_s`` (floored at 0) or ``weight * sum_s row_s``.  This one form holds
1F1B's ``(m-1) * max_s (F+B) + sum_s (F+B)``, GPipe's separate forward and backward maxima,
the exposed data-parallel sync ``max_s max(0, sync_s - overlap_s)`` and the optimizer step.
All weights and coefficients must be non-negative on boundary quantities (the MILP bounds
them from below only).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Row:
    stage: tuple[float, ...]                 # coefficient per stage quantity
    out: tuple[float, ...] = ()              # per boundary kind, boundary s -> s+1
    inn: tuple[float, ...] = ()              # per boundary kind, boundary s-1 -> s
    # each hinge adds max(0, hinge . q) (e.g. the exposed part of a sync that overlaps
    # compute); hinges may only appear in rows used by max terms
    hinges: tuple[tuple[float, ...], ...] = ()


@dataclass(frozen=True)
class Term:
    kind: str        # "max" (floored at 0), "sum", or "min" (the least stage's row; weight <= 0)
    row: int
    weight: float = 1.0

    def __post_init__(self):
        # a min term lowers the objective by its least stage: convex (a max of the negated
        # rows) only with a weight <= 0, which the MILP needs (it maximises that least value)
        if self.kind == "min" and self.weight > 0:
            raise ValueError(f"a min term needs a weight <= 0, got {self.weight}")

    def over_stages(self, values: np.ndarray, axis: int = -1):
        """The term's value, before its weight, from its row's value at each stage along
        ``axis``: the largest floored at 0, the least, or the sum."""
        if self.kind == "max":
            return np.maximum(0.0, values.max(axis=axis))
        return values.min(axis=axis) if self.kind == "min" else values.sum(axis=axis)


@dataclass
class CoreOption:
    resource: int
    units: int
    slope: tuple[float, ...]
    fixed: list[tuple[float, ...] | None]    # per stage position; None = not allowed there
    max_blocks: list[int]                    # per stage position; 0 = not allowed there
    price_usd_per_hour: float = 0.0
    label: Any = None
    group: Any = None                        # with CoreProblem.same_group: all stages agree on it
    # (resource, units) held besides the primary pair; resources distinct, none is ``resource``
    extra_uses: tuple[tuple[int, int], ...] = ()
    min_blocks: list[int] | None = None      # per stage position; None = 1 everywhere

    def uses(self) -> tuple[tuple[int, int], ...]:
        """Every (resource, units) the option holds, the primary pair first."""
        return ((self.resource, self.units), *self.extra_uses)

    def least_blocks(self, s: int) -> int:
        """The fewest blocks a stage at position ``s`` may hold with this option."""
        return 1 if self.min_blocks is None else max(1, self.min_blocks[s])

    def allowed(self, s: int) -> bool:
        return self.fixed[s] is not None and self.max_blocks[s] >= self.least_blocks(s)


@dataclass
class CoreProblem:
    num_blocks: int
    num_stages: int
    capacity: list[int]                      # per resource
    options: list[CoreOption]
    rows: list[Row]
    terms: list[Term]
    boundary: np.ndarray | None = None       # [R, K, K] or None
    budget_usd_per_hour: float | None = None
    wrap: bool = False                       # also a boundary from the last stage to the first
    resource_price: list[float] | None = None   # charged once when any option of it is used
    same_group: bool = False                 # every stage's option has the same ``group``

    @property
    def num_quantities(self) -> int:
        return len(self.options[0].slope) if self.options else 0

    @property
    def num_boundaries(self) -> int:
        """Boundary b joins stage b to stage b+1 (the last one wraps to stage 0 when ``wrap``)."""
        if self.num_stages < 2:
            return 0
        return self.num_stages if self.wrap else self.num_stages - 1

    @property
    def num_boundary_kinds(self) -> int:
        return 0 if self.boundary is None else int(self.boundary.shape[0])

    # -- evaluation of one assignment (the reference every solver is checked against) ----
    def stage_values(self, assign: Sequence[tuple[int, int]]) -> np.ndarray:
        """Row values per stage, shape [rows, stages]; ``assign`` = [(option, nb)] per stage."""
        p = self.num_stages
        q = np.array([[self.options[o].slope[k] * nb + self.options[o].fixed[s][k]
                       for k in range(self.num_quantities)] for s, (o, nb) in enumerate(assign)])
        R = self.num_boundary_kinds
        nb_ = self.num_boundaries
        e = np.zeros((nb_, R))
        for b in range(nb_):
            for r in range(R):
                e[b, r] = self.boundary[r, assign[b][0], assign[(b + 1) % p][0]]
        vals = np.zeros((len(self.rows), p))
        for j, row in enumerate(self.rows):
            for s in range(p):
                v = float(np.dot(row.stage, q[s]))
                for h in row.hinges:
                    v += max(0.0, float(np.dot(h, q[s])))
                if row.out and s < nb_:
                    v += float(np.dot(row.out, e[s]))
                if row.inn and (s > 0 or (self.wrap and nb_)):
                    v += float(np.dot(row.inn, e[(s - 1) % p]))
                vals[j, s] = v
        return vals

    def objective(self, assign: Sequence[tuple[int, int]]) -> float:
        vals = self.stage_values(assign)
        total = 0.0
        for t in self.terms:
            total += t.weight * float(t.over_stages(vals[t.row]))
        return total

    def units_by_resource(self) -> np.ndarray:
        """[options, resources] the units each option holds, extra uses included."""
        units = np.zeros((len(self.options), len(self.capacity)))
        for i, o in enumerate(self.options):
            for c, u in o.uses():
                units[i, c] += u
        return units

    def price(self, assign: Sequence[tuple[int, int]]) -> float:
        total = float(sum(self.options[o].price_usd_per_hour for o, _ in assign))
        if self.resource_price:
            for c in sorted({c for o, _ in assign for c, _ in self.options[o].uses()}):
                total += self.resource_price[c]
        return total

    def feasible(self, assign: Sequence[tuple[int, int]]) -> bool:
        if len(assign) != self.num_stages or sum(nb for _, nb in assign) != self.num_blocks:
            return False
        used = [0] * len(self.capacity)
        for s, (o, nb) in enumerate(assign):
            opt = self.options[o]
            if not opt.allowed(s) or not opt.least_blocks(s) <= nb <= opt.max_blocks[s]:
                return False
            for c, u in opt.uses():
                used[c] += u
        if any(u > c for u, c in zip(used, self.capacity)):
            return False
        if self.same_group and len({self.options[o].group for o, _ in assign}) > 1:
            return False
        return not (self.budget_usd_per_hour is not None and self.price(assign) > self.budget_usd_per_hour * (1 + 1e-12))


@dataclass
class CoreSolution:
    status: str                              # optimal | feasible | infeasible
    assign: list[tuple[int, int]] = field(default_factory=list)
    objective: float | None = None           # recomputed from the assignment
    bound: float | None = None               # proved lower bound on the optimum
    gap: float | None = None
    nodes: int = 0                           # solver work (MIP nodes, DP cells, leaves)

    @property
    def ok(self) -> bool:
        return self.status in ("optimal", "feasible")


def relative_gap(value: float, bound: float) -> float:
    if value <= 0:
        return 0.0
    return max(0.0, (value - bound) / abs(value))


def quick_bound(prob: CoreProblem) -> float | None:
    """A cheap lower bound on the objective (for pruning knob tuples).  None: some stage has
    no allowed option (infeasible).

    Sum of a row over stages: at least ``L * min slope + sum_s min fixed`` (block counts sum to
    L; boundary quantities are >= 0 and dropped).  A max term is at least the mean of that
    sum, and, for rows whose per-stage intercepts are >= 0, at least ``L / S`` where S bounds
    the total "speed" (blocks per second, 1 / slope) the stages can have together: each class
    gives at most its capacity times its best speed per unit, and p stages at most p times the
    fastest option.

    Least block counts (``min_blocks``) and extra resource uses (``extra_uses``) are left
    out: dropping constraints only widens the set of assignments, so the bound stays below
    the optimum.  The per-resource arguments group the stages by their option's primary
    resource: each group's primary units alone fit in that resource's capacity (the extras
    only take more), and speed per primary unit is at least speed per unit over all the
    units an option holds, so the speed cap only grows.
    """
    p, L = prob.num_stages, prob.num_blocks
    total = 0.0
    for t in prob.terms:
        row = prob.rows[t.row]
        if t.kind == "min":
            least = least_stage_most(prob, row)
            if least is None:
                return None
            total += t.weight * least
            continue
        if row.hinges:
            continue                                # >= 0; nothing cheaper to say
        slopes = [float(np.dot(row.stage, o.slope)) for o in prob.options]
        if not slopes:
            return None
        fixed_sum, nonneg = 0.0, True
        for s in range(p):
            vals = [float(np.dot(row.stage, o.fixed[s])) for o in prob.options if o.allowed(s)]
            if not vals:
                return None
            fixed_sum += min(vals)
            nonneg &= min(vals) >= 0
        S = L * min(slopes) + fixed_sum
        # memory: a stage holds at most max_blocks[s] blocks, which cheap fast options often cannot
        A = np.array(slopes)
        U = np.array([[o.max_blocks[s] if o.allowed(s) else 0 for s in range(p)] for o in prob.options],
                     dtype=float)
        greedy = sum_slope_bound(L, A, U)
        if not math.isfinite(greedy):
            return None
        S = max(S, greedy + fixed_sum)
        speed = 0.0
        if nonneg and min(slopes) > 0:
            per_class: dict[int, float] = {}
            # per primary unit only (see the docstring): an over-estimate for mixed options
            for o, a in zip(prob.options, slopes):
                per_class[o.resource] = max(per_class.get(o.resource, 0.0), 1.0 / a / o.units)
            speed = sum(prob.capacity[c] * r for c, r in per_class.items())
            # Cauchy-Schwarz on sum_s nb_s / w_s with the stages' speeds w_s summing to <= speed
            S = max(S, (p - 1 + math.sqrt(L - p + 1)) ** 2 / speed + fixed_sum)
        if t.kind == "sum":
            total += t.weight * S
            continue
        best = max(0.0, S / p)
        if speed > 0:
            best = max(best, L / min(speed, p / min(slopes)))
        if min(slopes) > 0:
            F = np.array([[float(np.dot(row.stage, o.fixed[s])) if o.allowed(s) else math.inf
                           for s in range(p)] for o in prob.options])
            mb = max_row_bound(L, A, U, F, [o.units for o in prob.options],
                               [o.resource for o in prob.options], prob.capacity)
            if not math.isfinite(mb):
                return None
            best = max(best, mb)
        total += t.weight * best
    return total


def least_stage_most(prob: CoreProblem, row: Row) -> float | None:
    """An upper bound on ``min_s row(s)`` over the assignments (a min term's weight is <= 0,
    so this bounds it from below): some stage holds at most ``floor(L / p)`` blocks, and its
    row (sends left out: the core's boundary quantities are >= 0, so rows with sends on
    them are not for min terms) is at most the largest of any option's at 1 or that many
    blocks (affine in the blocks) at any position.  None: some stage has no option."""
    p, L = prob.num_stages, prob.num_blocks
    if row.out or row.inn or row.hinges:
        raise ValueError("a min term's row reads the stage quantities only")
    k = max(1, L // p)
    most = -math.inf
    for s in range(p):
        vals = [float(np.dot(row.stage, o.fixed[s])) + float(np.dot(row.stage, o.slope)) * nb
                for o in prob.options if o.allowed(s) for nb in (1, k)]
        if not vals:
            return None
        most = max(most, max(vals))
    return most


def _capacity_ok(M: float, L: int, A: np.ndarray, U: np.ndarray, F: np.ndarray, per_unit: np.ndarray,
                 groups: list[tuple[float, np.ndarray]], weights: np.ndarray) -> bool:
    """Can stages whose row (``A nb + F``) is at most M hold L blocks?  Two necessary
    conditions: per stage position, the most blocks any option can take (every position at
    least one); per resource, its capacity times the most blocks per unit of any option."""
    with np.errstate(invalid="ignore", over="ignore"):
        nb = np.floor((M - F) / A[:, None] * (1 + 1e-12) + 1e-9)
    nb = np.minimum(np.maximum(nb, 0.0), U)
    per_pos = nb.max(axis=0)
    if (per_pos < 1).any() or float(per_pos @ weights) < L:
        return False
    ratio = nb.max(axis=1) * per_unit
    return sum(cap * float(ratio[mask].max()) for cap, mask in groups) >= L


def max_row_bound(L: int, A, U, F=None, units=None, resource=None, capacity=None, weights=None,
                  rel_tol: float = 1e-9) -> float:
    """Lower bound on ``max_s (A[o_s] nb_s + F[o_s, s])`` over assignments of L blocks to
    stages (1 <= nb_s <= U[o_s, s]); ``inf`` when no assignment exists.

    ``U``, ``F``: shape [K, P] (P stage positions, each standing for ``weights[j]`` stages;
    ``U = 0`` / ``F = inf`` where an option is not allowed).  With ``units``, ``resource`` and
    ``capacity`` the resources' capacities also bound the blocks.  Needs every ``A > 0``.
    The least M passing both conditions of ``_capacity_ok`` (monotone in M) by bisection; the
    infeasible end is returned, so rounding can only lower the bound (stopping once the bracket
    is within ``rel_tol`` of it)."""
    A = np.asarray(A, dtype=float)
    U = np.asarray(U, dtype=float)
    K, P = U.shape
    F = np.zeros((K, P)) if F is None else np.asarray(F, dtype=float)
    weights = np.ones(P) if weights is None else np.asarray(weights, dtype=float)
    if K == 0:
        return math.inf
    if units is None:
        per_unit = np.ones(K)
        groups = [(math.inf, np.ones(K, dtype=bool))]
    else:
        per_unit = 1.0 / np.asarray(units, dtype=float)
        res = np.asarray(resource)
        groups = [(float(capacity[c]), res == c) for c in np.unique(res)]
    ok_mask = (U >= 1) & np.isfinite(F)
    if not ok_mask.any():
        return math.inf
    U = np.where(ok_mask, U, 0.0)
    F = np.where(ok_mask, F, np.inf)
    hi = float(np.max(np.where(ok_mask, A[:, None] * U + F, -np.inf)))
    if not _capacity_ok(hi, L, A, U, F, per_unit, groups, weights):
        return math.inf
    lo = float(np.min(np.where(ok_mask, A[:, None] + F, np.inf)))
    lo = lo - 1e-9 * max(1.0, abs(lo))
    if _capacity_ok(lo, L, A, U, F, per_unit, groups, weights):
        return lo
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi or hi - lo <= rel_tol * abs(hi):
            break
        if _capacity_ok(mid, L, A, U, F, per_unit, groups, weights):
            hi = mid
        else:
            lo = mid
    return lo


def sum_slope_bound(L: int, A, U, weights=None) -> float:
    """Lower bound on ``sum_s A[o_s] nb_s`` over L blocks (nb_s <= U[o_s, s]): blocks at a
    slope at most a fit only in stages whose option has a slope at most a, so at most
    ``N(a) = sum_j weights_j max{U[o, j] : A_o <= a}`` of them; the k-th cheapest block costs
    at least the least a with N(a) >= k.  ``inf`` when even N(max A) < L."""
    A = np.asarray(A, dtype=float)
    U = np.asarray(U, dtype=float)
    if not len(A):
        return math.inf
    weights = np.ones(U.shape[1]) if weights is None else np.asarray(weights, dtype=float)
    order = np.argsort(A, kind="stable")
    N = np.minimum(np.maximum.accumulate(U[order], axis=0) @ weights, L)
    if N[-1] < L:
        return math.inf
    got = np.diff(np.concatenate([[0.0], N]))
    return float(A[order] @ got)
