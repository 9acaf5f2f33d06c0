"""Writing a launch's files: all of them or none.

Every file is first written in full to a hidden temporary file in the target folder; only when
all are on disk are they renamed into place (a rename within one folder is atomic on POSIX).
A failure while staging removes the temporaries and leaves the folder as it was.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from planner.errors import InputError


def write(files: dict[str, str], out_dir: str | Path) -> list[Path]:
    """Write ``files`` (name -> text) into ``out_dir``: all of them or none; an OS failure is an
    ``InputError`` naming the folder."""
    out = Path(out_dir)
    for name in files:
        # Names come from our own writers; refuse anything that could leave the folder.
        if not name or "/" in name or name.startswith("."):
            raise InputError(f"launch: refusing to write file name {name!r}")
    if out.exists() and not out.is_dir():
        raise InputError(f"launch: -o {out} exists and is not a folder")
    created_dir = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the folder {out}: {exc.strerror or exc}") from None
    staged: list[tuple[str, Path]] = []
    try:
        for name in sorted(files):
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=out)
            staged.append((tmp, out / name))
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
                fh.write(files[name])
                fh.flush()
                os.fsync(fh.fileno())
            # Node scripts are run directly; the rest are data.
            os.chmod(tmp, 0o755 if name.endswith(".sh") else 0o644)
    except BaseException as exc:
        for tmp, _ in staged:
            Path(tmp).unlink(missing_ok=True)
        if created_dir:
            try:
                out.rmdir()
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise InputError(f"cannot write to {out}: {exc.strerror or exc}") from None
        raise
    for tmp, final in staged:
        os.replace(tmp, final)
    return [final for _, final in staged]
