"""One error family with user-facing messages (DESIGN §8).

The CLI maps ``InputError`` to exit 2 and ``InfeasibleError`` to exit 1; anything else that
reaches the user is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass

# Ctrl-C: 128 + SIGINT, as shells report it.  `plan` exits so after writing the best plan
# found before the interrupt (status feasible); every command exits so when interrupted.
INTERRUPTED_EXIT = 130


@dataclass(frozen=True)
class Location:
    """Where in an input file a problem sits; line and column are 1-based."""

    file: str
    line: int | None = None
    column: int | None = None
    field: str | None = None  # field path such as ``nodes[1].gpu``

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        if self.field:
            where += f": {self.field}"
        return where


class PlannerError(Exception):
    """Base of every error meant for the user."""

    exit_code = 2

    def __init__(self, message: str, location: Location | None = None):
        self.message = message
        self.location = location
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


class InputError(PlannerError):
    """Bad input: a spec, a plan file or a flag. Exit code 2."""

    exit_code = 2


class InputErrors(InputError):
    """Several input problems found in one pass, reported together: the first ``SHOWN``, then
    how many more (a plan checked against the wrong cluster gave 96 lines of one problem)."""

    SHOWN = 12

    def __init__(self, errors: list[InputError]):
        self.errors = errors
        super().__init__(self._text())

    def _text(self) -> str:
        lines = [str(e) for e in self.errors[:self.SHOWN]]
        if len(self.errors) > self.SHOWN:
            lines.append(f"... and {len(self.errors) - self.SHOWN} more problems")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self._text()


class InfeasibleError(PlannerError):
    """No plan satisfies the constraints. Exit code 1; the message carries the numbers."""

    exit_code = 1


def debug_enabled() -> bool:
    """``PLANNER_DEBUG`` set to anything but empty, 0, false, no or off: tracebacks and solver
    output are shown."""
    import os
    return os.environ.get("PLANNER_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")
