"""Small exact pieces of the space: replica counts, shares, the busiest points of a stage
boundary, and memory limits in block units."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np


def shares(B: int, n: int) -> list[int]:
    """Even split of B sequences over n replicas, the larger shares first."""
    q, r = divmod(B, n)
    return [q + 1] * r + [q] * (n - r)


@lru_cache(maxsize=4096)
def replica_counts(B: int) -> tuple[int, ...]:
    """The declared replica counts: the fewest replicas giving each largest share."""
    return tuple(sorted({-(-B // q) for q in range(1, B + 1)}))


def _max_units(cap: float, base: float, per_u: float, exact: bool, mem, L_units: int) -> int:
    """Largest block count (in core units) whose memory ``base + per_u u`` fits ``cap``; the
    cost model's own function settles the last unit wherever rounding could matter."""
    hi = L_units if per_u <= 0 else int(min(L_units, max(0, math.floor((cap - base) / per_u))))
    if exact and not any(abs(base + per_u * u - cap) <= 1e-6 * cap for u in (hi, hi + 1)):
        return hi
    while hi >= 1 and mem(hi) > cap:
        hi -= 1
    while hi < L_units and mem(hi + 1) <= cap:
        hi += 1
    return hi


def model_units(model, cap: float, f: float, d: float, L_units: int) -> int:
    """``_max_units`` of a ``Pricer.memory_model`` (coefficients, exact, mem) at f micro-batches
    in flight, d of them waiting for their W: ``c0 + c2 f + (c1 + c3 f + c4 d) u``."""
    (c0, c1, c2, c3, c4), exact, mem = model
    return _max_units(cap, c0 + c2 * f, c1 + c3 * f + c4 * d, exact, lambda u: mem(u, f, d), L_units)


def block_limits(coef: np.ndarray, exact: np.ndarray, caps: np.ndarray, in_flight: np.ndarray,
                 L: int, deferred: np.ndarray | None = None) -> np.ndarray:
    """[K, F] the most block units each option fits in memory with each of F in-flight
    micro-batch counts (and ``deferred[j]`` of them waiting for their W): its memory model
    ``c0 + c1 u + f (c2 + c3 u) + c4 u d`` (``coef`` [K, 5]) under its GPU's capacity (``caps``
    [K]), rounded down with a hair of slack (the knob bounds only need a limit at least the
    true one); L where the model is not affine (no limit)."""
    f = np.asarray(in_flight, dtype=float)[None, :]
    d = np.zeros_like(f) if deferred is None else np.asarray(deferred, dtype=float)[None, :]
    c0, c1, c2, c3, c4 = (coef[:, i, None] for i in range(5))
    room, per_u = caps[:, None] - c0 - c2 * f, c1 + c3 * f + c4 * d
    with np.errstate(divide="ignore", invalid="ignore"):
        U = np.where(per_u > 0, np.floor(room / per_u * (1 + 1e-9) + 1e-9), np.where(room >= 0, L, 0))
    return np.clip(np.where(exact[:, None], U, L), 0, L)


