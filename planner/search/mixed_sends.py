"""The pipeline sends of boundaries with a mixed stage on either side (mixed.py).

``planner.cost.evaluate`` prices a boundary by its busiest replica: each sequence of a
micro-batch goes from the replica of stage A that holds it to the replica of stage B that
holds it (``comm.boundary_bytes``: sequences in replica order on both sides), a transfer per
run of sequences with the same two replicas, ``L0 + k X`` on the path of the two replicas'
(class, TP) groups; a replica's transfers add up (``comm.boundary_time_s``).  With uneven
shares the busiest-point tables of the even splits (``pieces._busiest_points``) do not
apply, so here every sequence position is priced at once: per pair of stage options, a
position adds ``X`` to its sender and its receiver, and ``L0`` too where a transfer starts.
"""

from __future__ import annotations

import numpy as np

from planner.search.mixed import MixedKey, MixedPiece, key_of
from planner.search.pieces import shares


def replica_groups(key, B: int) -> list[tuple[tuple[int, int], int]]:
    """Per replica of a stage option, in plan order: its (class, tp) and its share."""
    if isinstance(key, MixedKey):
        return [((k.cls, k.tp), k.share) for k in key.kinds for _ in range(k.replicas)]
    return [((key.cls, key.tp), q) for q in shares(B, key.replicas)]


def send_table(pricer, ctx, B: int, labels: list) -> np.ndarray:
    """[K, K] send time from a stage of each option to one of each other, as evaluate prices
    it, at least the shared-link floor of the micro-batch crossing a capped zone link (on the
    path of the two first replicas' groups, as evaluate takes it).  Options without mixed
    stages on either side come from the pricer's own table; the rest are cached per (B,
    pair) for the whole search: sends read the sequence's bytes and the paths, not the
    recompute or ZeRO stage that tell the search's contexts apart."""
    K = len(labels)
    pure = [i for i, lab in enumerate(labels) if not isinstance(lab, MixedPiece)]
    T = np.zeros((K, K))
    if pure:
        T[np.ix_(pure, pure)] = pricer._send_table(ctx, B, [labels[i] for i in pure])
    if len(pure) == K:
        return T
    keys = [key_of(lab) for lab in labels]
    uniq = list(dict.fromkeys(keys))
    reps = {k: replica_groups(k, B) for k in uniq}
    groups = sorted({g for r in reps.values() for g, _ in r})
    gi = {g: i for i, g in enumerate(groups)}
    L0, X, shared = pricer.group_lines(ctx, B, groups)
    lay = {k: _layout(r, gi) for k, r in reps.items()}
    cache = pricer._mixed_sends
    value: dict = {}
    for a in uniq:
        row = cache.setdefault((B, a), {})
        todo = [b for b in uniq if b not in row and (isinstance(a, MixedKey) or isinstance(b, MixedKey))]
        if todo:
            row.update(zip(todo, _row(lay[a], [lay[b] for b in todo], L0, X, shared, B)))
        value[a] = row
    for i, a in enumerate(keys):
        if isinstance(a, MixedKey):
            T[i] = [value[a][b] for b in keys]
        else:
            for j, b in enumerate(keys):
                if isinstance(b, MixedKey):
                    T[i, j] = value[a][b]
    return T


def _layout(reps, gi) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sequence position: its replica and its group; the replicas' first positions
    (and B last)."""
    q = [s for _, s in reps]
    rep = np.repeat(np.arange(len(reps)), q)
    grp = np.repeat([gi[g] for g, _ in reps], q)
    return rep, grp, np.concatenate([[0], np.cumsum(q)])


def _row(a, bs, L0, X, shared, B: int) -> np.ndarray:
    """Boundary times from a stage laid out as ``a`` to stages laid out as each of ``bs``."""
    rep_a, grp_a, bound_a = a
    rep_b = np.stack([b[0] for b in bs])                                # [M, B]
    grp_b = np.stack([b[1] for b in bs])
    start = np.ones(rep_b.shape, dtype=bool)
    start[:, 1:] = (rep_a[1:] != rep_a[:-1])[None, :] | (rep_b[:, 1:] != rep_b[:, :-1])
    cost = X[grp_a[None, :], grp_b] + start * L0[grp_a[None, :], grp_b]
    cum = np.concatenate([np.zeros((len(bs), 1)), np.cumsum(cost, axis=1)], axis=1)    # [M, B + 1]
    send = cum[:, bound_a[1:]] - cum[:, bound_a[:-1]]
    width = max(len(b[2]) for b in bs)
    bound_b = np.stack([np.pad(b[2], (0, width - len(b[2])), constant_values=B) for b in bs])
    recv = np.take_along_axis(cum, bound_b[:, 1:], 1) - np.take_along_axis(cum, bound_b[:, :-1], 1)
    busiest = np.maximum(send.max(axis=1), recv.max(axis=1))
    return np.maximum(busiest, shared[grp_a[0], grp_b[:, 0]])
