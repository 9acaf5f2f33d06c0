"""Keep C-level output of the solver off the user's terminal and out of JSON.

HiGHS prints a copyright banner on file descriptor 1 at its first use even with
``msg=False``; when stdout carries JSON (``planner plan --json``) that banner would corrupt
it, and with ``--quiet`` it is noise on stderr.  The solver is run with ``msg=False`` and
reports everything we use through its API, so fd 1 goes to /dev/null while it runs
(``PLANNER_DEBUG=1``: to stderr instead, to see what HiGHS says).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

from planner.errors import debug_enabled

# fd 1 is the process's, and the warm start's MILPs run in a thread beside the heap's
# (search/background.py): each saving and restoring fd 1 on its own, one thread saved the
# other's /dev/null and restored it last, and everything the process wrote after the search
# went nowhere (seen: a script's result lines after a 16,384-GPU search; `plan --json` would
# have lost its JSON).  So the first to enter redirects, the last to leave restores.
_LOCK = threading.Lock()
_depth = 0
_saved: tuple[int, int] | None = None       # (the real fd 1, the fd put in its place)


@contextlib.contextmanager
def solver_output_silenced():
    global _depth, _saved
    with _LOCK:
        if _depth == 0:
            _saved = _redirect()
        _depth += 1
    try:
        yield
    finally:
        with _LOCK:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                _restore(*_saved)
                _saved = None


def _redirect() -> tuple[int, int] | None:
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no real fd 1 (some test runners): nothing to guard
        return None
    target = os.dup(2) if debug_enabled() else os.open(os.devnull, os.O_WRONLY)
    os.dup2(target, 1)
    return saved, target


def _restore(saved: int, target: int) -> None:
    try:
        sys.stdout.flush()
    except ValueError:
        pass
    os.dup2(saved, 1)
    os.close(saved)
    os.close(target)
