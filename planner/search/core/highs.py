"""The MILP solver behind core/milp.py: HiGHS through pulp (CBC where highspy is missing),
with a wall-clock guard on HiGHS's interrupt callbacks, Ctrl-C turned into an interrupt of
the running solve, a deterministic search's node budget and the sub-MIP heuristics that can
spin past a time limit switched off."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
import warnings
from dataclasses import dataclass

import pulp

from planner.search import clock

try:  # highspy is a dependency, but keep CBC as the fallback DESIGN §6 asks for
    import highspy
    HAVE_HIGHS = True
except ImportError:  # pragma: no cover - exercised only without highspy
    HAVE_HIGHS = False

# pulp 3.3 warns that LpVariable(...) changes in pulp 4; we pin pulp < 4 (pyproject).
warnings.filterwarnings("ignore", message=".*PuLP 4.0.*", category=DeprecationWarning)



def quiet_highs():
    """A bare HiGHS model for the bounds' small LPs (position_lp.py, core/path_bound.py): no
    banner (its first use prints one on fd 1), no log, one thread (HiGHS's thread pool is
    process-wide and fixed by its first run: the MILPs run with one thread, and a pool started
    with more makes them fail)."""
    from planner.search.core.guard import solver_output_silenced
    with solver_output_silenced():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    return h


# HiGHS's sub-MIP heuristics (RENS, RINS, root reduced cost) presolve a sub-MIP, and that
# presolve can cycle forever in HPresolve::strengthenInequalities without checking the time
# limit or calling the interrupt callbacks (HiGHS 1.16.0: a 116-column warm-start MILP of the
# 462B Megatron row spun for minutes past its 4 s limit; the class of bug is ERGO-Code/HiGHS
# issues #1883 and #2226).  The search's own warm start and polish find incumbents, and a
# limit that holds matters more than those heuristics' speed-up on these small models.
SUB_MIP_HEURISTICS_OFF = {"mip_heuristic_run_rens": False, "mip_heuristic_run_rins": False,
                          "mip_heuristic_run_root_reduced_cost": False}


@dataclass
class MilpSettings:
    time_limit_s: float = 60.0
    gap_rel: float = 0.0          # 0 = prove optimality
    threads: int | None = 1       # HiGHS threads are process-wide; one keeps runs reproducible


if HAVE_HIGHS:
    class _HiGHS(pulp.HiGHS):
        """pulp's HiGHS with a wall-clock guard: HiGHS's own time limit is not checked
        everywhere (a 1f1b tuple of the README job ran past it by minutes), so its interrupt
        callbacks stop it shortly after the limit too."""

        def __init__(self, *args, hard_deadline: float | None = None, **kwargs):
            super().__init__(*args, **kwargs)
            self.hard_deadline = hard_deadline

        def findSolutionValues(self, lp):
            model = lp.solverModel
            if model.getModelStatus() != highspy.HighsModelStatus.kSolutionLimit:
                return super().findSolutionValues(lp)
            # pulp 3 has no entry for HiGHS's node limit (mip_max_nodes: a deterministic
            # search's work budget, clock.py): read it as the iteration limit it is
            real = type(model).getModelStatus
            try:
                type(model).getModelStatus = lambda _self: highspy.HighsModelStatus.kIterationLimit
                return super().findSolutionValues(lp)
            finally:
                type(model).getModelStatus = real

        def createAndConfigureSolver(self, lp):
            super().createAndConfigureSolver(lp)
            stop = self.hard_deadline
            if stop is None:
                return
            # a search thread stopped from outside (the warm start beside the heap): its MILP
            # stops at once, as at its limit
            stopped = clock.stop_event() or _NEVER

            def guard(event):
                if time.monotonic() > stop or _SIGINT.is_set() or stopped.is_set():
                    event.interrupt()

            model = lp.solverModel
            model.cbMipInterrupt += guard
            model.cbSimplexInterrupt += guard
            model.cbIpmInterrupt += guard


_SIGINT = threading.Event()
_NEVER = threading.Event()          # never set: the guard's stop event outside a stoppable thread


@contextlib.contextmanager
def ctrl_c_stops_highs():
    """Ctrl-C during a solve: a KeyboardInterrupt raised inside HiGHS's callback is swallowed
    by highspy (the search ran on to its limit and exited 0), so the signal only sets a flag,
    the callback interrupts HiGHS, and the interrupt is raised once the solve returns."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _SIGINT.clear()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: _SIGINT.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if _SIGINT.is_set():
        _SIGINT.clear()
        raise KeyboardInterrupt


def make_solver(settings: MilpSettings, time_left_s: float, cutoff: float | None = None,
            max_nodes: int | None = None):
    """``max_nodes``: a deterministic search's work left, as branch-and-bound nodes (clock.py)."""
    limit = max(0.05, time_left_s)
    if HAVE_HIGHS:
        extra = {"objective_bound": float(cutoff)} if cutoff is not None and math.isfinite(cutoff) else {}
        if max_nodes is not None:
            extra["mip_max_nodes"] = max_nodes
        return _HiGHS(msg=False, timeLimit=limit, gapRel=settings.gap_rel, threads=settings.threads,
                      mip_abs_gap=1e-12, mip_feasibility_tolerance=1e-9,
                      primal_feasibility_tolerance=1e-9, hard_deadline=time.monotonic() + limit + 0.05,
                      **SUB_MIP_HEURISTICS_OFF, **extra)
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=max(1, math.ceil(limit)), gapRel=settings.gap_rel)
