"""Writing an output file whole or not at all: a temporary file beside the target, renamed onto
it, the target's missing folders created first (as ``plan -o`` does; the CLI's
``check_writable`` accepts a path whose folders can be created, before the long work)."""

from __future__ import annotations

import os
from pathlib import Path

from planner.errors import InputError


def file_suffix(path: str | Path) -> str:
    """``path``'s extension, lower case, with its dot; a name that is only an extension
    (``.png``, which ``Path.suffix`` reads as a hidden file with none) counts as one."""
    name = Path(path).name
    dot = name.rfind(".")
    return name[dot:].lower() if dot >= 0 and dot < len(name) - 1 else ""


def staged_path(path: Path) -> Path:
    """Where ``path``'s content is written before its rename: beside it, hidden, same suffix
    (matplotlib picks the format from it)."""
    return path.with_name(f".{path.name}.partial{file_suffix(path)}")


def write_staged(path: str | Path, write, keep_staged: bool = False) -> Path:
    """Call ``write(tmp)`` for a temporary path beside ``path``, then rename it onto ``path``;
    on any failure remove the temporary file and raise ``InputError`` naming ``path``.
    ``keep_staged``: return the temporary file unrenamed (the caller renames it once its other
    outputs are written: ``planner simulate``'s timeline and trace, both or neither)."""
    path = Path(path)
    tmp = staged_path(path)
    made = missing_folders(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        if keep_staged:
            return tmp
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        remove_empty(made)
        raise InputError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        _remove(tmp)
        remove_empty(made)
        raise
    return path


def missing_folders(path: str | Path) -> list[Path]:
    """The folders above ``path`` that do not exist yet, deepest first: what writing it
    creates, and what a failed write takes away again (``remove_empty``)."""
    out = []
    folder = Path(path).parent
    while not folder.exists() and folder != folder.parent:
        out.append(folder)
        folder = folder.parent
    return out


def remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty; leave the rest."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            pass


def _remove(tmp: Path) -> None:
    """Drop a temporary file if there is one; where its folder cannot be a folder (a file
    in the way, the very reason the write failed) there is none to drop."""
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def save_figure(fig, path: str | Path, dpi: int, keep_staged: bool = False) -> Path:
    """A matplotlib figure to ``path`` (.png or .svg), whole or not at all; the saved area
    takes in whatever is drawn outside the axes (a legend below them), never cut off."""
    path = Path(path)
    return write_staged(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=file_suffix(path)[1:],
                                                      bbox_inches="tight"), keep_staged)
