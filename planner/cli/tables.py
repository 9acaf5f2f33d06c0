"""Tables that never cut a value short.

rich fits a table to the console by shrinking columns and ending what no longer fits with
"…": at 80 columns "A100-SXM4-80GB" became "A100-…" and "us-central1-a" "us-ce…".  Here a
table too wide for the console is laid out so that the name columns (left-justified: zones,
GPU types, devices) keep their longest word whole and the other columns share what is left
(numbers and headers fold onto more lines, the borders alone between cells); every cell
folds rather than ends in "…".  Piped
output is wide enough not to need this (cli.common.console).
"""

from __future__ import annotations

from rich.errors import MarkupError
from rich.table import Table as RichTable
from rich.text import Text

NARROWEST_OTHER = 4     # a number column folded to this many characters still reads
PER_COLUMN = 1          # a cell's border, once a table too wide drops its cells' padding


def _plain(cell) -> str:
    """A cell's text as shown: markup such as ``[bold]`` takes no room."""
    if isinstance(cell, str):
        try:
            return Text.from_markup(cell).plain
        except MarkupError:
            return cell
    return getattr(cell, "plain", str(cell))


def _texts(column) -> list[str]:
    return [_plain(column.header), *(_plain(cell) for cell in column.cells)]


def _longest_word(column) -> int:
    return max((len(word) for text in _texts(column) for word in text.split()), default=1)


def _longest_line(column) -> int:
    return max((len(line) for text in _texts(column) for line in text.splitlines()), default=1)


def _share(columns: list, room: int) -> dict:
    """Widths for ``columns`` within ``room``: each its natural width when that is below an even
    share of what is left (water filling), the rest the even share."""
    widths, left = {}, list(columns)
    while left:
        share = room // len(left)
        small = [c for c in left if _longest_line(c) <= share]
        if not small:
            widths.update({id(c): share for c in left})
            break
        for c in small:
            widths[id(c)] = _longest_line(c)
            room -= widths[id(c)]
            left.remove(c)
    return widths


class Table(RichTable):
    def __rich_console__(self, console, options):
        for column in self.columns:
            column.overflow = "fold"
        if self.__rich_measure__(console, options).maximum > options.max_width:
            self._fit(options.max_width)
        yield from super().__rich_console__(console, options)

    def _fit(self, max_width: int) -> None:
        names = [c for c in self.columns if c.justify == "left"]
        others = [c for c in self.columns if c.justify != "left"]
        room = max_width - PER_COLUMN * len(self.columns) - 1 - sum(_longest_word(c) for c in names)
        if room < NARROWEST_OTHER * len(others):
            return          # too narrow even so: every cell folds, nothing is cut
        self.padding = (0, 0)           # the borders keep the cells apart
        widths = _share(others, room)
        for c in others:
            c.width = widths[id(c)]
        spare = room - sum(widths.values())
        for c in names:                 # what the others leave widens the names, in order
            c.width = _longest_word(c) + min(spare, _longest_line(c) - _longest_word(c))
            spare -= c.width - _longest_word(c)
