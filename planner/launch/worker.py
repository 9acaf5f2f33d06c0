"""One process of the reference runner: ``python -m planner.launch.worker CONFIG RANK OUT_DIR``.

The parent (``planner.launch.runner``) writes CONFIG (JSON: sizes, schedule and the rank layout
of every stage) and starts one of these per rank. A worker trains its piece of the model for the
requested steps and leaves in OUT_DIR either ``rank<R>.json`` + ``rank<R>.npz`` (losses, step
times, its parameter shards) or ``rank<R>.error.json`` (the exception) and exits 1.

Communication, all on torch.distributed (point-to-point always over gloo, see ``init``):
- activations and their gradients go replica-to-replica between consecutive stages with
  point-to-point sends, one message per overlap of the two replicas' sample ranges, always
  between the tp-rank-0 processes ("leaders"); a leader broadcasts what it received to the
  rest of its tp group (a tp group's output is whole on every tp rank after the row-parallel
  all-reduce, so the leader's copy is the full activation). These messages (``overlaps``, the
  sends, receives and tags) moved to ``planner.launch.p2p``, a base class of ``Worker``.
- each stage runs its action list of the plan's ``actions.Schedule`` (F, B, I, W on its chunks;
  ``planner.launch.run_schedule``): global stage ``k`` receives from ``k - 1`` and sends to
  ``k + 1``, on whichever stages the schedule's stage map puts them (the same stage: handed
  over in memory); I and W are the two halves of B (``planner.launch.backward_split``);
- sends are asynchronous and receives block, and a receive waits only on an action the
  validated lists run without waiting on the receiver, so no valid schedule can deadlock
  (docs/runner.md, "Schedules");
- context parallelism (``cp`` > 1): a plan replica's ranks are ``cp`` groups of its tp ranks
  (tp innermost); the worker treats each group as a replica of its own over the same samples
  (``cp_layout.expand_cp``), holding ``cp_positions`` of every sequence, so activations travel
  between the stages' groups of the same cp rank, the K/V chunks are gathered inside a tp
  position's cp ranks (``tiny_model.CPContext``), and the gradient sum over the replicas covers
  the cp ranks.
- gradients of a stage are summed over its replicas once per step (``planner.launch.grad_sync``).
  When its replicas share one tp degree, the ranks holding the same shard all-reduce it (one
  flat buffer). When they
  do not, each replica assembles the full gradient on its leader (all-gather of the shards),
  the leaders all-reduce, and each leader broadcasts back to its tp group, which keeps its
  shard.
- ZeRO stages 1-3 (``zero_stage`` in the config): a stage's replicas shard the optimizer state,
  then the gradients, then the weights (``planner.launch.zero_shards``); with HSDP
  (``zero_shard_degree``) inside groups of replicas, each shard's gradient then all-reduced
  across the groups (``planner.launch.hsdp_groups``).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from planner.launch import tiny_model as tm
from planner.launch.backward_split import SplitBackward
from planner.launch.cp_layout import cp_groups, expand_cp
from planner.launch.grad_sync import GradSync
from planner.launch.p2p import PointToPoint
from planner.launch.run_schedule import schedule_from_json

FAIL_ENV = "PLANNER_RUNNER_FAIL_RANK"  # fault injection for tests: this rank raises at step 0
PARENT_ENV = "PLANNER_RUNNER_PARENT_PID"


class Worker(PointToPoint, GradSync):
    def __init__(self, cfg: dict, rank: int, progress_path: Path):
        self.cfg, self.rank, self.progress_path = cfg, rank, progress_path
        self.shape = tm.Shape(**cfg["shape"])
        self.stages = cfg["stages"]
        for s in self.stages:
            off = 0
            for rep in s["replicas"]:
                rep["offset"], off = off, off + rep["share"]
        self.cp = int(cfg.get("context_parallel", 1))
        # each stage's plan replicas as their tp x cp ranks, before the cp split (HSDP's groups)
        self.plan_replica_ranks = [[list(rep["ranks"]) for rep in s["replicas"]] for s in self.stages]
        if self.cp > 1:
            expand_cp(self.stages, self.cp)
        for si, s in enumerate(self.stages):
            for qi, rep in enumerate(s["replicas"]):
                if rank in rep["ranks"]:
                    self.si, self.qi, self.tp_rank = si, qi, rep["ranks"].index(rank)
        self.stage = self.stages[self.si]
        self.rep = self.stage["replicas"][self.qi]
        self.cp_rank = self.rep.get("cp", 0)
        self.seq_local = self.shape.seq_len // self.cp     # tokens of each sequence held here
        self.tp = len(self.rep["ranks"])
        self.leader = self.rep["ranks"][0]
        self.dtype = tm.torch_dtype(cfg["dtype"])
        self.device = torch.device("cpu")
        self.pending: list = []  # (work, tensor) of async sends, kept alive until waited on
        # Global stage k of the schedule is self.chunks[k], held by plan stage chunks[k]["stage"].
        self.chunks = cfg["chunks"]
        self.sched = schedule_from_json(cfg["schedule"])
        self.mailbox: dict[int, torch.Tensor] = {}  # sends to this very rank (neighbour chunks here)

    # -- set-up ------------------------------------------------------------------------------
    def init(self):
        cfg = self.cfg
        if cfg["backend"] == "nccl":
            torch.cuda.set_device(self.rank)
            self.device = torch.device("cuda", self.rank)
            # float32 matmuls on TF32 tensor cores only for a tf32 plan (PyTorch's default is off).
            torch.backends.cuda.matmul.allow_tf32 = bool(cfg.get("allow_tf32", False))
        dist.init_process_group(cfg["backend"], init_method=f"tcp://127.0.0.1:{cfg['port']}",
                                rank=self.rank, world_size=cfg["world_size"],
                                timeout=timedelta(seconds=cfg["collective_timeout_s"]))
        # Every rank creates every group in the same order (torch.distributed requires it).
        self.tp_group = self.dp_group = self.p2p_group = None
        if cfg["backend"] != "gloo":
            # Point-to-point goes over gloo on the CPU even with nccl: gloo matches messages by
            # tag and never blocks a sender, so every schedule's order is safe; NCCL ignores
            # tags and pairs sends with receives in issue order, which the interleaved
            # wrap-around and 1F1B's crossing sends would break. Speed is not the point here.
            self.p2p_group = dist.new_group(list(range(cfg["world_size"])), backend="gloo")
        for s in self.stages:
            for rep in s["replicas"]:
                if len(rep["ranks"]) > 1:
                    g = dist.new_group(rep["ranks"])
                    if self.rank in rep["ranks"]:
                        self.tp_group = g
            if len(s["replicas"]) > 1:
                tps = {len(rep["ranks"]) for rep in s["replicas"]}
                # Same tp in every replica (Megatron's case): shard t of every replica is the
                # same slice, so the ranks holding it all-reduce it directly. Otherwise only
                # the leaders, on full gradients (see _sync_grads).
                s["uniform_tp"] = len(tps) == 1
                for t in range(tps.pop() if s["uniform_tp"] else 1):
                    g = dist.new_group([rep["ranks"][t] for rep in s["replicas"]])
                    if s is self.stage and self.tp_rank == t:
                        self.dp_group = g
        # Context parallelism: per plan replica and tp position, its cp ranks gather K/V.
        self.cp_group = cp_groups(self.stages, self.rank) if self.cp > 1 else None
        # Tied embeddings over more than one stage: stage 0's embedding and the last stage's
        # copy are summed by the tp-rank-0 processes of all replicas of both stages.
        # (On the v map both ends are on stage 0: one tensor, nothing to sum.)
        ends = (self.chunks[0]["stage"], self.chunks[-1]["stage"])
        self.tied = self.shape.tied_embeddings and ends[0] != ends[1]
        self.tie_group = None
        if self.tied:
            g = dist.new_group([rep["ranks"][0] for si in ends for rep in self.stages[si]["replicas"]])
            if self.si in ends and self.tp_rank == 0:
                self.tie_group = g
        # This stage's model chunks, and the parameter names each global stage uses (a tied
        # embedding with both ends here is one tensor, named by both chunks).
        self.layout, params, self.chunk_params = {}, {}, {}
        for k, c in enumerate(self.chunks):
            if c["stage"] != self.si:
                continue
            args = (self.shape, tuple(c["blocks"]), c["embedding"], c["head"])
            layout = tm.param_layout(*args)
            self.chunk_params[k] = list(layout)
            self.layout.update(layout)
            for name, t in tm.build_params(*args, cfg["seed"], self.dtype, self.tp, self.tp_rank).items():
                params.setdefault(name, t)
        self.params = {k: v.detach().to(self.device).requires_grad_(True) for k, v in params.items()}
        plist = list(self.params.values())
        self.zero = None
        zero_stage, shard_degree = cfg.get("zero_stage", 0), cfg.get("zero_shard_degree")
        hsdp = None
        if zero_stage >= 1 and shard_degree is not None:   # HSDP (planner.launch.hsdp_groups)
            from planner.launch.hsdp_groups import make_zero_groups
            hsdp = make_zero_groups(self.plan_replica_ranks, self.cp, shard_degree, self.rank)
        if zero_stage >= 1 and len(self.stage["replicas"]) > 1 and plist:
            from planner.launch.zero_shards import ZeroShards
            names = [n for n in self.params if not (self.tied and n == "embed.weight")]
            if hsdp is not None:
                members, shard_group, replicate_group = hsdp
            else:
                # shards in the group's rank order (torch orders a group's members by global rank),
                # which is the order all_gather returns them in (the runner refuses ZeRO on mixed tp)
                members = sorted(rep["ranks"][self.tp_rank] for rep in self.stage["replicas"])
                shard_group, replicate_group = self.dp_group, None
            self.zero = ZeroShards(self.params, names, zero_stage, shard_group, len(members),
                                   members.index(self.rank), replicate_group)
            # the optimizer sees the shard (and a tied embedding, summed apart by _sync_tied)
            plist = [self.zero.shard] + [self.params[n] for n in self.params if n not in names]
        # A stage may hold nothing but a pass-through (no blocks, no embedding, no head).
        self.opt = tm.make_optimizer(plist, cfg["optimizer"], cfg["lr"]) if plist else None
        self.tpc = tm.TPContext(self.tp, self.tp_group)
        self.cpc = tm.CPContext(self.cp, self.cp_rank, self.cp_group, self.shape.seq_len)

    # -- one step ----------------------------------------------------------------------------
    def _forward(self, k: int, m: int, tokens: torch.Tensor, saved: dict) -> float:
        """F of global stage ``k`` on micro-batch ``m``; the loss piece when ``k`` has the head."""
        shape = self.shape
        chunk = self.chunks[k]
        mbs = self.cfg["micro_batch_size"]
        lo = m * mbs + self.rep["offset"]
        rows = tokens[lo:lo + self.rep["share"]].to(self.device)
        positions = self.cpc.positions().to(self.device) if self.cp > 1 else None
        x_in = None
        if chunk["embedding"]:
            x = tm.embed(self.params, rows[:, :-1], positions)
        else:
            x_in = self._recv_pieces(self.chunks[k - 1]["stage"], m,
                                     self._tag(k, m, False)).requires_grad_(True)
            x = x_in
        for i in range(*chunk["blocks"]):
            x = tm.block(self.params, i, x, shape, self.tpc, self.cpc)
        if chunk["head"]:
            tokens_total = self.cfg["global_batch"] * shape.seq_len
            labels = rows[:, 1:] if positions is None else rows[:, 1:][:, positions]
            x = tm.head_loss_sum(self.params, x, labels, shape) / tokens_total
            saved[(k, m)] = (x_in, x)
            return float(x.detach())
        self._send_pieces(x, self.chunks[k + 1]["stage"], self._tag(k + 1, m, False))
        saved[(k, m)] = (x_in, x)
        return 0.0

    def _grad_in(self, k: int, m: int) -> torch.Tensor | None:
        """The gradient of stage ``k``'s output for micro-batch ``m`` (None at the loss)."""
        if self.chunks[k]["head"]:
            return None
        return self._recv_pieces(self.chunks[k + 1]["stage"], m, self._tag(k, m, True))

    def _send_grad(self, k: int, m: int, g: torch.Tensor) -> None:
        self._send_pieces(g, self.chunks[k - 1]["stage"], self._tag(k - 1, m, True))

    def _backward(self, k: int, m: int, saved: dict):
        """B: input and weight gradients together (weights accumulate into ``.grad``)."""
        x_in, out = saved.pop((k, m))
        grad = self._grad_in(k, m)
        if out.requires_grad:
            torch.autograd.backward(out, grad)
        if x_in is not None:
            g = x_in.grad if x_in.grad is not None else torch.zeros_like(x_in)
            self._send_grad(k, m, g)

    def _backward_input(self, k: int, m: int, saved: dict):
        """I: the input gradient only, sent at once; what W needs stays in ``saved``."""
        x_in, out = saved.pop((k, m))
        split = SplitBackward(out, x_in, self._grad_in(k, m))
        g = split.input_grad()
        if x_in is not None:
            self._send_grad(k, m, g if g is not None else torch.zeros_like(x_in))
        saved[("W", k, m)] = split

    def _backward_weight(self, k: int, m: int, saved: dict):
        """W: the weight gradients of the micro-batch whose I ran earlier, into ``.grad``."""
        split = saved.pop(("W", k, m))
        names = self.chunk_params[k]
        for name, g in zip(names, split.weight_grads([self.params[n] for n in names])):
            if g is not None:
                p = self.params[name]
                p.grad = g if p.grad is None else p.grad + g

    def step(self, step: int) -> float:
        cfg = self.cfg
        tokens = tm.batch_tokens(cfg["seed"], step, cfg["global_batch"], self.shape)
        saved: dict = {}
        loss = 0.0
        if self.zero is not None and self.zero.stage >= 3:
            self.zero.gather()
        backward = {"B": self._backward, "I": self._backward_input, "W": self._backward_weight}
        for a in self.sched.ranks[self.si]:
            k = self.sched.slot(self.si, a.chunk)  # index into self.chunks (one pipeline: the stage)
            if a.kind == "F":
                loss += self._forward(k, a.micro_batch, tokens, saved)
            else:
                backward[a.kind](k, a.micro_batch, saved)
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()
        self._sync_grads()
        if self.opt is not None:
            self.opt.step()
            self.opt.zero_grad()
        if self.zero is not None:
            self.zero.after_update()
            self.zero_state_bytes = self.zero.state_bytes(self.opt)
        return loss

    def _after_step(self, rec: dict) -> None:
        """Between steps, outside the step's time: a hook for measuring and dynamic batching
        (``planner.launch.measure_worker``), which add to ``rec`` and may re-set shares."""

    def train(self) -> dict:
        losses, times = [], []
        fail = os.environ.get(FAIL_ENV)
        for step in range(self.cfg["steps"]):
            if fail is not None and int(fail) == self.rank:
                raise RuntimeError(f"injected failure on rank {self.rank} ({FAIL_ENV})")
            dist.barrier()  # line the ranks up so each step's time is that step alone
            t0 = time.perf_counter()
            loss = self.step(step)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(loss)
            rec = {"step": step, "loss": loss, "time_s": times[-1]}
            self._after_step(rec)
            # One line per step for the parent's live progress (it sums the last stage's losses).
            with open(self.progress_path, "a") as fh:
                fh.write(json.dumps(rec) + "\n")
        extra = {}
        if self.zero is not None:
            extra["zero_state_bytes"] = self.zero_state_bytes
            if self.zero.stage >= 3:
                self.zero.gather()  # the full weights, for the comparison with the reference
        dist.barrier()
        return {"rank": self.rank, "stage": self.si, "replica": self.qi, "tp_rank": self.tp_rank,
                "losses": losses, "step_time_s": times,
                "split_dims": {k: dim for k, (_, dim) in self.layout.items()}, **extra}


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this worker when the runner that started it dies, so a killed
    ``planner run`` leaves no ranks waiting in collectives. Set here rather than in a Popen
    pre-exec hook, which is unsafe when the parent has threads (rich's spinner is one)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    expected = os.environ.get(PARENT_ENV)
    if expected is not None and os.getppid() != int(expected):
        os._exit(1)  # the parent died before the request took effect


def worker_class(cfg: dict) -> type[Worker]:
    """BitPipe's two weight copies need their own gradient sync (planner.launch.bitpipe_worker)."""
    if cfg["schedule"]["stage_map"] == "bitpipe":
        from planner.launch.bitpipe_worker import BitpipeWorker

        return BitpipeWorker
    return Worker


def main(argv: list[str]) -> int:
    cfg_path, rank, out_dir = argv[0], int(argv[1]), Path(argv[2])
    _die_with_parent()
    torch.set_num_threads(1)  # several ranks share few cores: one thread each avoids thrashing
    try:
        cfg = json.loads(Path(cfg_path).read_text())
        from planner.launch.measure_worker import with_measuring

        worker = with_measuring(worker_class(cfg), cfg)(cfg, rank, out_dir / f"rank{rank}.steps")
        worker.init()
        result = worker.train()
        shards = {k: v.detach().cpu().numpy() for k, v in worker.params.items()}
        np.savez(out_dir / f"rank{rank}.npz", **shards)
        (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
        dist.destroy_process_group()
        return 0
    except BaseException as exc:  # noqa: BLE001 - report everything; the parent decides what the user sees
        err = {"rank": rank, "type": type(exc).__name__, "message": str(exc),
               "traceback": traceback.format_exc()}
        tmp = out_dir / f"rank{rank}.error.json.tmp"
        tmp.write_text(json.dumps(err))
        os.replace(tmp, out_dir / f"rank{rank}.error.json")
        return 1


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: unloading torch and gloo's threads can take many seconds, and
    # the results are already on disk.
    os._exit(code)
