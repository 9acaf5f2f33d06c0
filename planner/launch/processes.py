"""The reference runner's worker processes (planner.launch.runner): launching one per rank,
following their step reports, stopping them all when one fails, and naming the rank to blame.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from planner.errors import PlannerError

if TYPE_CHECKING:
    from planner.launch.runner import RankInfo


class WorkerError(PlannerError):
    """A rank failed or the run timed out. Exit 1: the input was fine, the run was not."""

    exit_code = 1


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_env() -> dict:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the folder holding the planner package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["PLANNER_RUNNER_PARENT_PID"] = str(os.getpid())  # workers exit if this process dies
    if Path("/sys/class/net/lo").exists():
        # Everything is on this machine; stop gloo (also used for p2p under nccl) from picking
        # an interface by host name.
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _failure(out: Path, ranks: list[RankInfo], failed: list[int], procs) -> WorkerError:
    """The rank to blame: the earliest error report (the others usually fail because it did)."""
    reports = []
    for r in failed:
        f = out / f"rank{r}.error.json"
        if f.exists():
            reports.append((f.stat().st_mtime_ns, r, json.loads(f.read_text())))
    info = None
    if reports:
        _, r, err = min(reports)
        why = f"{err['type']}: {err['message']}"
        info = err
    else:
        r = failed[0]
        log = (out / f"rank{r}.log").read_text(errors="replace").strip().splitlines()
        why = f"exited with code {procs[r].returncode}" + (f": {log[-1]}" if log else "")
    ri = ranks[r]
    exc = WorkerError(f"rank {r} (stage {ri.stage}, replica {ri.replica}, tp rank {ri.tp_rank}, "
                      f"device {ri.device}) failed: {why}")
    exc.rank = r
    exc.traceback = info["traceback"] if info else None
    return exc


class _Progress:
    """Turns the workers' per-step lines into ``on_step(step, loss, step_time_s)`` calls, once
    every rank has finished the step (loss summed over the tp-rank-0 processes of the stage
    holding the head (both heads' under bitpipe), time the slowest rank's)."""

    def __init__(self, out: Path, ranks: list[RankInfo], head_stages: set[int], on_step, on_shares=None):
        self.out, self.ranks, self.heads, self.on_step = out, ranks, head_stages, on_step
        self.on_shares = on_shares  # (step, {(stage, replica): share}) when the workers report shares
        self.offsets = {r.rank: 0 for r in ranks}
        self.lines: dict[int, dict[int, dict]] = {}  # step -> rank -> line
        self.next_step = 0
        self.loss_ranks = {r.rank for r in ranks if r.tp_rank == 0}   # run_plan: loss_ranks()

    def poll(self) -> None:
        if self.on_step is None:
            return
        for r in self.ranks:
            path = self.out / f"rank{r.rank}.steps"
            if not path.exists():
                continue
            with open(path) as fh:
                fh.seek(self.offsets[r.rank])
                text = fh.read()
            done = text[:text.rfind("\n") + 1]  # a line still being written waits for next poll
            self.offsets[r.rank] += len(done)
            for line in done.splitlines():
                rec = json.loads(line)
                self.lines.setdefault(rec["step"], {})[r.rank] = rec
        while len(self.lines.get(self.next_step, {})) == len(self.ranks):
            recs = self.lines.pop(self.next_step)
            loss = sum(recs[r.rank]["loss"] for r in self.ranks
                       if r.stage in self.heads and r.rank in self.loss_ranks)
            self.on_step(self.next_step, loss, max(x["time_s"] for x in recs.values()))
            if self.on_shares is not None and all("share" in x for x in recs.values()):
                self.on_shares(self.next_step, {(r.stage, r.replica): recs[r.rank]["share"]
                                                for r in self.ranks if r.tp_rank == 0})
            self.next_step += 1


def _launch(cfg: dict, ranks: list[RankInfo], out: Path, timeout_s: float,
            progress: _Progress | None = None) -> None:
    cfg_path = out / "config.json"
    cfg_path.write_text(json.dumps(cfg))
    env = _worker_env()
    procs = []
    try:
        for r in ranks:
            with open(out / f"rank{r.rank}.log", "wb") as log:  # the child keeps its own copy
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "planner.launch.worker", str(cfg_path), str(r.rank), str(out)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env))
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                time.sleep(0.2)  # let a root cause finish writing its report
                failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
                _stop(procs)
                raise _failure(out, ranks, failed, procs)
            if progress is not None:
                progress.poll()
            if all(c == 0 for c in codes):
                if progress is not None:
                    progress.poll()
                return
            if time.monotonic() > deadline:
                _stop(procs)
                raise WorkerError(f"the run took longer than {timeout_s:.0f} s; stopped all ranks")
            time.sleep(0.05)
    finally:
        _stop(procs)  # also on KeyboardInterrupt: never leave ranks behind


