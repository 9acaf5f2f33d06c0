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
