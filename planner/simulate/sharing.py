"""Processor sharing: the "devices" of a CPU node are processes on fewer cores.

When ``k`` processes of a node compute at once on ``C`` cores, the OS time-slices them; over
an op's length each gets ``min(1, C/k)`` of a core (processor sharing, Kleinrock 1967).  The
per-op times the simulator is given are for a process computing alone (speed 1), so an op's
wall time is its work divided by the speeds it ran at while other ops came and went.  Sends
wait on the network, not a core, and are not slowed.  Cache and memory-bandwidth contention
between co-scheduled processes is not modelled (a profile measured with co-tenants holds it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CoreShare:
    """One node's cores and, per pipeline stage, how many of the stage's processes compute on
    them while the stage runs an op (its replicas' tp summed over those on this node)."""

    cores: float
    processes: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.cores > 0:
            raise ValueError(f"cores must be positive, got {self.cores!r}")
        if any(n < 0 for n in self.processes):
            raise ValueError(f"process counts must be non-negative, got {self.processes!r}")

    @property
    def oversubscribed(self) -> bool:
        """More processes than cores when every stage computes: sharing can slow something."""
        return sum(self.processes) > self.cores


def processor_sharing_makespan_s(works_s: Sequence[float], cores: float) -> float:
    """Jobs of ``works_s`` seconds (alone) started together on ``cores`` shared cores: the
    time until the last ends.  Equal shares make jobs end in order of size, so walk the sorted
    works: between two ends the ``k`` still running each advance at ``min(1, C/k)``."""
    if not cores > 0:
        raise ValueError(f"cores must be positive, got {cores!r}")
    ordered = sorted(float(w) for w in works_s)
    n = len(ordered)
    t_s = done_s = 0.0
    for i, work_s in enumerate(ordered):
        t_s += (work_s - done_s) / min(1.0, cores / (n - i))
        done_s = work_s
    return t_s


class SharedCores:
    """The running compute ops of a simulation and their speeds under processor sharing.

    Speeds are constant between events, so the simulator asks for the next finish, advances
    every op's remaining work to the next event and starts the new ones at that time."""

    def __init__(self, shares: Sequence[CoreShare], num_stages: int) -> None:
        for sh in shares:
            if len(sh.processes) != num_stages:
                raise ValueError(f"a CoreShare lists {len(sh.processes)} stages, the pipeline has {num_stages}")
        self.shares = [sh for sh in shares if sh.oversubscribed]
        self.running: dict[int, list] = {}  # stage -> [remaining work s, start s, payload]
        self.last_s = 0.0

    def start(self, stage: int, now_s: float, work_s: float, payload: tuple) -> None:
        self.running[stage] = [work_s, now_s, payload]

    def _speeds(self) -> dict[int, float]:
        active = [sum(sh.processes[s] for s in self.running) for sh in self.shares]
        speeds = {}
        for s in self.running:
            speed = 1.0
            for sh, k in zip(self.shares, active):
                if sh.processes[s] and k > sh.cores:
                    speed = min(speed, sh.cores / k)
            speeds[s] = speed
        return speeds

    def next_finish_s(self) -> float:
        if not self.running:
            return math.inf
        speeds = self._speeds()
        return self.last_s + min(op[0] / speeds[s] for s, op in self.running.items())

    def advance(self, now_s: float) -> list[tuple[float, tuple]]:
        """Move to ``now_s``; returns (start s, payload) of the ops that ended by then."""
        speeds = self._speeds()
        slack_s = 1e-12 * max(1.0, abs(now_s))  # float dust from the division above
        ended = []
        for s in sorted(self.running):
            op = self.running[s]
            if self.last_s + op[0] / speeds[s] <= now_s + slack_s:
                ended.append((op[1], op[2]))
                del self.running[s]
            else:
                op[0] -= speeds[s] * (now_s - self.last_s)
        self.last_s = now_s
        return ended