@lru_cache(maxsize=65536)
def _busiest_points(B: int, na: int, nb: int) -> tuple[tuple[int, int], ...]:
    """(transfers, sequences) of the busiest senders and receivers of a boundary, in the
    layout of comm.boundary_bytes (sequences in replica order on both sides, larger shares
    first).  For each side and share value only the largest transfer count can be the max of
    ``c L0 + k X`` (L0, X >= 0), so at most four points come back."""
    def side(n_from: int, n_to: int):
        q, r = divmod(B, n_from)
        sizes = np.where(np.arange(n_from) < r, q + 1, q)
        start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        end = start + sizes - 1                           # last sequence held
        qt, rt = divmod(B, n_to)
        big = rt * (qt + 1)

        def owner(x):
            return np.where(x < big, x // (qt + 1), rt + (x - big) // max(qt, 1))

        counts = owner(end) - owner(start) + 1
        pts = []
        for share in (q + 1, q):
            mask = sizes == share
            if share > 0 and mask.any():
                pts.append((int(counts[mask].max()), int(share)))
        return pts

    return tuple(sorted(set(side(na, nb)) | set(side(nb, na))))


KNAPSACK_CELLS = 128     # capacity cells of most_speed's knapsack (a coarser unit beyond: c's classes have 512-768 nodes)


def most_speed(rates: np.ndarray, units: np.ndarray, classes: np.ndarray, capacity: list[int],
               max_stages: int, exact: bool = False) -> np.ndarray:
    """``out[k-1]``: the largest total rate (blocks per second, ``sum 1 / slope``) that at most
    ``k`` stages can have, one option each, within every class's capacity in units; for
    k = 1..max_stages.  ``exact``: exactly k stages (-inf where no k options fit): a pipeline
    of p stages holds p options, and the ones it does not need for speed still take units.
    Any per-option value adds up the same way: the packed bottleneck (packed.py) passes the
    blocks each option can hold.  The fractional bound
    (each class's capacity at its best rate per unit) ignores that a stage takes a whole
    option: one option often cannot use a class's last nodes, and p stages cannot all use the
    fastest.  An unbounded knapsack with a cardinality per class, then a max-plus combination
    over classes."""
    total = np.zeros(max_stages + 1)                      # with 0 stages: 0
    if exact:
        total[1:] = -np.inf
    for c in np.unique(classes):
        mask = classes == c
        # on a coarser grid of g units: floor(u / g) summed is at most floor(cap / g) for
        # every set of options within cap (floor is superadditive), so this only loosens
        cap = int(capacity[int(c)])
        g = max(1, -(-cap // KNAPSACK_CELLS))
        per_class = _class_speeds((units[mask].astype(int) // g).tobytes(),
                                  np.asarray(rates[mask], dtype=float).tobytes(), cap // g, max_stages, exact)
        # combine: the best split of k stages between the classes so far and this one
        k, j = np.indices((max_stages + 1, max_stages + 1))
        total = np.where(j <= k, total[np.maximum(k - j, 0)] + per_class[j], -np.inf).max(axis=1)
    return total[1:]


@lru_cache(maxsize=4096)
def _class_speeds(units_bytes: bytes, rates_bytes: bytes, cap: int, max_stages: int,
                  exact: bool = False) -> np.ndarray:
    """One class's part of ``most_speed``: the largest total rate of at most (``exact``:
    exactly) k of its options within ``cap`` units, k = 0..max_stages.  Cached: knob tuples
    and the knob bound's class subsets share a class's options and rates."""
    units = np.frombuffer(units_bytes, dtype=int)
    rates = np.frombuffer(rates_bytes, dtype=float)
    # only options no other beats with as few units matter (the search's options of one
    # class are mostly (tp, replicas) pairs on the same node counts): a Pareto front
    front, top = [], -np.inf
    for u, r in sorted(zip(units, rates), key=lambda t: (t[0], -t[1])):
        if u <= cap and r > top:
            front.append((int(u), float(r)))
            top = r
    best = np.full((max_stages + 1, cap + 1), -np.inf)
    best[0, :] = 0.0
    if front:
        # best[k, c] = max over the front's options (u, r) of best[k - 1, c - u] + r: one
        # gather per k (column cap + 1 of a padded row is -inf, for c < u)
        u = np.array([f[0] for f in front])
        r = np.array([f[1] for f in front])[:, None]
        c = np.arange(cap + 1)[None, :] - u[:, None]
        src = np.where(c >= 0, c, cap + 1)
        prev = np.full(cap + 2, -np.inf)
        for k in range(1, max_stages + 1):
            prev[:cap + 1] = best[k - 1]
            row = (prev[src] + r).max(axis=0)
            # at most k: k - 1 stages is allowed; exactly k: only k options
            best[k] = row if exact else np.maximum(row, best[k - 1])
    elif not exact:
        best[1:] = 0.0
    out = best[:, cap]
    out.setflags(write=False)
    return out
