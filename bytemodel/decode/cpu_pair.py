"""A second thread for the products of one token on the CPU (decode/cpu_step.py), so that both
cores stream the weights, each product's output columns split in parts.

    pair = Pair(parts)          # parts >= 2; the helper thread waits on a lock
    pair.run(chunks)            # chunks: `parts` callables (no arguments) that write disjoint outputs;
                                # returns when all have run, chunk 0 always on the caller's thread
    pair.close()                # the helper thread ends

Work stealing, so a loaded machine costs no more than one thread: the caller runs chunk 0, then
claims chunks 1, 2, ... in turn; the helper, woken by run, claims them from the last down; each
claim is one non-blocking lock acquire, so every chunk runs exactly once. When the caller's claim
fails, the helper holds the rest and the caller waits for it (one lock); when the helper has not
woken in time the caller runs everything itself. NumPy releases the GIL inside np.matmul, so two
products run at once; between them each thread runs a few bytecodes.

Why the bits stay the same: a chunk is the same np.matmul on a column slice of the weights (the
same row stride, a start aligned to ALIGN columns) into the matching slice of the output, and
BLAS computes each output of a (1, C) x (C, N) product as one dot product over C whatever the
number of columns (the tail of N % 4 rows of OpenBLAS's kernel stays the tail when every part but
the last is a multiple of ALIGN). tests/test_decode_cpu_pair.py holds the logits to the one-thread
step's and forward_cached's with np.array_equal.
"""
from __future__ import annotations

import threading
from functools import partial

import numpy as np

ALIGN = 16   # columns: a part starts on a 64-byte boundary of a row (float32) and is a multiple of 4


def bounds(n: int, parts: int) -> list[int]:
    """Column bounds [0, b1, ..., n] of `parts` parts of n columns, each inner bound a multiple
    of ALIGN (fewer parts when n is too narrow to split)."""
    cuts = sorted({min(n, max(ALIGN, round(n * i / parts / ALIGN) * ALIGN)) for i in range(1, parts)})
    return [0] + [c for c in cuts if 0 < c < n] + [n]


def product_chunks(x, w, out, parts: int) -> list:
    """np.matmul(x, w, out=out) as chunks over column parts of w and out: x (1, C), w (C, N), out (1, N)."""
    b = bounds(w.shape[1], parts)
    return [partial(np.matmul, x, w[:, lo:hi], out=out[:, lo:hi]) for lo, hi in zip(b, b[1:])]


class Pair:
    """The caller's thread and one helper thread, for runs of `parts` chunks (module docstring)."""

    def __init__(self, parts: int = 2):
        if parts < 2:
            raise ValueError("a pair runs at least two parts")
        self.parts = parts
        self.go = threading.Lock()                   # released: a run is posted
        self.done = threading.Lock()                 # released by the helper after the chunks it took
        self.claims = [threading.Lock() for _ in range(parts)]   # held between runs; [0] unused
        for lk in (self.go, self.done, *self.claims):
            lk.acquire()
        self.chunks, self.error, self.stop = None, None, False
        self.thread = threading.Thread(target=self._helper, name="bytemodel-cpu-pair", daemon=True)
        self.thread.start()

    def _helper(self):
        claims = self.claims
        while True:
            self.go.acquire()
            if self.stop:
                return
            took = False
            for i in range(self.parts - 1, 0, -1):
                if not claims[i].acquire(False):
                    break
                took = True
                try:
                    self.chunks[i]()      # read after the claim: run() sets chunks before any release
                except BaseException as e:   # handed to the caller, which re-raises it
                    self.error = e
            if took:
                self.done.release()

    def run(self, chunks) -> None:
        if len(chunks) != self.parts:     # a narrow product: fewer parts than the pair's, on this thread
            for c in chunks:
                c()
            return
        self.chunks = chunks
        for lk in reversed(self.claims[1:]):   # from the last down, as the helper claims
            lk.release()
        if self.go.locked():                   # only this thread releases it, only the helper takes it
            self.go.release()
        chunks[0]()
        for i in range(1, self.parts):
            if not self.claims[i].acquire(False):   # the helper holds chunks i.. : wait for them
                self.done.acquire()
                break
            chunks[i]()
        if self.error is not None:
            e, self.error = self.error, None
            raise e

    def close(self) -> None:
        if self.thread.is_alive():
            self.stop = True
            if self.go.locked():
                self.go.release()
            self.thread.join()


class Faster:
    """Picks the faster of two ways to run a step (0: one thread, 1: the pair) by the median of
    each way's last KEEP times, and tries the other way again after `gap` steps: PROBE at first,
    doubled (up to MAX_GAP) each time a try confirms the choice, PROBE again when one changes it.
    Whether a second core is free changes with the machine's load, and the two ways give the same
    bits, so the choice is only ever one of speed; on a machine where the pair loses, the tries
    cost about 1/MAX_GAP of the steps."""

    KEEP, PROBE, MAX_GAP = 5, 8, 64

    def __init__(self):
        self.times = ([], [])
        self.best, self.gap, self.next, self.trying = 1, self.PROBE, self.PROBE, False
        self.n = 0
        self.steps = [0, 0]            # steps run each way (benchmarks/cpu_pair.py reports them)

    def pick(self) -> int:
        self.n += 1
        if not self.times[0] or not self.times[1]:
            return 0 if not self.times[0] else 1
        self.trying = self.n >= self.next
        return 1 - self.best if self.trying else self.best

    def took(self, way: int, seconds: float) -> None:
        self.steps[way] += 1
        t = self.times[way]
        t.append(seconds)
        if len(t) > self.KEEP:
            del t[0]
        if not (self.times[0] and self.times[1]):
            return
        med = [sorted(x)[len(x) // 2] for x in self.times]
        best = int(med[1] < med[0])
        if self.trying:
            self.gap = self.PROBE if best != self.best else min(2 * self.gap, self.MAX_GAP)
            self.next, self.trying = self.n + self.gap, False
        self.best = best
