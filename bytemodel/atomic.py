"""Atomic file writes: a crash or Ctrl-C at any moment leaves either the old file or the new one.

The bytes go to a temporary file in the same folder, which is flushed and fsynced, then renamed
over the target (rename is atomic within a file system), then the folder is fsynced so the
rename itself survives a power cut. On any failure, including KeyboardInterrupt, the temporary
file is removed and the target is untouched.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return path
