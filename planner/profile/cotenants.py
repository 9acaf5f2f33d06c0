"""Measuring a CPU "device" that shares its machine: ``planner profile --concurrent N``.

On CPU the devices of a job are processes of one machine: they share its cores, caches and
memory bandwidth, so a layer measured by one process alone runs faster than the same layer in a
job of N processes (docs/profiles.md measured 0-40% with two processes on two cores, 2x with
four). Here N processes measure the same entries at the same time: they line up on a barrier
before each entry, then run its warm-up and timed passes side by side, much as the replicas or
stages of the job compute side by side. Times are wall clock (a process waiting for a core is
exactly what is being measured) and each process keeps the **mean** of its timed passes, not
the median: when N processes share fewer cores, the scheduler lets some passes run whole and
stalls others, and only the mean counts the stalls (a median of mostly whole passes would
report the machine as if unshared). Each entry keeps the median over the N processes' means.
A profile taken this way counts for a GPU type of its own (e.g. an inline ``cpu-shared4``).

Imports torch (through measure): loaded only by ``planner profile``.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import statistics
import time

import torch

from planner.errors import PlannerError
from planner.profile.measure import measure_entries
from planner.profile.schema import ProfileEntry
from planner.spec.model import ModelSpec

_TIMEOUT_S = 3600.0  # one entry of one process; a stuck co-tenant must not hang the command


def _cotenant(model, micro_batches, tps, seq_len, dtype, warmup, repeats, threads, barrier, out):
    try:
        torch.set_num_threads(threads)
        entries = measure_entries(model, torch.device("cpu"), micro_batches, tps, seq_len, dtype,
                                  warmup, repeats, clock=time.perf_counter, statistic=statistics.fmean,
                                  sync=lambda: barrier.wait(_TIMEOUT_S))
        out.put(("ok", [e.model_dump() for e in entries]))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent
        barrier.abort()
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def _combine(per_process: list[list[ProfileEntry]]) -> list[ProfileEntry]:
    out = []
    for column in zip(*per_process):
        first = column[0]
        if not all(e.fits for e in column):
            out.append(ProfileEntry(layer=first.layer, micro_batch=first.micro_batch, tp=first.tp,
                                    fits=False))
            continue
        out.append(first.model_copy(update={
            "forward_s": statistics.median(e.forward_s for e in column),
            "backward_s": statistics.median(e.backward_s for e in column),
            "peak_memory_bytes": max(e.peak_memory_bytes for e in column)}))
    return out


def measure_with_cotenants(model: ModelSpec, micro_batches, tps, seq_len: int, dtype: str,
                           warmup: int, repeats: int, threads: int, concurrent: int,
                           progress=None) -> list[ProfileEntry]:
    ctx = mp.get_context("spawn")  # a clean interpreter: no fork of torch's thread pools
    barrier = ctx.Barrier(concurrent)
    results = ctx.Queue()
    procs = [ctx.Process(target=_cotenant, daemon=True,
                         args=(model, micro_batches, tps, seq_len, dtype, warmup, repeats, threads,
                               barrier, results))
             for _ in range(concurrent - 1)]
    for p in procs:
        p.start()
    try:
        mine = measure_entries(model, torch.device("cpu"), micro_batches, tps, seq_len, dtype,
                               warmup, repeats, clock=time.perf_counter, statistic=statistics.fmean,
                               sync=lambda: barrier.wait(_TIMEOUT_S), progress=progress)
        theirs = []
        for _ in procs:
            status, payload = results.get(timeout=_TIMEOUT_S)
            if status != "ok":
                raise PlannerError(f"a co-tenant measuring process failed: {payload}")
            theirs.append([ProfileEntry(**e) for e in payload])
    except (queue_mod.Empty, mp.BrokenBarrierError) as exc:
        raise PlannerError(f"co-tenant measuring processes stopped answering ({exc!r})") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    return _combine([mine, *theirs])
