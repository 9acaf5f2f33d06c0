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

from planner.errors import debug_enabled


@contextlib.contextmanager
def solver_output_silenced():
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no real fd 1 (some test runners): nothing to guard
        yield
        return
    target = os.dup(2) if debug_enabled() else os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(target, 1)
        yield
    finally:
        try:
            sys.stdout.flush()
        except ValueError:
            pass
        os.dup2(saved, 1)
        os.close(saved)
        os.close(target)
