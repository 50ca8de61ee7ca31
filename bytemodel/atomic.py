"""The one atomic file write: a crash or Ctrl-C at any moment leaves either the old file or the new one.

The bytes go to a temporary file in the same folder, which is flushed and fsynced, then renamed
over the target (rename is atomic within a file system), then the folder is fsynced so the
rename itself survives a power cut. On any failure, including KeyboardInterrupt, the temporary
file is removed and the target is untouched.

Every file bytemodel writes goes through write_atomic: checkpoints, tok.json, the corpus and its
description, reader outputs, encoded/decoded id files.

What the target is matters (fileguard.py): a symlink is followed, so the link survives and the
file it names is replaced; a device or FIFO (/dev/null, /dev/stdout, a named pipe) is written into
directly, never replaced by a regular file; '-' is standard output; a directory, block device or
socket is refused. The
temporary file has a short name of its own (a 255-byte target name still works) that names the
process writing it, and each write first removes the temporary files of processes that were killed
mid-write in that folder (SIGKILL and power cuts leave them; nothing else can).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from .fileguard import is_stdio, make_temp, output_target, sweep_stale_temps, write_direct, write_stdout


def write_atomic(path: str | os.PathLike, data: bytes | Callable[[Any], None], *,
                 error: type[Exception] | None = None) -> Path:
    """Write `data` (bytes, or a function that writes into the open binary file) to `path`.

    error: an exception class (a BytemodelError) to raise with a one-line message when the OS
    refuses (disk full, read-only, no such folder); None re-raises the OSError.
    """
    if is_stdio(path):      # '-': standard output, written as it is (nothing there to replace)
        return write_stdout(data)
    try:
        path, direct = output_target(path)
        if direct:
            return write_direct(path, data)
        folder = path.parent if str(path.parent) else Path(".")
        folder.mkdir(parents=True, exist_ok=True)
        sweep_stale_temps(folder)
        fd, tmp = make_temp(folder)
    except OSError as e:
        if error is None:
            if not e.filename:     # a full disk or device (/dev/full): say which file it was
                raise OSError(e.errno, e.strerror or str(e), str(path)) from None
            raise
        raise error(f"cannot write {path}: {e.strerror or e}") from None
    try:
        os.chmod(tmp, 0o666 & ~_umask())   # as open() would make it (mkstemp makes it private)
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)        # the writer may close f (a compressor wrapping it does)
            else:
                f.write(data)
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if error is not None and isinstance(e, OSError):
            raise error(f"cannot write {path}: {e.strerror or e}") from None
        if isinstance(e, OSError) and not e.filename:   # a full disk: say which file it was
            raise OSError(e.errno, e.strerror or str(e), str(path)) from None
        raise
    try:
        _fsync(folder)     # the rename itself, durable
    except OSError:
        pass               # some file systems cannot fsync a folder
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync(p: str | os.PathLike) -> None:
    """Flush a file's or folder's data and metadata to the disk."""
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
