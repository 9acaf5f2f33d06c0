"""The warm start beside the heap (docs/search-space.md, "How it is searched", step 4).

On the wall clock the warm start runs in a thread of its own while the main thread climbs the
knob bounds: most of its time is HiGHS solving capped MILPs (bench c: 8.3 of its 8.8 s), and
HiGHS lets go of the GIL while it solves, so those seconds become bound climbing instead of
waiting.  The heap prunes against whatever the incumbent is when it looks (``Best`` is safe to
add to from the thread), and every bound stays a bound whatever incumbent it was asked to
reach, so the answer and its gap keep their meaning.

The thread has its own ``KnobBound`` (its packed bound's LPs hold one HiGHS model at a time);
the ``Pricer``'s caches are memo tables, shared.  A deterministic search (``--deterministic``,
the work clock) runs the warm start first and in line, as before: two threads would take
their turns in an order no budget fixes.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable

from planner.search import clock

# How long the search waits for a stopped warm start: a MILP ends within milliseconds of the
# stop, while pricing a tuple's mixed stages cannot be cut short (a fuzzed 3-s search with
# mixed stages waited 7 s for one, the heap long done).
STOP_GRACE_S = 0.3
# How long the interpreter's exit waits for a warm start still running.  A thread inside
# HiGHS when Python finalises is ended by a forced unwind through HiGHS's C++ frames, which
# aborts the process ("terminate called without an active exception", exit 134: a plan run
# whose search had finished lost its summary that way); the stopped thread ends within
# seconds, at the end of the work it is in.
EXIT_WAIT_S = 60.0
_running: dict[threading.Thread, threading.Event] = {}     # started and not yet ended


@atexit.register
def _wait_at_exit() -> None:
    for thread, stop in list(_running.items()):
        stop.set()
        thread.join(EXIT_WAIT_S)


class BackgroundWarmStart:
    """``run()`` in a thread, stoppable: ``stop()`` sets the thread's stop event (its clock then
    reads inf and its MILP is interrupted, core/highs.py), waits for it, and raises what it
    raised."""

    def __init__(self, run: Callable[[], None]):
        self._run = run
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="planner-warm-start", daemon=True)

    def start(self) -> BackgroundWarmStart:
        _running[self._thread] = self._stop
        self._thread.start()
        return self

    def _main(self) -> None:
        try:
            with clock.stoppable(self._stop):
                self._run()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread in stop()
            self._error = exc
        finally:
            _running.pop(self._thread, None)

    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, raise_error: bool = True, grace_s: float | None = STOP_GRACE_S) -> bool:
        """Stop the thread and wait up to ``grace_s`` for it (None: as long as it takes);
        whether it ended.  One still running is in work nothing interrupts (pricing a tuple's
        mixed stages: seconds) and is left to end on its own: its clock reads inf, so it
        starts nothing after that work, and the caller closes the incumbents it would add to
        (``Best.close``)."""
        self._stop.set()
        self._thread.join(grace_s)
        if self._thread.is_alive():
            return False
        if raise_error and self._error is not None:
            raise self._error
        return True


def concurrent_allowed() -> bool:
    """Whether the warm start may run beside the heap: on the wall clock only."""
    return clock.active() is None
