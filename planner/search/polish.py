"""Local search from a feasible assignment of a CoreProblem: a better incumbent, no proof.

The exact solvers run out of time on long pipelines over many options (scenario c's 12-stage
tuples); the warm start solves them on a few options each.  From the plan it finds, moves
that change one or two stages are priced all at once (numpy over the candidates) and the best
improving one is taken, until none improves:

- shift one block unit from one stage to another;
- change one stage's option (another replica count, TP degree or class), keeping its blocks;
- change one stage's option and shift one unit between it and another stage (a faster option
  takes more blocks, a slower one gives some away);
- swap two stages (the order decides the sends and the in-flight memory);
- change two stages' options within their classes at once (units move between them).

Options of mixed stages hold units of more than one class (``CoreOption.extra_uses``) and may
need a least block count; the moves ignore both and ``Evaluator.feasible`` filters them.

Where no move improves, one that keeps the objective and evens the stages walks the plateau
(``Evaluator.scored``); at a local optimum the least bad moves are each followed by block
shifts alone (``_Search.look_ahead``).

``Evaluator`` prices a batch of whole assignments the way ``CoreProblem.objective`` prices one;
tests hold the two to each other.
"""

from __future__ import annotations

import numpy as np

from planner.search import clock
from planner.search.core.problem import CoreProblem

MAX_ROUNDS = 200
LOOK_AHEAD = 64          # non-improving moves followed by block shifts at a local optimum


