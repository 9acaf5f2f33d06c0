"""The reference runner's gradient sum over a stage's replicas (``GradSync``, a base of
``planner.launch.worker.Worker``; the module docstring there says which ranks talk): tied
embeddings across the first and last stage, then the stage's own replicas, shard by shard where
they share one tp degree, else as full tensors on the tp leaders."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from planner.launch import tiny_model as tm


class GradSync:
    """Needs the worker's ``params``, ``layout``, ``stage``, ``tied``, ``zero``, ``tp``,
    ``tp_rank``, ``leader`` and its groups (``tp_group``, ``dp_group``, ``tie_group``), all set
    by ``Worker.init``."""

    def _sync_tied(self):
        """Tied embeddings: one all-reduce over every replica of the first and last stage gives
        each copy the whole gradient of the shared matrix (the replica sum included, so
        ``_sync_grads`` leaves this one out)."""
        if not self.tied or "embed.weight" not in self.params:
            return
        p = self.params["embed.weight"]
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        if self.tp_rank == 0:
            dist.all_reduce(g, group=self.tie_group)
        if self.tp > 1:
            dist.broadcast(g, src=self.leader, group=self.tp_group)
        p.grad = g

    def _sync_grads(self):
        """Sum this stage's gradients over its replicas (see the module docstring)."""
        self._sync_tied()
        if self.zero is not None:
            self.zero.reduce()
            return
        if len(self.stage["replicas"]) == 1 or not self.params:
            return
        names = [n for n in self.params if not (self.tied and n == "embed.weight")]
        self._sum_grads(names, self.dp_group, self.stage["uniform_tp"])

    def _grad(self, name: str):
        p = self.params[name]
        return p.grad if p.grad is not None else torch.zeros_like(p)

    def _sum_grads(self, names: list[str], group, uniform_tp: bool) -> None:
        """Sum the gradients of ``names`` over ``group``: shard by shard where every member has
        this tp (``uniform_tp``), else as full tensors gathered on each tp leader, summed among
        the leaders and handed back as shards (replicas of different tp)."""
        if uniform_tp:
            grads = [self._grad(n) for n in names]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=group)
            off = 0
            for n, g in zip(names, grads):
                self.params[n].grad = flat[off:off + g.numel()].view_as(g)
                off += g.numel()
            return
        fulls = []
        for name in names:
            g, dim = self._grad(name), self.layout[name][1]
            if self.tp > 1 and dim is not None:
                parts = [torch.empty_like(g) for _ in range(self.tp)]
                dist.all_gather(parts, g.contiguous(), group=self.tp_group)
                g = torch.cat(parts, dim=dim)
            fulls.append(g.reshape(-1))
        flat = torch.cat(fulls)
        if self.tp_rank == 0:
            dist.all_reduce(flat, group=group)
        if self.tp > 1:
            dist.broadcast(flat, src=self.leader, group=self.tp_group)
        off = 0
        for name in names:
            full_shape, dim = self.layout[name]
            n = int(np.prod(full_shape))
            self.params[name].grad = tm.shard(flat[off:off + n].view(full_shape), dim, self.tp, self.tp_rank)
            off += n
