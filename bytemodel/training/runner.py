"""Data parallel over CPU cores: each core runs the model on its slice of the batch.

NumPy releases the GIL inside its loops and BLAS calls, so Python threads run the ops of different
batch slices at the same time. Every worker has a replica of the model that shares the weights
and keeps its own gradient buffer and activations; after the step the replicas' gradients are
added into the main buffer in a fixed order (so results are deterministic run to run). BLAS is
held to cores // workers threads per worker meanwhile (one on a 2-core machine): several
multithreaded BLAS calls at once oversubscribe the cores, which on small matrices is many times
slower. By default there is one worker per core, at most 8 (each holds a gradient buffer).

Used where the backend says its ops run on CPU threads (ops.cpu_threads); a GPU backend runs
the whole batch at once.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import ThreadpoolController


MAX_DEFAULT_WORKERS = 8  # each worker holds a full gradient buffer: more cores go to BLAS threads
THREADS_PER_CORE = 4     # the most workers a core gets when asked (tests split batches 3 ways on 2 cores)


def cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def default_workers() -> int:
    return min(cores(), MAX_DEFAULT_WORKERS)


def available_memory() -> int | None:
    """Bytes of memory free now (None where the system does not say)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def bounded_workers(requested: int, replica_bytes: int) -> int:
    """Workers as asked, but at most THREADS_PER_CORE per core (threads beyond the cores only wait)
    and never more replicas than half the free memory holds (--workers 256 on the small preset
    asked for 7.6 GB)."""
    n = min(max(1, requested), THREADS_PER_CORE * cores())
    free = available_memory()
    if free is not None and replica_bytes > 0:
        n = min(n, max(1, free // 2 // replica_bytes))
    return n


class CoreParallel:
    """loss_and_grad / forward over `workers` slices of the batch. workers=1 is the model itself."""

    def __init__(self, model, workers: int | None = None):
        self.model = model
        # a replica holds a gradient buffer, activations and scratch: about 3 copies of the weights
        self.workers = bounded_workers(workers or default_workers(), 12 * int(model.params.size))
        if not model.ops.cpu_threads:    # a GPU backend runs the whole batch at once
            self.workers = 1
        self.replicas = [model] + [model.replica() for _ in range(self.workers - 1)]
        self.pool = ThreadPoolExecutor(self.workers) if self.workers > 1 else None
        self._blas_threads = max(1, cores() // self.workers)   # the cores left to each worker
        self._limiter = ThreadpoolController() if self.workers > 1 else None

    def _slices(self, B):
        n = min(self.workers, B)
        return [s for s in np.array_split(np.arange(B), n) if len(s)]

    def _run(self, fn):
        if self._limiter is None:
            return fn()
        with self._limiter.limit(limits=self._blas_threads, user_api="blas"):
            return fn()

    def loss_and_grad(self, idx, targets, weight: float = 1.0, mask=None, drop=None):
        """Per-token losses (B*T,); grads += weight * d(mean loss)/d(params), as Model.loss_and_grad.

        mask (B, T) host array or None: the mean is over counted targets; each slice is weighted
        by its share of them, so the slices' gradients add up to the whole batch's.
        drop: the step's Dropout; each slice draws its rows' part of the masks."""
        if self.pool is None or idx.shape[0] == 1:
            return self.model.loss_and_grad(idx, targets, weight, mask, drop)
        B = idx.shape[0]
        parts = self._slices(B)
        if mask is None:
            shares = [(len(s) / B, None) for s in parts]
        else:
            total = max(int(np.count_nonzero(mask)), 1)
            shares = [(int(np.count_nonzero(mask[s])) / total, mask[s]) for s in parts]

        def work():
            futs = [self.pool.submit(r.loss_and_grad, idx[s], targets[s], weight * share, m,
                                     None if drop is None else drop.rows(s[0]))
                    for r, s, (share, m) in zip(self.replicas, parts, shares)]
            return [f.result() for f in futs]
        losses = self._run(work)
        for r in self.replicas[1:len(parts)]:
            self.model.grads += r.grads
            r.grads[...] = 0
        return np.concatenate(losses)

    def forward(self, idx, targets):
        """Per-token losses (B*T,) without keeping activations."""
        if self.pool is None or idx.shape[0] == 1:
            out = self.model.forward(idx, targets)
            self.model._acts = None
            return out
        parts = self._slices(idx.shape[0])

        def one(r, s):
            out = r.forward(idx[s], targets[s])
            r._acts = None
            return out

        def work():
            futs = [self.pool.submit(one, r, s) for r, s in zip(self.replicas, parts)]
            return [f.result() for f in futs]
        return np.concatenate(self._run(work))

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()
