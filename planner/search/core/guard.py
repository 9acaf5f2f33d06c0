"""Keep C-level stdout clean while a solver runs.

HiGHS prints a banner on file descriptor 1 at its first use even with ``msg=False``; when
stdout carries JSON (``planner plan --json``) that banner would corrupt it, so the solve runs
with fd 1 pointed at fd 2.
"""

from __future__ import annotations

import contextlib
import os
import sys


@contextlib.contextmanager
def stdout_to_stderr():
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no real fd 1 (some test runners): nothing to guard
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        try:
            sys.stdout.flush()
        except ValueError:
            pass
        os.dup2(saved, 1)
        os.close(saved)
