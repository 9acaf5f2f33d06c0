"""What a runner worker adds for ``planner run --measurements`` and ``--dynamic-batching``.

``MeasureMixin`` goes in front of ``planner.launch.worker.Worker`` (``with_measuring``): it
times every action by kind (forward, backward, the receive waits inside them) and the gradient
sync, once per step, and, under dynamic batching, lets rank 0 move whole sequences between the
replicas of a stage between steps (``planner.launch.dynamic``) and broadcasts the new shares
to every rank. Every rank then cuts its micro-batches and its point-to-point pieces by the new
shares; the loss is a sum over tokens divided by the global token count and a stage's
gradients are summed over its replicas, so any shares summing to the micro-batch size give the
same loss and gradients as the single-process reference.

A controlled slow-down for benchmarks and tests: ``cfg["slowdown"] = {"<rank>": factor}`` makes
that rank sleep ``factor - 1`` times each action's compute time after it (like a device
``factor`` times slower; sleeping leaves the CPU to the others).
"""

from __future__ import annotations

import time

import torch.distributed as dist

from planner.launch.dynamic import ControllerSettings, ShareController

TIMED = ("forward_s", "backward_s", "recv_wait_s", "sync_wait_s")


def with_measuring(worker_cls, cfg: dict):
    """``worker_cls`` itself, or a subclass that measures, when the run asks for it."""
    if not (cfg.get("measure") or cfg.get("dynamic") or cfg.get("slowdown")):
        return worker_cls
    return type("Measured" + worker_cls.__name__, (MeasureMixin, worker_cls), {})


class MeasureMixin:
    def init(self):
        super().init()
        self.acc = dict.fromkeys(TIMED, 0.0)
        self.slow_factor = float((self.cfg.get("slowdown") or {}).get(str(self.rank), 1.0))
        self.controllers = {}
        dyn = self.cfg.get("dynamic")
        if dyn is not None and self.rank == 0:
            settings = ControllerSettings(**dyn)
            for si, s in enumerate(self.stages):
                if len(s["replicas"]) > 1:
                    self.controllers[si] = ShareController([r["share"] for r in s["replicas"]], settings)

    # -- timing ----------------------------------------------------------------------------
    def _recv_pieces(self, *args):
        t0 = time.perf_counter()
        try:
            return super()._recv_pieces(*args)
        finally:
            self.acc["recv_wait_s"] += time.perf_counter() - t0

    def _timed(self, kind: str, fn, *args):
        recv0, t0 = self.acc["recv_wait_s"], time.perf_counter()
        out = fn(*args)
        compute = time.perf_counter() - t0 - (self.acc["recv_wait_s"] - recv0)
        if self.slow_factor > 1.0:
            time.sleep((self.slow_factor - 1.0) * max(0.0, compute))
        self.acc[kind] += time.perf_counter() - t0
        return out

    def _forward(self, *args):
        return self._timed("forward_s", super()._forward, *args)

    def _backward(self, *args):
        return self._timed("backward_s", super()._backward, *args)

    def _backward_input(self, *args):
        return self._timed("backward_s", super()._backward_input, *args)

    def _backward_weight(self, *args):
        return self._timed("backward_s", super()._backward_weight, *args)

    def _sync_grads(self):
        t0 = time.perf_counter()
        super()._sync_grads()
        self.acc["sync_wait_s"] += time.perf_counter() - t0

    # -- per step --------------------------------------------------------------------------
    def step(self, step: int) -> float:
        self.acc = dict.fromkeys(TIMED, 0.0)
        self.step_share = self.rep["share"]
        return super().step(step)

    def _after_step(self, rec: dict) -> None:
        """Keep this step's measurements, put the share in the progress line and, under dynamic
        batching, re-set the shares for the next step."""
        m = {"step": rec["step"], "share": self.step_share, "step_s": round(rec["time_s"], 9),
             **{k: round(v, 9) for k, v in self.acc.items()}}
        self.records.append(m)
        rec["share"] = self.step_share
        if self.cfg.get("dynamic") is not None:
            self._rebalance(m)

    def train(self) -> dict:
        self.records = []
        result = super().train()
        result["measurements"] = self.records
        return result

    def _rebalance(self, rec: dict) -> None:
        """Rank 0 gathers every rank's compute time, runs each stage's controller and sends
        every rank the shares of the next step (all stages: neighbours cut pieces by them)."""
        world = self.cfg["world_size"]
        gathered = [None] * world if self.rank == 0 else None
        dist.gather_object({"rank": self.rank, "compute_s": rec["forward_s"] + rec["backward_s"]
                            - rec["recv_wait_s"]}, gathered, dst=0)
        new = [None]
        if self.rank == 0:
            compute = {g["rank"]: g["compute_s"] for g in gathered}
            new[0] = [[r["share"] for r in s["replicas"]] for s in self.stages]
            for si, ctl in self.controllers.items():
                times = [max(max(compute[rk] for rk in r["ranks"]), 1e-9)
                         for r in self.stages[si]["replicas"]]
                new[0][si] = ctl.update(times)
        dist.broadcast_object_list(new, src=0)
        for s, shares in zip(self.stages, new[0]):
            off = 0
            for r, share in zip(s["replicas"], shares):
                r["share"], r["offset"], off = share, off, off + share
