"""The reference runner's activation and gradient messages between stages (``PointToPoint``, a
base of ``planner.launch.worker.Worker``, whose module docstring says which ranks talk and
why over gloo). Apart from the worker because it is the one part that cuts a micro-batch
between two stages' replicas: the sample-range arithmetic and the message tags live here, the
schedule's actions that call them in the worker."""

from __future__ import annotations

import torch
import torch.distributed as dist

from planner.launch.cp_layout import peers_of


def overlaps(lo: int, hi: int, other: list[dict]):
    """(replica index, start, end) of each replica in ``other`` whose sample range meets [lo, hi),
    in sample order: the pieces a micro-batch is cut into between two stages."""
    out = []
    for j, rep in enumerate(other):
        a, b = max(lo, rep["offset"]), min(hi, rep["offset"] + rep["share"])
        if a < b:
            out.append((j, a, b))
    return out


class PointToPoint:
    """Needs the worker's ``stages``, ``rep``, ``rank``, ``tp``, ``tp_rank``, ``leader``,
    ``cp_rank``, ``seq_local``, ``shape``, ``dtype``, ``device``, ``chunks``, ``mailbox`` and
    ``pending`` (set by ``Worker.__init__``) and its ``p2p_group`` and ``tp_group`` (set by
    ``Worker.init``)."""

    def _leader_of(self, si: int, qi: int) -> int:
        return self.stages[si]["replicas"][qi]["ranks"][0]

    def _recv_pieces(self, from_stage: int, m: int, tag: int) -> torch.Tensor:
        """Whole activation (or gradient) of this replica's samples of micro-batch m, gathered
        from the replicas of ``from_stage`` that hold them, then shared with the tp group."""
        lo, hi = self.rep["offset"], self.rep["offset"] + self.rep["share"]
        seq, h = self.seq_local, self.shape.hidden_size
        if self.tp_rank == 0:
            pieces = []
            idx, peers = peers_of(self.stages[from_stage], self.cp_rank)
            for j, a, b in overlaps(lo, hi, peers):
                src = self._leader_of(from_stage, idx[j])
                if src == self.rank:
                    pieces.append(self.mailbox.pop(tag))
                    continue
                buf = torch.empty((b - a, seq, h), dtype=self.dtype)
                dist.recv(buf, src=src, tag=tag, group=self.p2p_group)
                pieces.append(buf.to(self.device))
            x = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
        else:
            x = torch.empty((hi - lo, seq, h), dtype=self.dtype, device=self.device)
        if self.tp > 1:
            dist.broadcast(x, src=self.leader, group=self.tp_group)
        return x

    def _send_pieces(self, t: torch.Tensor, to_stage: int, tag: int):
        if self.tp_rank != 0:
            return
        lo = self.rep["offset"]
        idx, peers = peers_of(self.stages[to_stage], self.cp_rank)
        for j, a, b in overlaps(lo, lo + self.rep["share"], peers):
            piece = t[a - lo:b - lo].detach().contiguous()
            dst = self._leader_of(to_stage, idx[j])
            if dst == self.rank:
                self.mailbox[tag] = piece
            else:
                piece = piece.cpu()
                self.pending.append((dist.isend(piece, dst=dst, tag=tag, group=self.p2p_group), piece))

    def _tag(self, k: int, m: int, backward: bool) -> int:
        """Distinct per (virtual stage, micro-batch, direction) so no two messages between the
        same pair of ranks can be confused, whatever the schedule's order."""
        return (m * len(self.chunks) + k) * 2 + int(backward)
