"""The pipeline sends between adjacent stages, as ``planner.cost.evaluate`` prices them:
the path of each pair of (class, TP) groups as a line in the sequences sent, the shared-link
floor of a capped zone link, and the K x K table of a knob tuple's options (the even splits'
busiest points; mixed stages' in mixed_sends.py).  A part of ``space.Pricer``, apart so
that each file holds one concern; it reads the pricer's classes, topology and caches."""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

from planner.cost import p2p_time_s, shared_link_time_s
from planner.search.core import CoreOption
from planner.search.mixed import MixedPiece
from planner.search.mixed_sends import send_table as mixed_send_table
from planner.search.pieces import _busiest_points

if TYPE_CHECKING:
    from planner.search.knobs import OptionKey


def _option_key(cls: int, tp: int, replicas: int, cp: int = 1) -> OptionKey:
    from planner.search.knobs import OptionKey  # space.py builds on this module
    return OptionKey(cls, tp, replicas, cp)


class SendPricing:
    def send_path(self, a: OptionKey, b: OptionKey):
        """(L0, X): a transfer of k sequences takes L0 + k X (p2p_time_s is affine in bytes)."""
        # a replica is tp x cp GPUs (the widths); each cp rank sends its own s/cp of the
        # activation, min(tp) flows apiece, as evaluate prices a boundary
        wa, wb = getattr(a, "width", a.tp), getattr(b, "width", b.tp)
        ck = (a.cls, wa, b.cls, wb, a.tp, b.tp)
        hit = self._paths.get(ck)
        if hit is None:
            ia, ib = self.classes[a.cls], self.classes[b.cls]
            da = ia.replica_devices(wa, 1)[0][0]
            if a.cls == b.cls and not ia.shared_node:
                db = ib.replica_devices(wb, 1, first_node=1)[0][0]
            elif a.cls == b.cls:
                db = ib.replica_devices(wb, 1, first_gpu=wa)[0][0] if wa + wb <= ia.gpus_per_node \
                    else ib.replica_devices(wb, 1)[0][0]
            else:
                db = ib.replica_devices(wb, 1)[0][0]
            na, nb = da.rpartition(":")[0], db.rpartition(":")[0]
            path = self.topo.p2p(da, db)
            cap = None if na == nb else self.topo.node_p2p(na, nb).bandwidth_Bps
            hit = self._paths[ck] = (path, cap, min(a.tp, b.tp) * (wa // a.tp))
        return hit

    def _boundary(self, ctx, knobs, options: list[CoreOption]) -> np.ndarray:
        """Send time between adjacent stages for every option pair (evaluate's bottleneck rule):
        ``max(c L0 + k X)`` over the boundary's busiest points (c transfers, k sequences), with
        the path's (L0, X) per (class, TP) pair and the points per replica-count pair, so the
        K x K table is filled by numpy, not a K^2 Python loop."""
        labels = [o.label for o in options]
        if any(isinstance(lab, MixedPiece) for lab in labels):
            return mixed_send_table(self, ctx, knobs.micro_batch_size, labels)[None]
        return self._send_table(ctx, knobs.micro_batch_size, labels)[None]

    def _send_table(self, ctx, B: int, labels: list[OptionKey]) -> np.ndarray:
        groups = list(dict.fromkeys((k.cls, k.tp) for k in labels))
        counts = list(dict.fromkeys(k.replicas for k in labels))
        gi = np.array([groups.index((k.cls, k.tp)) for k in labels])
        ri = np.array([counts.index(k.replicas) for k in labels])
        L0, X, shared = self.group_lines(ctx, B, groups)
        pc, pk = _point_tables(B, tuple(counts))
        c = pc[ri[:, None], ri[None, :]]                   # [K, K, points]
        k = pk[ri[:, None], ri[None, :]]
        T = (c * L0[gi[:, None], gi[None, :], None] + k * X[gi[:, None], gi[None, :], None]).max(axis=2)
        return np.maximum(T, shared[gi[:, None], gi[None, :]])

    def group_lines(self, ctx, B: int, groups: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[G, G] each, from group a to group b ((class, TP) each): (L0, X) of ``send_line``
        and the ``shared_link`` floor of a whole micro-batch of B sequences between them."""
        cp = ctx.context_parallel
        lines = np.array([[(*self.send_line(ctx, _option_key(a[0], a[1], 1, cp), _option_key(b[0], b[1], 1, cp)),
                            self.shared_link(ctx, B, a, b)) for b in groups] for a in groups])
        return lines[..., 0], lines[..., 1], lines[..., 2]

    def shared_link(self, ctx, B: int, a: tuple[int, int], b: tuple[int, int]) -> float:
        """A whole micro-batch crossing a capped zone link between the classes of ``a`` and
        ``b`` ((class, TP) each): evaluate's shared-link floor of a boundary."""
        ia, ib = self.classes[a[0]], self.classes[b[0]]
        if ia.zone == ib.zone:
            return 0.0
        aggregate = self.topo.zone_path(ia.zone, ib.zone)[1]
        cp = ctx.context_parallel
        path = self.send_path(_option_key(a[0], a[1], 1, cp), _option_key(b[0], b[1], 1, cp))[0]
        per_seq = ctx.seq_len * ctx.model.hidden_size * ctx.activation_bytes
        return shared_link_time_s(B * per_seq, path, aggregate, ctx, ia.gpu)

    def send_line(self, ctx, a: OptionKey, b: OptionKey) -> tuple[float, float]:
        """(L0, X) of a send from class/TP ``a`` to ``b``: k sequences take L0 + k X
        (p2p_time_s is affine in bytes; the sender's GPU prices it, as in evaluate)."""
        ck = (self.cache_id(ctx), a.cls, a.tp, b.cls, b.tp)
        hit = self._sends.get(ck)
        if hit is None:
            per_seq = ctx.seq_len * ctx.model.hidden_size * ctx.activation_bytes
            path, cap, flows = self.send_path(a, b)
            gpu = self.classes[a.cls].gpu
            t1 = p2p_time_s(per_seq, path, ctx, flows, cap, gpu)
            t2 = p2p_time_s(2 * per_seq, path, ctx, flows, cap, gpu)
            X = t2 - t1
            hit = self._sends[ck] = (t1 - X, X)
        return hit


@lru_cache(maxsize=256)
def _point_tables(B: int, counts: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The busiest points per replica-count pair, padded with (0, 0) (a zero-cost point never
    wins the max, as L0, X >= 0): arrays [counts, counts, points] of transfers and sequences."""
    pts = {(x, y): _busiest_points(B, x, y) for x in counts for y in counts}
    width = max(len(v) for v in pts.values())
    pc = np.zeros((len(counts), len(counts), width))
    pk = np.zeros_like(pc)
    for i, x in enumerate(counts):
        for j, y in enumerate(counts):
            for w, (c, k) in enumerate(pts[x, y]):
                pc[i, j, w], pk[i, j, w] = c, k
    return pc, pk
