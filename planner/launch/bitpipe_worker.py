"""A reference-runner process for BitPipe plans (stage map ``bitpipe``; planner.simulate.bitpipe).

What differs from ``planner.launch.worker.Worker``:

- The chunks.  ``run_schedule.model_chunks`` lists both pipelines' stages (slot ``pipe *
  2p + stage``); rank r builds the four it runs: down stages r and 2p-1-r (its plan stage's
  blocks) and up stages p-1-r and p+r (the blocks of its mirror, plan stage p-1-r).  Every
  parameter is initialised from the seed by name (``tiny_model.init_full``), so the second
  copy starts equal to the mirror's copy and to the single-process reference.  The embedding
  and the head sit on rank 0 in the down pipeline and on rank p-1 in the up pipeline: each
  pipeline has both ends on one rank, so a tied embedding is one tensor per copy and needs no
  tie all-reduce of its own (``tied`` is off).
- The order.  The worker's loop runs the generated lists unchanged: each action's slot picks
  the chunk, each micro-batch flows through its own pipeline's slots, and the V's turn (stage
  p-1 to p, both on one rank) goes through the mailbox.
- The gradients.  The reference's gradient of a weight is the sum over every sample of the
  global batch of d(loss / tokens of the batch).  The down copy on rank r has the sum over the
  down micro-batches' samples its replicas ran, the up copy on rank p-1-r the sum over the up
  micro-batches' samples of that rank's replicas.  Ranks r and p-1-r hold the same parameter
  names (the union of both stages' blocks, and the ends on ranks 0 and p-1), so one sum over
  every replica of both stages gives each copy exactly the reference's gradient (shares weigh
  in through the loss being normalised by the global batch, as for plain data parallelism),
  and the identical optimiser steps that follow keep the copies equal.
"""

from __future__ import annotations

import torch.distributed as dist

from planner.launch.worker import Worker


def pair_of(stage: int, num_stages: int) -> tuple[int, int]:
    """The plan stages holding the same weights, lower first."""
    mirror = num_stages - 1 - stage
    return min(stage, mirror), max(stage, mirror)


class BitpipeWorker(Worker):
    def init(self):
        super().init()
        # Each pipeline has its embedding and head on one rank (see the module docstring); the
        # base class saw the first and the last slot on two ranks and made a tie group.
        self.tied, self.tie_group = False, None
        self.pair_group, self.pair_uniform_tp = None, True
        p = len(self.stages)
        for lo in range(p // 2):  # every rank creates every group, in the same order
            reps = self.stages[lo]["replicas"] + self.stages[p - 1 - lo]["replicas"]
            tps = {len(rep["ranks"]) for rep in reps}
            mine = self.si in pair_of(lo, p)
            uniform = len(tps) == 1
            if mine:
                self.pair_uniform_tp = uniform
            # Same tp everywhere: shard t is the same slice on every copy, so its holders sum it.
            # Otherwise the leaders sum full gradients (as the worker does for uneven replicas).
            for t in range(tps.pop() if uniform else 1):
                g = dist.new_group([rep["ranks"][t] for rep in reps])
                if mine and self.tp_rank == t:
                    self.pair_group = g

    def _sync_grads(self):
        """Sum every gradient over both copies and all their replicas (module docstring).  The
        partner holds the same names in another order: the buffer follows sorted names."""
        self._sum_grads(sorted(self.params), self.pair_group, self.pair_uniform_tp)
