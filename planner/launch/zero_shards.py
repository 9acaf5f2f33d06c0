"""ZeRO stages 1-3 in the reference runner: one stage's parameters as a flat vector cut into
one contiguous shard per data-parallel replica (Rajbhandari et al. 2020, ZeRO §5).

- stage 1: every replica keeps the full weights and full gradients; each updates only its
  shard, with the optimizer state of that shard alone, and the replicas all-gather the updated
  shards back into the full weights;
- stage 2: as 1, but after the reduction a replica keeps only its shard of the gradients;
- stage 3: between steps a replica keeps only its shard of the weights too; the full weights
  are gathered for the step (FSDP's unit is the whole stage here: the runner checks the
  training, not the prefetch overlap the cost model prices) and freed after it.

HSDP (``zero_shard_degree``): the replicas are the members of one shard group
(``planner.launch.hsdp_groups``) and, after the reduction inside it, each shard's gradient is
all-reduced over its ``replicate_group`` (the holders of the same shard in the other groups),
as FSDP2's HSDP does.

The sums are the same as the unsharded runner's, so the loss and every parameter still match
the single-process reference. gloo has no reduce-scatter, so the gradients are all-reduced and
each replica keeps its slice: the same sums, not ZeRO's traffic (the cost model prices that).
``state_bytes`` measures what a rank holds at its peak (weights, gradients, optimizer state),
to check the memory formulas against a run.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class ZeroShards:
    """The shard of ``names`` (in ``params``) that this replica owns, and the collectives."""

    def __init__(self, params: dict[str, torch.Tensor], names: list[str], stage: int,
                 group, replicas: int, index: int, replicate_group=None):
        self.params, self.names, self.stage = params, names, stage
        self.group, self.replicas, self.index = group, replicas, index
        self.replicate_group = replicate_group  # HSDP: None when this shard has no other holder
        self.shapes = [params[n].shape for n in names]
        self.numel = sum(params[n].numel() for n in names)
        self.shard_numel = -(-self.numel // replicas)  # padded so every shard is the same size
        lo = index * self.shard_numel
        flat = self._flat_weights()
        self.shard = flat[lo:lo + self.shard_numel].clone().requires_grad_(True)
        self.grad_bytes = 0
        if stage >= 3:
            self.release()

    def _flat(self, tensors) -> torch.Tensor:
        """``tensors`` (one per name, None as zeros) as one vector padded to whole shards."""
        flat = torch.cat([(t if t is not None else torch.zeros(s, dtype=self.shard.dtype)).reshape(-1)
                          for t, s in zip(tensors, self.shapes)])
        return torch.nn.functional.pad(flat, (0, self.shard_numel * self.replicas - self.numel))

    def _split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """The inverse of ``_flat``: each name's view of ``flat``."""
        out, off = {}, 0
        for n, shape in zip(self.names, self.shapes):
            k = int(torch.Size(shape).numel())
            out[n] = flat[off:off + k].view(shape)
            off += k
        return out

    def _flat_weights(self) -> torch.Tensor:
        return self._flat([self.params[n].detach() for n in self.names])

    def _write_full(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            for n, view in self._split(flat).items():
                self.params[n].data = view.clone()

    def gather(self) -> None:
        """All-gather the updated shards into every replica's full weights."""
        parts = [torch.empty_like(self.shard) for _ in range(self.replicas)]
        if self.replicas > 1:   # a group of one (HSDP with d x cp = 1) holds every shard itself
            dist.all_gather(parts, self.shard.detach(), group=self.group)
        else:
            parts = [self.shard.detach()]
        self._write_full(torch.cat(parts))

    def release(self) -> None:
        """ZeRO-3: keep only the shard; the full tensors become empty until the next gather."""
        for n in self.names:
            self.params[n].data = torch.empty(0, dtype=self.shard.dtype)

    def reduce(self) -> None:
        """Sum the full gradients over the replicas and hand this replica its slice as the shard's
        gradient; under HSDP that slice is then summed over the replicate group. Stage 1 keeps
        the full reduced gradients (views into one buffer, as Megatron's grad buffer; under HSDP
        only the shard's slice of it holds the sum over every group, the only part the update
        reads); from stage 2 on only the shard's slice is kept. Sums, not FSDP2's averages: each
        rank's loss piece is already divided by the global batch's token count."""
        flat = self._flat([self.params[n].grad for n in self.names])
        if self.replicas > 1:
            dist.all_reduce(flat, group=self.group)
        lo = self.index * self.shard_numel
        if self.replicate_group is not None:  # in place: the slice is a contiguous view of flat
            dist.all_reduce(flat[lo:lo + self.shard_numel], group=self.replicate_group)
        if self.stage >= 2:
            self.shard.grad = flat[lo:lo + self.shard_numel].clone()
            for n in self.names:
                self.params[n].grad = None
        else:
            self.shard.grad = flat[lo:lo + self.shard_numel]
            for n, view in self._split(flat).items():
                self.params[n].grad = view
        self.grad_bytes = _storage_bytes([self.params[n].grad for n in self.names] + [self.shard.grad])

    def after_update(self) -> None:
        for n in self.names:  # the step's gradients are spent (ZeRO-1 zeroes its grad buffer)
            self.params[n].grad = None
        if self.stage >= 3:
            self.release()
        else:
            self.gather()

    def state_bytes(self, optimizer) -> dict[str, int]:
        """Bytes of the tensors this rank holds, by kind: weights between steps (full, or none
        under ZeRO-3 but the shard's copy), gradients right after their reduction (their peak:
        full, or the shard's slice from stage 2 on), optimizer state (the shard's copy of the
        weights the optimizer updates, and that shard's moments); counted by storage, so views
        count once. ``parameters``: how many the full tensors hold (for the formulas)."""
        full = [self.params[n].data for n in self.names]
        i = next(k for k, p in enumerate(optimizer.params) if p is self.shard)
        moments = [ts[i] for ts in (getattr(optimizer, "m", []), getattr(optimizer, "v", [])) if ts]
        return {"parameters": self.numel, "weights": _storage_bytes(full), "grads": self.grad_bytes,
                "optimizer": _storage_bytes([self.shard.data] + moments)}


def _storage_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and t.numel():
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())
