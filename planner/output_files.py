"""Writing an output file whole or not at all: a temporary file beside the target, renamed onto
it, the target's missing folders created first (as ``plan -o`` does; the CLI's
``check_writable`` accepts a path whose folders can be created, before the long work)."""

from __future__ import annotations

import os
from pathlib import Path

from planner.errors import InputError


def staged_path(path: Path) -> Path:
    """Where ``path``'s content is written before its rename: beside it, hidden, same suffix
    (matplotlib picks the format from it)."""
    return path.with_name(f".{path.stem}.partial{path.suffix}")


def write_staged(path: str | Path, write) -> Path:
    """Call ``write(tmp)`` for a temporary path beside ``path``, then rename it onto ``path``;
    on any failure remove the temporary file and raise ``InputError`` naming ``path``."""
    path = Path(path)
    tmp = staged_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def save_figure(fig, path: str | Path, dpi: int) -> Path:
    """A matplotlib figure to ``path`` (.png or .svg), whole or not at all."""
    path = Path(path)
    return write_staged(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=path.suffix.lower()[1:]))