class Evaluator:
    """A CoreProblem's objective and feasibility as arrays, for many assignments at once."""

    def __init__(self, prob: CoreProblem):
        self.prob = prob
        K, p, Q = len(prob.options), prob.num_stages, prob.num_quantities
        self.slope = np.array([o.slope for o in prob.options], dtype=float).reshape(K, Q)
        fixed = np.zeros((K, p, Q))
        self.max_blocks = np.zeros((K, p))
        self.min_blocks = np.ones((K, p))
        for i, o in enumerate(prob.options):
            for s in range(p):
                if o.allowed(s):
                    fixed[i, s] = o.fixed[s]
                    self.max_blocks[i, s] = o.max_blocks[s]
                    self.min_blocks[i, s] = o.least_blocks(s)
        self.fixed = fixed
        self.any_least = bool((self.min_blocks > 1).any())
        self.units = prob.units_by_resource()                  # [K, C]
        self.resource = np.array([o.resource for o in prob.options])       # the primary one
        self.capacity = np.array(prob.capacity, dtype=float)
        # per resource some option holds: its units per option, and who holds it (a column
        # each: gathering [N, p] per resource is faster than one [N, p, C] gather)
        self._held = [(c, np.ascontiguousarray(self.units[:, c]), self.units[:, c] > 0)
                      for c in range(self.units.shape[1]) if self.units[:, c].any()]
        self.boundary = prob.boundary
        self.price = np.array([o.price_usd_per_hour for o in prob.options], dtype=float)
        groups = {g: i for i, g in enumerate(dict.fromkeys(o.group for o in prob.options))}
        self.group = np.array([groups[o.group] for o in prob.options], dtype=int)

    def objective(self, opts: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """[N] objectives of N assignments (``opts``, ``blocks``: [N, p])."""
        return self.scored(opts, blocks)[0]

    def scored(self, opts: np.ndarray, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[N] objectives and [N] tie-breakers: the sum of squares of the max terms' rows.  A
        max stays put while two stages share it; the squares fall as the stages even out, so
        local search can walk along such a plateau to the move that lowers the max."""
        prob = self.prob
        N, p = opts.shape
        stages = np.arange(p)
        q = self.slope[opts] * blocks[..., None] + self.fixed[opts, stages]        # [N, p, Q]
        E = self._boundaries(opts)
        total = np.zeros(N)
        spread = np.zeros(N)
        vals = []
        for row in prob.rows:
            v = q @ np.asarray(row.stage, dtype=float)                            # [N, p]
            for h in row.hinges:
                v = v + np.maximum(0.0, q @ np.asarray(h, dtype=float))
            vals.append(v + self._sends(E, row, p))
        for t in prob.terms:
            v = vals[t.row]
            total += t.weight * t.over_stages(v, axis=1)
            if t.kind == "max":
                spread += t.weight * (np.maximum(0.0, v) ** 2).sum(axis=1)
        return total, spread

    def sends(self, opts: np.ndarray, row: int) -> np.ndarray:
        """[N, p] what the boundary sends add to row ``row`` of each stage (each stage's send
        out of it and into it, as the row weighs them)."""
        return self._sends(self._boundaries(opts), self.prob.rows[row], opts.shape[1])

    def _boundaries(self, opts: np.ndarray) -> np.ndarray:
        """[N, boundaries, kinds] each boundary's quantities between its two stages' options."""
        prob = self.prob
        N, p = opts.shape
        nb_ = prob.num_boundaries
        E = np.zeros((N, nb_, prob.num_boundary_kinds))
        for r in range(prob.num_boundary_kinds):
            for b in range(nb_):
                E[:, b, r] = self.boundary[r, opts[:, b], opts[:, (b + 1) % p]]
        return E

    def _sends(self, E: np.ndarray, row, p: int) -> np.ndarray:
        nb_ = E.shape[1]
        v = np.zeros((E.shape[0], p))
        if row.out and nb_:
            v[:, :nb_] += E @ np.asarray(row.out, dtype=float)
        if row.inn and nb_:
            inn = E @ np.asarray(row.inn, dtype=float)                              # [N, nb_]
            v[:, 1:] += inn[:, :p - 1]
            if self.prob.wrap:
                v[:, 0] += inn[:, p - 1]
        return v

    def feasible(self, opts: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """[N] booleans: memory and least block counts per position, capacities (every resource
        an option holds), budget, groups."""
        prob = self.prob
        p = opts.shape[1]
        stages = np.arange(p)
        cap = self.max_blocks[opts, stages]
        least = self.min_blocks[opts, stages] if self.any_least else 1
        ok = ((blocks >= least) & (blocks <= cap)).all(axis=1)
        ok &= blocks.sum(axis=1) == prob.num_blocks
        for c, units, _ in self._held:
            ok &= units[opts].sum(axis=1) <= self.capacity[c]
        if prob.same_group:
            g = self.group[opts]
            ok &= (g == g[:, :1]).all(axis=1)
        if prob.budget_usd_per_hour is not None:
            ok &= self.price_usd_per_hour(opts) <= prob.budget_usd_per_hour * (1 + 1e-12)
        return ok

    def price_usd_per_hour(self, opts: np.ndarray) -> np.ndarray:
        """[N] prices, as ``CoreProblem.price``: the options' prices and, once per resource
        used, its resource price."""
        total = self.price[opts].sum(axis=1)
        rp = self.prob.resource_price or []
        for c, _, holds in self._held:
            if c < len(rp) and rp[c]:
                total = total + rp[c] * holds[opts].any(axis=1)
        return total


def _shifts(opts: np.ndarray, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every one-unit block shift between two stages, as [N, p] arrays."""
    p = len(opts)
    ii, jj = np.nonzero(~np.eye(p, dtype=bool))
    o1 = np.repeat(opts[None], len(ii), axis=0)
    b1 = np.repeat(blocks[None], len(ii), axis=0)
    b1[np.arange(len(ii)), ii] -= 1
    b1[np.arange(len(ii)), jj] += 1
    return o1, b1


def _moves(opts: np.ndarray, blocks: np.ndarray, same_resource: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Every assignment one move away (see the module docstring), as [N, p] arrays."""
    p, K = len(opts), len(same_resource)
    o1, b1 = _shifts(opts, blocks)
    cand_o, cand_b = [o1], [b1]
    # option changes at s, with no shift or one unit to / from each other stage
    for s in range(p):
        o2 = np.repeat(opts[None], K, axis=0)
        o2[:, s] = np.arange(K)
        b2 = np.repeat(blocks[None], K, axis=0)
        cand_o.append(o2)
        cand_b.append(b2)
        for j in range(p):
            if j == s:
                continue
            for d in (1, -1):
                b3 = b2.copy()
                b3[:, s] += d
                b3[:, j] -= d
                cand_o.append(o2)
                cand_b.append(b3)
    # two stages trade places (the order decides the sends and the in-flight memory)
    for s in range(p):
        for j in range(s + 1, p):
            o4, b4 = opts.copy(), blocks.copy()
            o4[[s, j]] = o4[[j, s]]
            b4[[s, j]] = b4[[j, s]]
            cand_o.append(o4[None])
            cand_b.append(b4[None])
    # two stages change option within their resources at once (units move between them)
    for s in range(p):
        for j in range(s + 1, p):
            a, b = np.meshgrid(same_resource[opts[s]], same_resource[opts[j]], indexing="ij")
            o5 = np.repeat(opts[None], a.size, axis=0)
            o5[:, s], o5[:, j] = a.ravel(), b.ravel()
            cand_o.append(o5)
            cand_b.append(np.repeat(blocks[None], a.size, axis=0))
    return np.concatenate(cand_o), np.concatenate(cand_b)


class _Search:
    """Steepest descent with a plateau rule (see ``Evaluator.scored``) over a move set."""

    def __init__(self, ev: Evaluator, deadline: float | None):
        self.ev, self.deadline = ev, deadline
        res = ev.resource
        self.same_resource = [np.nonzero(res == res[o])[0] for o in range(len(res))]

    def out_of_time(self) -> bool:
        return self.deadline is not None and clock.now() > self.deadline

    def candidates(self, opts, blocks, shifts_only: bool):
        co, cb = _shifts(opts, blocks) if shifts_only else _moves(opts, blocks, self.same_resource)
        ok = self.ev.feasible(co, cb)
        co, cb = co[ok], cb[ok]
        val, ties = self.ev.scored(co, cb)
        return co, cb, val, ties

    def descend(self, opts, blocks, val: float, tie: float, shifts_only: bool = False):
        for _ in range(MAX_ROUNDS):
            if self.out_of_time():
                break
            co, cb, vals, ties = self.candidates(opts, blocks, shifts_only)
            if not len(vals):
                break
            i = int(np.argmin(vals))
            if not vals[i] < val * (1 - 1e-12):
                # no move lowers the objective: the move that keeps it and evens the stages most
                level = vals <= val * (1 + 1e-12)
                if not level.any():
                    break
                i = int(np.flatnonzero(level)[np.argmin(ties[level])])
                if not ties[i] < tie * (1 - 1e-9):
                    break
            val, tie, opts, blocks = float(vals[i]), float(ties[i]), co[i], cb[i]
        return opts, blocks, val, tie

    def look_ahead(self, opts, blocks, val: float):
        """From a local optimum: the LOOK_AHEAD least-bad moves, each followed by block shifts
        alone; the first to end below ``val`` (a change of option that pays only once the
        blocks move over several units), or None."""
        co, cb, vals, ties = self.candidates(opts, blocks, shifts_only=False)
        order = np.argsort(vals, kind="stable")
        seen = set()
        for i in order:
            if self.out_of_time() or len(seen) >= LOOK_AHEAD:
                break
            sig = (co[i].tobytes(), cb[i].tobytes())
            if sig in seen:
                continue
            seen.add(sig)
            o, b, v, t = self.descend(co[i], cb[i], float(vals[i]), float(ties[i]), shifts_only=True)
            if v < val * (1 - 1e-12):
                return o, b, v, t
        return None


def polish(prob: CoreProblem, assign: list[tuple[int, int]],
           deadline: float | None = None) -> tuple[float, list[tuple[int, int]]]:
    """The best assignment local search reaches from ``assign`` (feasible), with its objective;
    ``assign`` itself when no move improves it.  Stops at ``deadline`` (clock.now())."""
    ev = Evaluator(prob)
    search = _Search(ev, deadline)
    opts = np.array([o for o, _ in assign])
    blocks = np.array([nb for _, nb in assign])
    v0, t0 = ev.scored(opts[None], blocks[None])
    state = (opts, blocks, float(v0[0]), float(t0[0]))
    while not search.out_of_time():
        state = search.descend(*state)
        ahead = search.look_ahead(state[0], state[1], state[2])
        if ahead is None:
            break
        state = ahead
    out = [(int(o), int(b)) for o, b in zip(state[0], state[1])]
    return float(prob.objective(out)), out
