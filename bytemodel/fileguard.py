"""What a path may be: inputs must be regular files; outputs never replace a device, FIFO or link.

Inputs. bytemodel reads a source more than once (to detect its kind, to learn merges, to build
the corpus, for the compressor baselines) and reads checkpoints, tokenizers and prompts whole, so
a pipe would lose what the first read took, a FIFO would block, and /dev/zero would never end.
``regular_file`` refuses anything that is not a regular file (after following symlinks) in one
line that says what it is.

Outputs. ``output_target`` says where a write goes: a symlink is followed to the file it names
(which is then replaced atomically, so the link survives) when the folder it points into exists:
a dangling link's missing folders are never made (they are not the user's to make); a character device (/dev/null) or a
FIFO is written to directly, as a shell's ``>`` would, never renamed over; a directory, a block
device or a socket is refused.

Standard input and output. ``-`` as an output is standard output (``write_stdout``), as Unix tools
take it (before, a file named ``-`` was made); as an input it is refused in one line (a source is
read more than once), unless a file of that name exists.

Run folders. A folder under a source that holds a bytemodel run (``is_run_folder``: its
checkpoints, or its token file) is the run's, not data: ``bytemodel train .`` run twice in a data
folder read the first run's checkpoints and token file as training data.

Temporary files. Atomic writes put their bytes in ``.bytemodel-<pid>-<random>.tmp`` beside the
target: a short name, so a target name of up to 255 bytes still works, and one that says which
process owns it. A process killed mid-write (SIGKILL, power cut) cannot remove its temporary file;
``sweep_stale_temps`` removes those whose process is gone, and every atomic write calls it first
for its folder, so a killed save costs disk space only until the next save there.
"""
from __future__ import annotations

import errno
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from .errors import BytemodelError, SourceError

STDIO = "-"     # an output named so is standard output; an input named so is refused (no such file)
# the files that make a folder a run's (checkpoint.CKPT_NAME, BEST_NAME; corpus.TOKENS_FILE): named
# here, below those modules, for the readers that list a source's files (tests/test_newcomer_inputs.py
# checks the names agree)
RUN_MARKS = ("checkpoint.safetensors", "best.safetensors", "tokens.u16")
TEMP_PREFIX = ".bytemodel-"
_TEMP = re.compile(r"^\.bytemodel-(\d+)-[A-Za-z0-9_]+\.tmp$")


def kind_of(mode: int) -> str:
    """A file type in words, for messages."""
    for test, word in ((stat.S_ISFIFO, "pipe or FIFO"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return word
    return "special file"


def is_stdio(path: str | os.PathLike) -> bool:
    """Whether a path names standard input or output ('-')."""
    return os.fspath(path) == STDIO


def not_found(path: str | os.PathLike, what: str = "source") -> str:
    """The message for an input that does not exist ('-' named as standard input, which is not read)."""
    if is_stdio(path):
        return (f"{what} '-': standard input is not read (a source is read more than once); "
                f"save the data to a file and give that instead")
    return f"{what} not found: {path}"


def regular_file(path: str | os.PathLike, what: str = "source",
                 error: type[BytemodelError] = SourceError) -> Path:
    """``path`` if it is a regular file (symlinks followed); else a one-line ``error``."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise error(not_found(p, what)) from None
    except OSError as e:
        raise error(f"cannot read {what} {p}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        shown = f"{p} (a link to {os.path.realpath(p)})" if os.path.islink(p) else str(p)
        raise error(f"{what} {shown} is not a regular file (a {kind_of(st.st_mode)}); "
                    f"save the data to a file and give that instead")
    return p


def output_target(path: str | os.PathLike) -> tuple[Path, bool]:
    """(the path to write, direct): direct means write into it as it is (a device or FIFO).

    A symlink, dangling or not, resolves to the file it names. Directories, block devices and
    sockets raise OSError (the writers turn it into their one-line error).
    """
    p = Path(path)
    try:
        st = os.stat(p)     # follows links: /dev/stdout is a link to a pipe or a terminal
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            return p, True
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory, not a file", str(p))
        raise OSError(errno.EPERM, f"is a {kind_of(st.st_mode)}; refusing to write over it", str(p))
    if os.path.islink(p):
        real = Path(os.path.realpath(p))   # replace the file the link names, keep the link
        if not real.parent.is_dir():       # a dangling link: never make the folders it names
            raise FileNotFoundError(errno.ENOENT, f"is a link to {real}, whose folder does not exist", str(p))
        p = real
    return p, False


def write_direct(path: Path, data: bytes | Callable[[Any], None]) -> Path:
    """Write into a device or FIFO as it is (no temporary file, no rename, no fsync)."""
    with open(path, "wb") as f:
        if callable(data):
            data(f)
        else:
            f.write(data)
    return path


def is_run_folder(folder: str | os.PathLike) -> bool:
    """Whether a folder holds a bytemodel run (or an imported checkpoint): its files are not data."""
    return any(os.path.isfile(os.path.join(folder, name)) for name in RUN_MARKS)


def write_stdout(data: bytes | Callable[[Any], None]) -> Path:
    """Write to standard output (an output named '-') through a duplicate of its descriptor: the
    bytes land where the shell sent stdout (a pipe, a terminal, a file opened by > or >>), and a
    writer that closes its file (a compressor wrapping it) leaves stdout open."""
    if sys.stdout is None:
        raise OSError(errno.EBADF, "stdout is closed", STDIO)
    sys.stdout.flush()
    with os.fdopen(os.dup(sys.stdout.fileno()), "wb") as f:
        if callable(data):
            data(f)
        else:
            f.write(data)
    return Path(STDIO)


def make_temp(folder: Path) -> tuple[int, str]:
    """A new temporary file in ``folder`` named for this process: (fd, path)."""
    return tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", suffix=".tmp", dir=folder)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True   # exists, owned by someone else
    return True


def sweep_stale_temps(folder: str | os.PathLike) -> list[str]:
    """Remove temporary files in ``folder`` left by bytemodel processes that no longer run."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = _TEMP.match(name)
        if m and not _alive(int(m.group(1))):
            try:
                os.unlink(os.path.join(folder, name))
                removed.append(name)
            except OSError:
                pass
    return removed
