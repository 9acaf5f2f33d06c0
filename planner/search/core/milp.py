"""The MILP over a CoreProblem (pulp; HiGHS through highspy, CBC where highspy is missing).

Variables: ``x[s,o]`` (stage s uses option o), ``y[s,o]`` (its block count, 0 unless x),
``E[b,r]`` (boundary quantity r between stages b and b+1) and one ``M[t]`` per max term.
Stage quantities are affine in ``y`` and ``x``; a boundary quantity depends on the options of
both neighbours and is bounded from below by, for each option o of the sender,
``E >= sum_o' T[o,o'] x[b+1,o'] - max_o' T[o,o'] (1 - x[b,o])``: exact at the optimum
because exactly one o' is chosen and every coefficient on E is non-negative.  Max terms are
``M >= row_s`` for every s; memory is the upper bound on ``y`` per (option, position), and
an option's least block count (``min_blocks``) the lower bound ``y >= lo x``.  Capacity rows
count every resource an option holds (``CoreOption.uses``), and so does the indicator that
charges a resource's price once.
"""

from __future__ import annotations

import math
import time
import warnings

import pulp

from planner.search import clock
from planner.search.core.guard import solver_output_silenced
from planner.search.core.highs import HAVE_HIGHS, MilpSettings, ctrl_c_stops_highs, make_solver
from planner.search.core.problem import CoreProblem, CoreSolution, relative_gap

NUMERICAL_GAP = 1e-6


