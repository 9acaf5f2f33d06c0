"""The search's progress on stderr: its messages as lines and, on a terminal, a live line
below them, redrawn four times a second, so that a long MILP is never a silent stretch: the
best plan so far with its tokens/s (and USD/hour where the objective prices), the proved
bound and the gap between them, and the time spent and left.  Piped (a CI log) it prints the
messages alone."""

from __future__ import annotations

import time
from typing import Self

from rich.console import Console
from rich.live import Live
from rich.text import Text

from planner import api

REFRESH_PER_S = 4


class SearchStatus:
    """``with SearchStatus(console, time_limit_s) as status: ... progress=status.message,
    watch=status.watch``."""

    def __init__(self, console: Console, time_limit_s: float, quiet: bool = False):
        self.console, self.time_limit_s, self.quiet = console, time_limit_s, quiet
        self.last = "ranking knob tuples"
        self.t0 = time.monotonic()
        self.live: Live | None = None
        self.watch = api.search_watch()

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

    def line(self) -> str:
        """Numbers first, so that at 80 columns the ellipsis takes the message, not them."""
        spent = time.monotonic() - self.t0
        left = max(0.0, self.time_limit_s - spent)
        clock = f"{spent:.1f} s, {left:.1f} s of {self.time_limit_s:g} s left"
        snap = self.watch.snapshot()
        if snap is None or snap.best_label is None:
            return f"no plan yet, {clock}; {self.last}"
        return f"{clock}; {best_part(snap)}, {bound_part(snap)}; {snap.best_label}; {self.last}"

    def _render(self) -> Text:
        return Text(self.line(), no_wrap=True, overflow="ellipsis")


def best_part(snap) -> str:
    """The best plan's value in the objective's own terms, then the other figures."""
    tps = "" if snap.best_tokens_per_s is None else f"{snap.best_tokens_per_s:,.0f} tokens/s"
    usd = "" if snap.best_usd_per_hour is None else f"{snap.best_usd_per_hour:,.2f} USD/h"
    if snap.objective_kind == "throughput":
        return f"best {tps}"
    if snap.objective_kind == "throughput-under-budget":
        return f"best {tps} ({usd})"
    if snap.objective_kind == "cost":
        return f"best {per_mtoken(snap, snap.best_value):.4g} USD/Mtoken ({usd}, {tps})"
    return f"best {usd} ({tps})"


def per_mtoken(snap, value: float) -> float:
    """The cost objective's value (USD/hour x s per iteration) per million tokens."""
    return value / 3600 / snap.tokens_per_iteration * 1e6


def bound_part(snap) -> str:
    """The proved bound in the unit of the best's first figure, and the gap."""
    if snap.bound is None or snap.gap is None:
        return "no bound proved yet"
    gap = f"gap {100 * snap.gap:.2f}%"
    if snap.bound_tokens_per_s is not None:
        return f"bound {snap.bound_tokens_per_s:,.0f}, {gap}"
    if snap.objective_kind == "cost":
        return f"bound {per_mtoken(snap, snap.bound):.4g}, {gap}"
    return f"bound {snap.bound:,.2f}, {gap}"
