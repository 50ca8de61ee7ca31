"""The training runner: rows of each batch over MPI ranks, and a rank's rows over CPU threads.

One runner for both levels. Over ranks (training/distributed.py): the sampler draws the whole batch
as a pure function of (seed, step) and a rank keeps rows [lo, hi) of it (`rows`), so the run is
defined by --batch-size (the global batch) and not by the number of ranks: a run can be resumed
on another rank count and continues the same run, to float32 rounding. After the backward pass
the flat gradient buffer is summed over ranks in one call (or reduce-scattered, with the sharded
optimizer of training/zero.py), and every rank takes the same AdamW step.

Over threads (CoreParallel): NumPy releases the GIL inside its loops and BLAS calls, so Python
threads run the ops of different batch slices at the same time. Every worker has a replica of the
model that shares the weights and keeps its own gradient buffer and activations; after the step
the replicas' gradients are added into the main buffer in a fixed order (so results are
deterministic run to run). BLAS is held to cores // workers threads per worker meanwhile (one on
a 2-core machine): several multithreaded BLAS calls at once oversubscribe the cores, which on
small matrices is many times slower. By default there is one worker per core, at most 8 (each
holds a gradient buffer). Used where the backend says its ops run on CPU threads
(ops.cpu_threads); a GPU backend runs the whole batch at once.

Validation goes through the scorer of `score` (ops/scorer.Scorer, Runner.nll): whole windows per
call, its own CPU threads, rows split over ranks.

The runner never normalises the loss: the per-token weights the loop builds (loop.loss_weights)
say what each target counts for, so rows split anywhere add up to the whole batch's gradient.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import ThreadpoolController

from ..errors import ConfigError, held
from ..ops.scorer import Scorer
from .distributed import Single, rows


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
    """loss_and_grad over `workers` slices of the batch. workers=1 is the model itself."""

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
        # held: a `kill` waits for the slices, so no worker is left in BLAS or half started
        with held():
            if self._limiter is None:
                return fn()
            with self._limiter.limit(limits=self._blas_threads, user_api="blas"):
                return fn()

    def loss_and_grad(self, idx, targets, weights, drop=None):
        """Per-token losses (B*T,); grads += d(sum_i weights_i * loss_i)/d(params), as
        Model.loss_and_grad (weights: a number or a (B, T) host array). Each worker takes its rows
        of the batch and of the weights (and of the step's dropout masks, drop); the replicas'
        gradients are added in a fixed order."""
        if self.pool is None or idx.shape[0] == 1:
            return self.model.loss_and_grad(idx, targets, weights, drop)
        parts = self._slices(idx.shape[0])
        scalar = np.isscalar(weights)

        def work():
            futs = [self.pool.submit(r.loss_and_grad, idx[s], targets[s], weights if scalar else weights[s],
                                     None if drop is None else drop.rows(s[0]))
                    for r, s in zip(self.replicas, parts)]
            return [f.result() for f in futs]
        losses = self._run(work)
        for r in self.replicas[1:len(parts)]:
            self.model.grads += r.grads
            r.grads[...] = 0
        return np.concatenate(losses)

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()


class Runner:
    """The training runner over ranks and threads: this rank's rows of each batch (split again
    over CPU threads by CoreParallel), gradients summed over both, and the optimizer (sharded
    or not).

    The loop calls loss_and_grad(x, y, weights) with the whole batch, then grad_norm_device, the
    optimizer's step, mean_loss for the metric, host_moments to save.
    """

    def __init__(self, model, world=None, batch: int = 1, workers: int | None = None, shard: bool = False):
        world = world or Single()
        if batch < world.size:
            raise ConfigError(f"batch-size {batch} is smaller than the {world.size} ranks; "
                              f"give each rank at least one window")
        self.model, self.world, self.batch = model, world, batch
        self.ops, self.xp = model.ops, model.xp
        self.rows = rows(batch, world.rank, world.size)
        # an MPI world of one rank still takes the MPI/NCCL paths (how they are checked on one GPU)
        self.single = isinstance(world, Single)
        self._blas = None
        if world.local_size > 1 and model.ops.cpu_threads:
            workers, self._blas = self._share_cores(workers)
        self.shards = None
        if shard and not self.single:
            from .zero import Shards
            self.shards = Shards(model, world)
        self.inner = CoreParallel(model, workers)   # after the shards: replicas share the weights
        self._scorer = None                          # validation's (nll), made at the first call

    def _share_cores(self, workers):
        """Ranks on one machine split its cores: threads and BLAS threads per rank."""
        per_rank = cores()
        if per_rank >= (os.cpu_count() or 1):          # not pinned by the launcher
            per_rank = max(1, per_rank // self.world.local_size)
        from threadpoolctl import threadpool_limits        # a core dependency
        limiter = threadpool_limits(limits=per_rank, user_api="blas")
        return workers or min(per_rank, MAX_DEFAULT_WORKERS), limiter

    # ---------------------------------------------------------------- passes
    def loss_and_grad(self, x, y, weights, drop=None):
        """x, y (B, T) host arrays: the whole batch; weights: a number or (B, T) host array (the
        loop's per-token weights); drop: the step's Dropout over the whole batch. Runs this rank's
        rows; returns their per-token losses; the grads (or, sharded, this rank's block of them)
        become the sum over ranks."""
        r = self.rows
        w = weights if np.isscalar(weights) else weights[r]
        drop = None if drop is None else drop.rows(r.start)
        losses = self.inner.loss_and_grad(self.ops.asarray(x[r]), self.ops.asarray(y[r]), w, drop)
        if self.shards is not None:
            self.shards.reduce_gradients()
        else:
            self.world.allreduce(self.model.grads, "the gradient all-reduce")
        return losses

    def mean_loss(self, losses, counted: int | None = None):
        """Mean per-token loss over the whole batch (all ranks) as a 0-d array; counted: the
        number of counted targets in the batch (None: every target counts)."""
        if self.single:
            return losses.mean() if counted is None else losses.sum() / counted
        T = losses.shape[0] // (self.rows.stop - self.rows.start)
        tot = losses.astype(np.float64).sum().reshape(1)
        self.world.allreduce(tot, "the loss all-reduce")
        return (tot / (self.batch * T if counted is None else counted)).reshape(())

    @property
    def scorer(self) -> Scorer:
        """Validation's window scorer (made at the first use): the batched path of `score`."""
        if self._scorer is None:
            self._scorer = Scorer(self.model, workers=self.inner.workers)
        return self._scorer

    @property
    def score_batch(self) -> int:
        """Windows a validation call gives nll: the scorer's batch on each rank (64k tokens on a GPU)."""
        return self.scorer.batch * (1 if self.single else self.world.size)

    def nll(self, x, y, m=None):
        """Validation windows x, y (B, L) host ints, m (B, L) 0/1 or None -> (B,) float64 summed
        nats on the host (ops/scorer.Scorer.nll: a forward without activations, the log-softmax where
        it ran, only the sums back); rows split over ranks, each rank's sums added in place of
        zeros (exact). The corpus's window scorer (corpus.score)."""
        if self.single:
            return self.scorer.nll(x, y, m)
        r = rows(x.shape[0], self.world.rank, self.world.size)
        out = np.zeros(x.shape[0], np.float64)
        if r.stop > r.start:
            out[r] = self.scorer.nll(x[r], y[r], None if m is None else m[r])
        return self.world.allreduce(out, "the validation all-reduce")

    # ---------------------------------------------------------------- gradient norm
    def grad_norm_device(self):
        """Global gradient norm as a 0-d array (ops.global_norm; no host wait)."""
        if self.shards is None:
            return self.ops.global_norm(self.model.grads)
        norm = self.ops.global_norm(self.shards.gshard)
        sq = (norm * norm).reshape(1)
        self.world.allreduce(sq, "the gradient-norm all-reduce")
        return self.xp.sqrt(sq).reshape(())

    # ---------------------------------------------------------------- optimizer
    def optimizer(self, **kw):
        if self.shards is None:
            from .optim import AdamW
            return AdamW(self.model, **kw)
        from .zero import ShardedAdamW
        return ShardedAdamW(self.model, self.shards, **kw)

    def host_moments(self, opt):
        """(m, v) as full host arrays in the model's layout on rank 0; (None, None) elsewhere.
        Collective when sharded (every rank must call it)."""
        if self.shards is not None:
            return self.shards.host_moments(opt)
        if not self.world.main:
            return None, None
        return self.ops.to_numpy(opt.m), self.ops.to_numpy(opt.v)

    def close(self):
        self.inner.close()
        if self._blas is not None:
            self._blas.restore_original_limits()
