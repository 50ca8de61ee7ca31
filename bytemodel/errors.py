"""User-facing errors, and the signals that end the process.

Anything the user can cause (a bad path, a corrupt file, a wrong flag) raises a subclass of
BytemodelError with a one-line message. The CLI prints that line and exits with status 2; it never
shows a traceback for these. Programming errors stay ordinary exceptions.

A `kill` (SIGTERM) ends the process as an error would, raised where the threads can take it:
raise_soon, poll and held at the end of this file.
"""
from __future__ import annotations

import contextvars
import threading
from contextlib import contextmanager


class BytemodelError(Exception):
    """A problem with the user's input: printed as one line by the CLI."""


class SourceError(BytemodelError):
    """A training source (file, directory, reader) cannot be used.

    fact: for a file that is not of its reader's format, the message without its advice to read
    it with another --reader; score and eval, which read with the run's reader and have no
    --reader, say their own instead (None: the message has no such advice)."""

    def __init__(self, *args, fact: str | None = None):
        super().__init__(*args)
        self.fact = fact


class CheckpointError(BytemodelError):
    """A checkpoint is missing, corrupt or incompatible."""


class TokenizerError(BytemodelError):
    """A tokenizer file is corrupt or does not match."""


class ConfigError(BytemodelError):
    """An invalid setting (flag value, config key, preset name)."""


class CompressError(BytemodelError):
    """A .bmz file is corrupt, foreign, or needs another checkpoint or backend."""


# A message shared by the CLI and the Python API names a setting as its reader can give it: the
# command's flag under the CLI (its commands run inside cli_names(), as cli/errors.user_errors
# does), else the API's argument. Before: bytemodel.train(None) said "(--source PATH)", a flag a
# Python user does not have. One message text, two spellings of the name.
_cli = contextvars.ContextVar("bytemodel_cli_names", default=False)


def named(flag: str, argument: str) -> str:
    """flag ("--out DIR") inside cli_names(), else argument ("out_dir=")."""
    return flag if _cli.get() else argument


@contextmanager
def cli_names():
    """Messages raised inside name settings as the CLI's flags (see named)."""
    token = _cli.set(True)
    try:
        yield
    finally:
        _cli.reset(token)


# ================================================================================================
# Signals that end the process, raised where the threads can take it.
#
# Why: Python runs a signal handler in the main thread between any two bytecodes, so an exception
# raised from one can land inside the standard library's thread machinery: a ThreadPoolExecutor
# starting a worker, a Condition half entered. Measured (a SystemExit raised at random moments in
# CoreParallel.loss_and_grad): "RuntimeError: release unlocked lock" in threading.Event.wait, and a
# worker thread left out of its pool's bookkeeping, which the interpreter's exit then waits for
# forever; CI saw `kill` hang a training run that way. It can also leave BLAS threads computing
# while threadpoolctl lifts its limit under them.
#
# So the handlers call raise_soon(exc): outside a held() section it raises at once, as before;
# inside one it is kept, and raised by the next poll() or when the outermost section ends, when
# the threads it started have finished. The training loop is one held section polled before each
# step and each validation batch (an exception raised inside a garbage collector's callback is
# printed and dropped, so even outside the threads a run is safer polled); the short sections (a
# step's slices, a scoring batch, a queued save) end within a step, so `kill` still ends a run
# within a step.
# ================================================================================================
_depth = 0                             # held() sections open on the main thread
_pending: BaseException | None = None  # the first exception a handler asked for while held


def raise_soon(exc: BaseException) -> None:
    """From a signal handler: raise exc now, or at the end of the held section it arrived in."""
    global _pending
    if _depth:
        if _pending is None:
            _pending = exc
        return
    raise exc


def exit_on_signal(signum, frame) -> None:
    """A handler for SIGTERM: end the process with 128 + signum, unwinding like an error."""
    raise_soon(SystemExit(128 + signum))


def poll() -> None:
    """Raise here the exception a handler kept (a point of the main thread where nothing is half done)."""
    global _pending
    if _pending is not None and threading.current_thread() is threading.main_thread():
        exc, _pending = _pending, None
        raise exc


@contextmanager
def held():
    """A section the main thread does not leave half done for a signal; other threads pass through."""
    global _depth, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if not _depth and _pending is not None:
            exc, _pending = _pending, None
            raise exc
