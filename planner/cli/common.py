"""Shared CLI pieces: consoles, JSON output, atomic file writes."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import click
from rich.console import Console


def console(quiet: bool = False) -> Console:
    """Human output goes to stderr when stdout must stay machine-readable."""
    return Console(stderr=quiet, highlight=False, soft_wrap=False)


def echo_json(data) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


def write_atomic(path: str | Path, text: str) -> None:
    """Write via a temp file in the same folder and rename, so no half-written file is left."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        # mkstemp makes the file 0600; give it the mode a plain open() would have.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
