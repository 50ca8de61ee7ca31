"""Checkpoint writes beside the training: the loop hands each one to a writer thread and goes on.

Why: a validation that finds a new best writes the resume checkpoint (weights and both AdamW
moments) and best.safetensors; at base that is 1.3 GB hashed, serialised and written, several
seconds a time, which a time budget paid for out of its training (benchmarks/README.md, "Saves
beside the training"). Now the loop takes host copies of what it saves (a snapshot: the next
steps change the weights in place) and queues the writes; one thread writes them in the order
given, so the resume checkpoint still lands before the best file (training/plateau.py relies on
it). At most MAX_QUEUED writes wait, so memory stays at a few copies; the run waits for every
write before it returns, releases its folder's lock or is removed as failed. A write that fails
(disk full) is raised by the next submit or by wait(), as the loop's own error. Each write is
atomic (atomic.write_atomic): a crash or kill while one is in progress leaves the last good file.
"""
from __future__ import annotations

import queue
import threading

from ..errors import held

MAX_QUEUED = 2   # writes waiting behind the one in progress before submit() blocks


class Saver:
    def __init__(self):
        self._jobs: queue.Queue = queue.Queue(MAX_QUEUED)
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def submit(self, fn, *args) -> None:
        """Queue fn(*args) (its arguments must not change afterwards); raise an earlier write's error."""
        self._raise()
        with held():      # a `kill` lands after the thread and the queue are in order
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="bytemodel-saver", daemon=True)
                self._thread.start()
            self._jobs.put((fn, args))

    def _work(self) -> None:
        while True:
            fn, args = self._jobs.get()
            try:
                if fn is None:
                    return
                if self._error is None:     # after a failure the later writes are skipped
                    fn(*args)
            except BaseException as e:      # raised in the loop's thread by submit() / wait()
                self._error = e
            finally:
                self._jobs.task_done()

    def wait(self, quiet: bool = False) -> None:
        """Block until every queued write is on disk; raise the first failure (unless quiet: an
        error already on its way out needs no second one)."""
        if self._thread is not None:
            self._jobs.join()
        if not quiet:
            self._raise()

    def close(self, quiet: bool = False) -> None:
        """wait(), then end the writer thread."""
        try:
            self.wait(quiet)
        finally:
            if self._thread is not None:
                self._jobs.put((None, ()))
                self._thread.join()
                self._thread = None

    def _raise(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise e
