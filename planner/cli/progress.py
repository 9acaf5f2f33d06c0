"""The search's progress on stderr: its messages as lines and, on a terminal, a live line
below them with the time spent and left, refreshed four times a second, so that a long MILP
is never a silent stretch.  Piped (a CI log) it prints the messages alone."""

from __future__ import annotations

import time
from typing import Self

from rich.console import Console
from rich.live import Live
from rich.text import Text

REFRESH_PER_S = 4


class SearchStatus:
    """``with SearchStatus(console, time_limit_s) as status: ... progress=status.message``."""

    def __init__(self, console: Console, time_limit_s: float, quiet: bool = False):
        self.console, self.time_limit_s, self.quiet = console, time_limit_s, quiet
        self.last = "ranking knob tuples"
        self.t0 = time.monotonic()
        self.live: Live | None = None

    def __enter__(self) -> Self:
        self.t0 = time.monotonic()
        if not self.quiet and self.console.is_terminal:
            self.live = Live(console=self.console, get_renderable=self._render, transient=True,
                             refresh_per_second=REFRESH_PER_S)
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def message(self, msg: str) -> None:
        self.last = msg
        if not self.quiet:
            self.console.print(f"[dim]{msg}[/dim]", highlight=False)

    def _render(self) -> Text:
        spent = time.monotonic() - self.t0
        left = max(0.0, self.time_limit_s - spent)
        return Text(f"searching: {spent:.1f} s, {left:.1f} s of {self.time_limit_s:g} s left; {self.last}",
                    no_wrap=True, overflow="ellipsis")