class CoreMilp:
    """Build once, solve repeatedly (no-good cuts for top-k, price / time caps)."""

    def __init__(self, prob: CoreProblem):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*PuLP 4.0.*", category=DeprecationWarning)
            self._build(prob)

    def _build(self, prob: CoreProblem) -> None:
        self.prob = prob
        p, L = prob.num_stages, prob.num_blocks
        lp = pulp.LpProblem("placement", pulp.LpMinimize)
        self.lp = lp
        self.x: dict[tuple[int, int], pulp.LpVariable] = {}
        self.y: dict[tuple[int, int], pulp.LpVariable] = {}
        for s in range(p):
            for o, opt in enumerate(prob.options):
                if not opt.allowed(s):
                    continue
                lo = opt.least_blocks(s)
                hi = min(opt.max_blocks[s], L - (p - 1))
                if hi < lo:
                    continue
                self.x[s, o] = pulp.LpVariable(f"x_{s}_{o}", cat="Binary")
                self.y[s, o] = pulp.LpVariable(f"y_{s}_{o}", lowBound=0, upBound=hi, cat="Integer")
                lp += self.y[s, o] >= lo * self.x[s, o]
                lp += self.y[s, o] <= hi * self.x[s, o]
        self.by_stage = {s: [o for (s2, o) in self.x if s2 == s] for s in range(p)}
        self.empty_stage = any(not v for v in self.by_stage.values())
        for s in range(p):
            lp += pulp.lpSum(self.x[s, o] for o in self.by_stage[s]) == 1
        lp += pulp.lpSum(self.y.values()) == L
        # every (resource, units) an option holds, mixed stages' extra uses included
        holders: dict[int, list[tuple[pulp.LpVariable, int]]] = {c: [] for c in range(len(prob.capacity))}
        for (s, o), v in self.x.items():
            for c, units in prob.options[o].uses():
                holders.setdefault(c, []).append((v, units))
        for c, cap in enumerate(prob.capacity):
            if holders[c]:
                lp += _affine(holders[c]) <= cap
        price = [prob.options[o].price_usd_per_hour * v for (s, o), v in self.x.items()]
        for c, cost in enumerate(prob.resource_price or []):
            if cost:
                u = pulp.LpVariable(f"u_{c}", cat="Binary")
                for v, _ in holders.get(c, []):
                    lp += u >= v
                price.append(cost * u)
        self.price = pulp.lpSum(price)
        if prob.same_group:
            groups = sorted({prob.options[o].group for (_, o) in self.x}, key=repr)
            z = {g: pulp.LpVariable(f"g_{i}", cat="Binary") for i, g in enumerate(groups)}
            lp += pulp.lpSum(z.values()) == 1
            for (s, o), v in self.x.items():
                lp += v <= z[prob.options[o].group]
        if prob.budget_usd_per_hour is not None:
            lp += self.price <= prob.budget_usd_per_hour
        self._boundaries()
        self.obj = self._objective()
        self.cuts = 0

    def _boundaries(self) -> None:
        prob, p = self.prob, self.prob.num_stages
        used = set()
        for row in prob.rows:
            used |= {r for r, c in enumerate(row.out) if c} | {r for r, c in enumerate(row.inn) if c}
        self.E: dict[tuple[int, int], pulp.LpVariable] = {}
        for b in range(prob.num_boundaries):
            b2 = (b + 1) % p
            for r in sorted(used):
                T = prob.boundary[r]
                e = pulp.LpVariable(f"E_{b}_{r}", lowBound=0)
                self.E[b, r] = e
                here, nxt = self.by_stage[b], self.by_stage[b2]
                for o in here:
                    self._send_bound(e, self.x[b, o], [(float(T[o, o2]), self.x[b2, o2]) for o2 in nxt])
                # the same bound seen from the receiver tightens the LP relaxation
                for o2 in nxt:
                    self._send_bound(e, self.x[b2, o2], [(float(T[o, o2]), self.x[b, o]) for o in here])

    def _send_bound(self, e, chosen, vals: list) -> None:
        """``e >= sum_v v x_v - big (1 - chosen)``, written as ``sum v x_v + big chosen - e <=
        big`` and built from (variable, coefficient) pairs: pulp's operators build one
        expression per term, and these pairwise rows are most of a MILP's set-up time."""
        big = max((v for v, _ in vals), default=0.0)
        if big <= 0:
            return
        terms = [(x, v) for v, x in vals if v]
        terms += [(chosen, big), (e, -1.0)]
        self.lp.addConstraint(pulp.LpConstraint(_affine(terms), pulp.LpConstraintLE, rhs=big))

    def _row_terms(self, j: int, s: int) -> list[tuple]:
        """Row j of stage s as (variable, coefficient) pairs: its options' slopes on y and
        intercepts on x, and its send variables."""
        prob, row = self.prob, self.prob.rows[j]
        terms = []
        for o in self.by_stage[s]:
            opt = prob.options[o]
            a = sum(c * opt.slope[k] for k, c in enumerate(row.stage))
            f = sum(c * opt.fixed[s][k] for k, c in enumerate(row.stage))
            if a:
                terms.append((self.y[s, o], a))
            if f:
                terms.append((self.x[s, o], f))
        for r, c in enumerate(row.out):
            if c and (s, r) in self.E:
                terms.append((self.E[s, r], c))
        p = prob.num_stages
        for r, c in enumerate(row.inn):
            if c and ((s - 1) % p, r) in self.E and (s > 0 or prob.wrap):
                terms.append((self.E[(s - 1) % p, r], c))
        return terms

    def _hinge_terms(self, j: int, s: int) -> list[tuple]:
        """Per-stage hinge variables h >= max(0, hinge . q_s) (exact under a minimised max), as
        (variable, 1) pairs to add to the row."""
        prob, row = self.prob, self.prob.rows[j]
        hs = []
        for k, h in enumerate(row.hinges):
            expr = []
            for o in self.by_stage[s]:
                opt = prob.options[o]
                a = sum(c * opt.slope[i] for i, c in enumerate(h))
                f = sum(c * opt.fixed[s][i] for i, c in enumerate(h))
                if a:
                    expr.append((self.y[s, o], a))
                if f:
                    expr.append((self.x[s, o], f))
            v = pulp.LpVariable(f"h_{j}_{k}_{s}", lowBound=0)
            self._at_most(expr, v)
            hs.append((v, 1.0))
        return hs

    def _at_most(self, terms: list[tuple], bound_var) -> None:
        """``sum terms <= bound_var``, built from pairs: pulp's operators build one expression
        per term, which made most of a MILP's set-up time."""
        self.lp.addConstraint(pulp.LpConstraint(_affine(terms + [(bound_var, -1.0)]), pulp.LpConstraintLE, rhs=0.0))

    def _objective(self):
        prob, p = self.prob, self.prob.num_stages
        parts = []
        for t_i, t in enumerate(prob.terms):
            if t.kind == "max":
                m = pulp.LpVariable(f"M_{t_i}", lowBound=0)
                for s in range(p):
                    terms = self._row_terms(t.row, s)
                    if prob.rows[t.row].hinges:
                        terms += self._hinge_terms(t.row, s)
                    self._at_most(terms, m)
                parts.append((m, t.weight))
            elif t.kind == "min":
                # weight <= 0: the least row is maximised, so z at most every stage's row is it
                z = pulp.LpVariable(f"Z_{t_i}")
                for s in range(p):
                    expr = _affine([(z, 1.0)] + [(v, -c) for v, c in self._row_terms(t.row, s)])
                    self.lp.addConstraint(pulp.LpConstraint(expr, pulp.LpConstraintLE, rhs=0.0))
                parts.append((z, t.weight))
            else:
                parts += [(v, t.weight * c) for s in range(p) for v, c in self._row_terms(t.row, s)]
        return _affine(parts)

    # -- solving ---------------------------------------------------------------------------
    def _read(self, x_only=False) -> list[tuple[int, int]]:
        out = []
        for s in range(self.prob.num_stages):
            o = max(self.by_stage[s], key=lambda o: self.x[s, o].value() or 0.0)
            out.append((o, round(self.y[s, o].value() or 0)))
        return out

    def _run(self, settings: MilpSettings, deadline: float, cutoff: float | None = None):
        work = clock.active()
        if work is None:
            solver = make_solver(settings, deadline - time.monotonic(), cutoff)
        else:
            # a deterministic search: HiGHS stops at the nodes the work budget has left, the
            # wall clock only at the user's guard (clock.py)
            left = work.units_left(deadline)        # inf: no deadline but the wall guard
            nodes = max(1, int(left // clock.MILP_NODE_UNITS)) if math.isfinite(left) else None
            solver = make_solver(settings, work.wall_stop - time.monotonic(), cutoff, max_nodes=nodes)
        with solver_output_silenced(), ctrl_c_stops_highs():
            self.lp.solve(solver)
        info = None
        if HAVE_HIGHS and getattr(self.lp, "solverModel", None) is not None:
            try:
                info = self.lp.solverModel.getInfo()
            except Exception:  # noqa: BLE001 - CBC or an older highspy: no info
                info = None
        if info is not None:
            clock.charge(clock.MILP_NODE_UNITS * max(0, int(getattr(info, "mip_node_count", 0) or 0))
                         + max(0, int(getattr(info, "simplex_iteration_count", 0) or 0)))
        return self.lp.status, self.lp.sol_status, info

    def solve(self, settings: MilpSettings, mode: str = "time", time_cap: float | None = None,
              deadline: float | None = None, cutoff: float | None = None) -> CoreSolution:
        """``mode="time"``: min objective.  ``mode="price"``: min price with objective <= cap.

        ``cutoff``: only solutions below it are of interest (a constraint ``objective <=
        cutoff`` on the mode's objective, the time or the price; HiGHS's ``objective_bound``
        option made a 1f1b tuple of the README job run past every time limit); when none
        exists the status is ``cutoff`` and ``bound`` the cutoff.
        """
        deadline = deadline or clock.now() + settings.time_limit_s
        if self.empty_stage:
            return CoreSolution(status="infeasible")
        extra = []
        if mode == "price":
            if time_cap is not None:
                extra.append(self.obj <= time_cap)
            self.lp.setObjective(self.price)
        else:
            self.lp.setObjective(self.obj)
        if cutoff is not None and math.isfinite(cutoff):
            extra.append((self.price if mode == "price" else self.obj) <= cutoff)
        names = []
        for i, c in enumerate(extra):
            name = f"cap_{i}_{id(c)}"
            self.lp.addConstraint(c, name)
            names.append(name)
        try:
            status, sol_status, info = self._run(settings, deadline)
        finally:
            with warnings.catch_warnings():   # pulp 3.3 deprecates the dict view; 3.x has no other
                warnings.simplefilter("ignore", DeprecationWarning)
                for name in names:
                    del self.lp.constraints[name]
        if sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            if sol_status == pulp.LpSolutionInfeasible or status == pulp.LpStatusInfeasible:
                if cutoff is not None and math.isfinite(cutoff):
                    return CoreSolution(status="cutoff", bound=cutoff)
                return CoreSolution(status="infeasible")
            bound = None
            if info is not None and math.isfinite(info.mip_dual_bound):
                bound = float(info.mip_dual_bound)
                if cutoff is not None and math.isfinite(cutoff):
                    bound = min(bound, cutoff)     # it bounds the solutions under the cutoff only
            return CoreSolution(status="unknown", bound=bound)
        if cutoff is not None and math.isfinite(cutoff) and info is not None and \
                math.isfinite(info.mip_dual_bound) and info.mip_dual_bound >= cutoff * (1 - 1e-12):
            return CoreSolution(status="cutoff", bound=float(info.mip_dual_bound))
        assign = self._read()
        over_cap = mode == "price" and time_cap is not None and \
            self.prob.objective(assign) > time_cap * (1 + 1e-9)
        if not self.prob.feasible(assign) or over_cap:
            # a solve stopped by the wall-clock interrupt may report an integer-feasible status
            # with values that are no solution (once on the README job a warm start priced a
            # 14 s job at 4.8 s and the search then crashed); never hand such values on.  The
            # dual bound still holds.
            bound = None
            if info is not None and math.isfinite(info.mip_dual_bound):
                bound = float(info.mip_dual_bound)
                if cutoff is not None and math.isfinite(cutoff):
                    bound = min(bound, cutoff)
            return CoreSolution(status="unknown", bound=bound)
        value = self.prob.objective(assign) if mode == "time" else self.prob.price(assign)
        solver_value = pulp.value(self.lp.objective)
        bound = None
        nodes = 0
        if info is not None:
            bound = float(info.mip_dual_bound) if math.isfinite(info.mip_dual_bound) else None
            nodes = int(getattr(info, "mip_node_count", 0) or 0)
        # HiGHS proves optimality up to its feasibility tolerances (1e-6 relative on the
        # bound); a dual bound within that of the value counts as proved.
        if bound is None and sol_status == pulp.LpSolutionOptimal and settings.gap_rel == 0:
            bound = solver_value
        if bound is not None:
            bound = min(bound, value)
        gap = relative_gap(value, bound) if bound is not None else None
        optimal = sol_status == pulp.LpSolutionOptimal and gap is not None and gap <= NUMERICAL_GAP
        return CoreSolution(status="optimal" if optimal else "feasible",
                            assign=assign, objective=value, bound=bound, gap=gap, nodes=nodes)

    def exclude(self, assign: list[tuple[int, int]]) -> None:
        """No-good cut: forbid this option sequence (any block split of it)."""
        self.cuts += 1
        self.lp += (pulp.lpSum(self.x[s, o] for s, (o, _) in enumerate(assign))
                    <= self.prob.num_stages - 1), f"nogood_{self.cuts}"


def _affine(pairs) -> pulp.LpAffineExpression:
    """sum coef * var over (var, coef) pairs; a variable named twice gets both coefficients
    (``LpAffineExpression(pairs)`` would keep only the last)."""
    out = pulp.LpAffineExpression()
    for v, c in pairs:
        out.addterm(v, c)
    return out


def solve_milp(prob: CoreProblem, settings: MilpSettings | None = None, mode: str = "time",
               time_cap: float | None = None, top_k: int = 1) -> list[CoreSolution]:
    settings = settings or MilpSettings()
    deadline = clock.now() + settings.time_limit_s
    model = CoreMilp(prob)
    out = []
    for _ in range(top_k):
        sol = model.solve(settings, mode=mode, time_cap=time_cap, deadline=deadline)
        if not sol.ok:
            if not out:
                out.append(sol)
            break
        out.append(sol)
        model.exclude(sol.assign)
    return out
