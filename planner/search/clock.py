"""The search's clock: wall time, or with ``--deterministic`` work done.

Every place the search asks "is there time left?" reads ``now()`` instead of
``time.monotonic()``.  Normally that is the wall clock.  Under ``work_clock`` it is virtual
time: the work counted so far times ``seconds_per_unit`` (the time limit over the work
budget), so every deadline, share of the limit and measured duration the search computes
(solve.py, incumbent.py, per_tuple.py, polish.py, packed.py, bound.py, position_lp.py,
core/enum.py, core/milp.py) becomes one of work, and identical inputs take identical
decisions on any machine however fast it is, even when the budget binds.

Work counted (``charge``), in units:

- each read of the clock: 1 (every loop that checks its deadline makes progress);
- pricing a knob tuple: options x stages (solve.py, incumbent.py: ``priced``);
- ranking a knob tuple by its bound: its options / ``RANK_PER_UNIT`` (solve.py);
- a MILP: ``MILP_NODE_UNITS`` per branch-and-bound node plus its simplex iterations, the
  node limit set from the budget left so HiGHS stops inside it (core/milp.py);
- an LP of the packed bound: its simplex iterations (position_lp.py);
- an enumeration chunk: its assignments / ``ENUM_PER_UNIT`` (core/enum.py).

The wall-clock limit stays the user's guard: past it ``now()`` is ``inf`` (every deadline
has passed) and the report says ``wall_clock_bound``, the one case where two machines may
differ.

A thread of the search (the warm start beside the heap, background.py) runs under
``stoppable(event)``: once the event is set its ``now()`` is ``inf`` too, so every deadline it
checks has passed and it winds down where it would at its limit.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
import time
from dataclasses import dataclass

UNITS_PER_S = 20_000      # the default budget: this many units per second of the time limit
MILP_NODE_UNITS = 50      # one branch-and-bound node (an LP re-solve and its bookkeeping)
ENUM_PER_UNIT = 10_000    # assignments priced by the vectorised enumeration per unit
# options ranked per unit: ranking bench c's 571,896 options took 1.35 s here (2.4 us each),
# a unit stands for 1 / UNITS_PER_S = 50 us; charged one unit each, ranking alone spent
# 95% of c's default 30 s budget and --deterministic found no plan
RANK_PER_UNIT = 20


@dataclass
class WorkClock:
    seconds_per_unit: float     # virtual seconds one unit of work stands for
    wall_stop: float            # time.monotonic() past which the user's guard stops the search
    units: float = 0.0
    wall_clock_bound: bool = False

    def now(self) -> float:
        self.units += 1
        if time.monotonic() > self.wall_stop:
            self.wall_clock_bound = True
            return math.inf
        return self.units * self.seconds_per_unit

    def units_left(self, deadline: float) -> float:
        """Work units until the virtual ``deadline``: none once the user's wall-clock guard has
        stopped the search; ``inf`` for no deadline.  Past the guard ``now()`` is inf, so a
        deadline taken from it (``now() + share``) is inf too: that read as no deadline, and
        the MILP's node cap became inf // units = NaN (a fuzzed deterministic cost search
        crashed with ValueError, scripts/fuzz_plans.py)."""
        if self.wall_clock_bound or time.monotonic() > self.wall_stop:
            self.wall_clock_bound = True
            return 0.0
        return max(0.0, deadline / self.seconds_per_unit - self.units)


_CLOCK: contextvars.ContextVar[WorkClock | None] = contextvars.ContextVar("search_work_clock", default=None)
_STOP: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("search_stop", default=None)


def active() -> WorkClock | None:
    """The work clock of a deterministic search in progress, or None (wall clock)."""
    return _CLOCK.get()


def now() -> float:
    stop = _STOP.get()
    if stop is not None and stop.is_set():
        return math.inf
    clock = _CLOCK.get()
    return time.monotonic() if clock is None else clock.now()


def stop_event() -> threading.Event | None:
    """The event that stops this thread's search work early (``stoppable``), if any: HiGHS's
    interrupt callbacks read it (core/highs.py), as they read the wall clock."""
    return _STOP.get()


@contextlib.contextmanager
def stoppable(event: threading.Event):
    """Run the body with ``now()`` at ``inf`` once ``event`` is set."""
    token = _STOP.set(event)
    try:
        yield
    finally:
        _STOP.reset(token)


def charge(units: float) -> None:
    """Count ``units`` of work done (nothing on the wall clock: there time counts)."""
    clock = _CLOCK.get()
    if clock is not None:
        clock.units += units


def wall_left_s() -> float:
    """Wall seconds to the user's guard (inf without a work clock: the caller's deadline rules)."""
    clock = _CLOCK.get()
    return math.inf if clock is None else clock.wall_stop - time.monotonic()


def default_budget(time_limit_s: float) -> int:
    return max(1, round(time_limit_s * UNITS_PER_S))


@contextlib.contextmanager
def work_clock(time_limit_s: float, work_budget: int | None):
    """Run the search on a work clock: ``work_budget`` units (default ``default_budget``) stand
    for ``time_limit_s`` virtual seconds, and the wall clock still stops it at the limit."""
    budget = work_budget if work_budget is not None else default_budget(time_limit_s)
    clock = WorkClock(seconds_per_unit=time_limit_s / budget, wall_stop=time.monotonic() + time_limit_s)
    token = _CLOCK.set(clock)
    try:
        yield clock
    finally:
        _CLOCK.reset(token)
