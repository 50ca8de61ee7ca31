"""Data parallel over processes: MPI (mpi4py) for processes and CPU collectives, NCCL between GPUs.

    mpiexec -n 4 bytemodel train ...      srun -n 4 --mpi=pmi2 bytemodel train ...

Every rank runs the same loop on its own slice of each batch. The sampler draws the whole batch
as a pure function of (seed, step) and a rank keeps rows [lo, hi) of it, so the run is defined by
--batch-size (the global batch) and not by the number of ranks: a run can be resumed on another
rank count and continues the same run, to float32 rounding. Within a rank the slice may be split
again over CPU threads (parallel.CoreParallel).

After the backward pass the flat gradient buffer is summed over ranks in one call (MPI Allreduce
on NumPy arrays, NCCL allReduce on CuPy arrays, on the compute stream: the host does not wait).
Each rank scales its gradients by its share of the batch first, so the sum is the gradient of the
global mean loss. Then every rank takes the same AdamW step and the weights stay identical.

ZeRO-1 (shard_optimizer): the gradients are reduce-scattered instead, each rank keeps the AdamW
moments of its 1/N of the flat buffer, updates that part of the weights and all-gathers them.
Checkpoints still hold the full moments (gathered to rank 0), so the file format does not change
and a sharded run resumes unsharded, or on another rank count, and the other way round.

Rank 0 writes the checkpoint, the metrics and the progress bar; every rank reads the corpus and,
on resume, the checkpoint from the shared run directory (a cluster's shared file system).

Failures end the job instead of hanging it: an error on any rank prints one line and calls
MPI_Abort, which the launcher turns into the end of every rank. A watchdog thread also times the
collectives (MPI calls while they block, NCCL work until its event completes): one that gets no
answer within BYTEMODEL_COLLECTIVE_TIMEOUT seconds (default 300) means a rank died or hangs, and
the job is aborted with an error naming the collective.

Shapes: flat buffers (P,) in the model's layout (model.layout), padded to (N * S,) with S the
shard length when sharding.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
import traceback
import types

import numpy as np

from ..config import DISTRIBUTED_MODES as MODES
from ..errors import BytemodelError, ConfigError

TIMEOUT_ENV = "BYTEMODEL_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT = 300.0   # seconds; a checkpoint write on rank 0 (others wait) must fit in it
SHARD_ALIGN = 64          # shard lengths are multiples of this (the fused AdamW kernel wants % 4)

# environment variables a launcher sets to the number of ranks (MPICH/Intel MPI, Open MPI, Slurm)
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


class PeerFailed(BytemodelError):
    """Another rank failed first (it reports the error); this rank only stops."""


def launched_size() -> int:
    """The rank count a launcher (mpiexec, srun) announced in the environment; 1 if none."""
    for var in _SIZE_VARS:
        try:
            n = int(os.environ.get(var, ""))
        except ValueError:
            continue
        if n >= 1:
            return n
    return 1


def collective_timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "")
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        t = float(raw)
    except ValueError:
        t = float("nan")
    if not (t > 0 and math.isfinite(t)):
        raise ConfigError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return t


def _on_device(a) -> bool:
    return type(a).__module__.startswith("cupy")


# ---------------------------------------------------------------------------------------- worlds
class Single:
    """One process: every collective is the identity."""
    rank, size, local_rank, local_size = 0, 1, 0, 1
    main = True
    nccl = None

    def use_device(self, device: str) -> None:
        pass

    def allreduce(self, a, what: str = "all-reduce"):
        """Sum `a` over ranks, in place."""
        return a

    def reduce_scatter(self, full, shard, what: str = "reduce-scatter"):
        """shard[...] = (sum over ranks of full)[rank's block]."""
        shard[...] = full[:shard.shape[0]]

    def allgather(self, full, what: str = "all-gather"):
        """full (N*S,): every rank's block [r*S, (r+1)*S) copied to all ranks, in place."""

    def gather_host(self, a: np.ndarray):
        """Host arrays, one per rank, concatenated on rank 0 (None elsewhere)."""
        return a

    def any(self, flag: bool) -> bool:
        return bool(flag)

    def bcast(self, obj, timed: bool = True):
        return obj

    def fail(self, exc: BaseException) -> None:
        """Called with an exception leaving the training loop: one process just raises it."""

    def close(self) -> None:
        pass


class _Watchdog:
    """A daemon thread that ends the job when a collective waits longer than `timeout` seconds."""

    def __init__(self, timeout: float, on_timeout):
        self.timeout, self.on_timeout = timeout, on_timeout
        self.lock = threading.Lock()
        self.items: dict[int, tuple] = {}   # key -> (what, started, done() or None)
        self.next = 0
        self.device = None                  # CUDA device id, for querying events from the thread
        threading.Thread(target=self._run, name="bytemodel-collective-watchdog", daemon=True).start()

    def add(self, what: str, done=None) -> int:
        with self.lock:
            self.next += 1
            self.items[self.next] = (what, time.monotonic(), done)
            return self.next

    def remove(self, key: int) -> None:
        with self.lock:
            self.items.pop(key, None)

    def _run(self):
        tick = min(1.0, self.timeout / 20)
        device_set = False
        while True:
            time.sleep(tick)
            if self.device is not None and not device_set:
                import cupy
                cupy.cuda.Device(self.device).use()
                device_set = True
            now = time.monotonic()
            with self.lock:
                items = list(self.items.items())
            for key, (what, t0, done) in items:
                if done is not None and done():
                    self.remove(key)
                elif now - t0 > self.timeout:
                    self.on_timeout(what, now - t0)
                    return


class MPIWorld:
    """Ranks of an MPI job; NCCL between their GPUs once use_device('cuda') was called."""

    def __init__(self, MPI, timeout: float):
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.main = self.rank == 0
        self.local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)   # ranks of this machine
        self.local_rank, self.local_size = self.local.Get_rank(), self.local.Get_size()
        self.nccl = None
        self.timeout = timeout
        self.watchdog = _Watchdog(timeout, self._timed_out)

    # ---------------------------------------------------------------- setup
    def use_device(self, device: str) -> None:
        """On 'cuda': pick this rank's GPU (local rank modulo the GPUs it sees) and open NCCL."""
        if device != "cuda" or self.nccl is not None:
            return
        import cupy
        from cupy.cuda import nccl
        count = cupy.cuda.runtime.getDeviceCount()
        dev = self.local_rank % count
        cupy.cuda.Device(dev).use()
        # NCCL refuses two ranks on one GPU: say so plainly (with srun --gpus-per-task each rank
        # sees one GPU as device 0, so compare the physical GPUs, not the device numbers)
        mine = cupy.cuda.runtime.deviceGetPCIBusId(dev)
        bus = self._blocking("the GPU check", lambda: self.local.allgather(mine))
        if len(set(bus)) < len(bus):
            raise ConfigError(f"{self.local_size} ranks on this machine share {len(set(bus))} GPU(s); "
                              f"start one rank per GPU")
        self.watchdog.device = dev
        uid = nccl.get_unique_id() if self.main else None
        uid = self._blocking("the NCCL id broadcast", lambda: self.comm.bcast(uid, root=0))
        self.nccl = nccl.NcclCommunicator(self.size, uid, self.rank)
        self._nccl_mod = nccl

    # ---------------------------------------------------------------- failure handling
    def _timed_out(self, what: str, waited: float) -> None:
        sys.stderr.write(f"error: rank {self.rank}: {what} got no answer from the other ranks for "
                         f"{waited:.0f} s (a rank died or hangs; limit {TIMEOUT_ENV}={self.timeout:g}); "
                         f"ending the job\n")
        sys.stderr.flush()
        self._abort(3)

    def _abort(self, code: int) -> None:
        # the launcher forwards our stderr through its own pipes; MPI_Abort tears them down, so
        # give it a moment to pass the error line on first (seen lost on a loaded machine)
        time.sleep(1.0)
        if self.nccl is not None:
            try:
                self.nccl.abort()
            except Exception:
                pass
        try:
            self.comm.Abort(code)
        finally:
            os._exit(code)

    def fail(self, exc: BaseException) -> None:
        """An exception is leaving the training loop on this rank: report it once and end the
        whole job (the other ranks would otherwise wait in their next collective)."""
        if not self.main:
            # often every rank fails alike (the same bad setting, a divergence): give rank 0 the
            # time to report it and end the job, so that one line is printed, not one per rank
            time.sleep(2.0 if not isinstance(exc, PeerFailed) else min(30.0, self.timeout))
        if isinstance(exc, PeerFailed):
            code = 2                                     # the failing rank reported it
        elif isinstance(exc, BytemodelError):
            sys.stderr.write(f"error: {exc}\n" if self.main else f"error: rank {self.rank}: {exc}\n")
            code = 2
        elif isinstance(exc, KeyboardInterrupt):
            sys.stderr.write("interrupted\n" if self.main else "")
            code = 130
        else:
            sys.stderr.write(f"rank {self.rank} failed:\n" + "".join(traceback.format_exception(exc)))
            code = 1
        sys.stderr.flush()
        self._abort(code)

    # ---------------------------------------------------------------- collectives
    def _blocking(self, what: str, fn):
        key = self.watchdog.add(what)
        try:
            return fn()
        finally:
            self.watchdog.remove(key)

    def _queued(self, what: str) -> None:
        """NCCL work was queued on the stream: watch its completion without blocking the host."""
        import cupy
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record()
        self.watchdog.add(what, lambda: ev.done)

    def _nccl_args(self, a):
        import cupy
        nccl = self._nccl_mod
        if self.nccl is None:
            raise RuntimeError("a GPU array in a collective before use_device('cuda')")
        dtype = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64}[a.dtype]
        return dtype, cupy.cuda.get_current_stream().ptr

    def allreduce(self, a, what: str = "all-reduce"):
        """Sum `a` (contiguous) over ranks, in place."""
        if _on_device(a):
            dtype, stream = self._nccl_args(a)
            self.nccl.allReduce(a.data.ptr, a.data.ptr, a.size, dtype, self._nccl_mod.NCCL_SUM, stream)
            self._queued(what)
        else:
            self._blocking(what, lambda: self.comm.Allreduce(self.MPI.IN_PLACE, a, op=self.MPI.SUM))
        return a

    def reduce_scatter(self, full, shard, what: str = "reduce-scatter"):
        """shard[...] = (sum over ranks of full)[rank's block]; full is (size * len(shard),)."""
        assert full.shape[0] == self.size * shard.shape[0]
        if _on_device(full):
            dtype, stream = self._nccl_args(full)
            self.nccl.reduceScatter(full.data.ptr, shard.data.ptr, shard.size, dtype,
                                    self._nccl_mod.NCCL_SUM, stream)
            self._queued(what)
        else:
            self._blocking(what, lambda: self.comm.Reduce_scatter_block(full, shard, op=self.MPI.SUM))

    def allgather(self, full, what: str = "all-gather"):
        """full (size * S,): rank r's block [r*S, (r+1)*S) sent to every rank, in place."""
        if _on_device(full):
            dtype, stream = self._nccl_args(full)
            n = full.size // self.size
            send = full[self.rank * n:(self.rank + 1) * n]
            self.nccl.allGather(send.data.ptr, full.data.ptr, n, dtype, stream)
            self._queued(what)
        else:
            self._blocking(what, lambda: self.comm.Allgather(self.MPI.IN_PLACE, full))

    def gather_host(self, a: np.ndarray):
        """Host arrays of equal length, concatenated in rank order on rank 0 (None elsewhere)."""
        a = np.ascontiguousarray(a)
        out = np.empty(a.size * self.size, dtype=a.dtype) if self.main else None
        self._blocking("gathering the optimizer state", lambda: self.comm.Gather(a, out, root=0))
        return out

    def any(self, flag: bool) -> bool:
        """True on every rank if it is True on any (a stop request seen by one rank)."""
        return bool(self._blocking("the stop-flag exchange",
                                   lambda: self.comm.allreduce(bool(flag), op=self.MPI.LOR)))

    def bcast(self, obj, timed: bool = True):
        """Rank 0's object on every rank (small, picklable: settings and messages between ranks).
        timed=False: no time limit (the others wait while rank 0 builds the corpus)."""
        if not timed:
            return self.comm.bcast(obj, root=0)
        return self._blocking("a broadcast from rank 0", lambda: self.comm.bcast(obj, root=0))

    def close(self) -> None:
        if self.nccl is not None:
            import cupy
            cupy.cuda.get_current_stream().synchronize()
            self.nccl.destroy()
            self.nccl = None


_mpi_world = None


def connect(mode: str = "auto"):
    """The world this process belongs to.

    auto: MPI when a launcher (mpiexec, srun) started more than one rank, else one process;
    mpi: MPI always (one rank without a launcher too: the NCCL path with one GPU); off: one process.
    """
    global _mpi_world
    if mode not in MODES:
        raise ConfigError(f"unknown distributed mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "off" or (mode == "auto" and launched_size() == 1):
        return Single()
    if _mpi_world is None:
        try:
            from mpi4py import MPI
        except ImportError:
            raise ConfigError(f"started as one of {launched_size()} MPI ranks, but mpi4py is not installed "
                              f"(pip install 'bytemodel[mpi]')") from None
        _mpi_world = MPIWorld(MPI, collective_timeout())
    return _mpi_world


def rows(batch: int, rank: int, size: int) -> slice:
    """Rank's rows of a batch: contiguous, sizes differ by at most one (as np.array_split)."""
    base, extra = divmod(batch, size)
    lo = rank * base + min(rank, extra)
    return slice(lo, lo + base + (1 if rank < extra else 0))


def on_rank0_first(world, first, then):
    """Run first() on rank 0 and then(rank 0's result) on the others, after it; an error on rank 0
    is raised there and ends the others quietly (rank 0 reports it). Not timed: first() may take
    long (building the corpus); if rank 0 dies meanwhile, the launcher ends the job."""
    if world.size == 1:
        return first()
    if world.main:
        try:
            out = first()
        except BaseException:
            world.bcast(("error", None), timed=False)
            raise
        world.bcast(("ok", out), timed=False)
        return out
    status, out = world.bcast(None, timed=False)
    if status != "ok":
        raise PeerFailed("rank 0 failed")
    return then(out)


# ---------------------------------------------------------------------------------------- runner
class DataParallel:
    """The training runner over ranks: this rank's slice of the batch (further split over CPU
    threads by CoreParallel), gradients summed over ranks, and the optimizer (sharded or not).

    The loop calls loss_and_grad on its rows (`rows`), then grad_norm_device, the
    optimizer's step, mean_loss for the metric, host_moments to save.
    """

    def __init__(self, model, world, batch: int, workers: int | None = None, shard: bool = False):
        from .runner import CoreParallel
        if batch < world.size:
            raise ConfigError(f"batch-size {batch} is smaller than the {world.size} ranks; "
                              f"give each rank at least one window")
        self.model, self.world, self.batch = model, world, batch
        self.ops, self.xp = model.ops, model.xp
        self.rows = rows(batch, world.rank, world.size)
        # an MPI world of one rank still takes the MPI/NCCL paths (how they are checked on one GPU)
        self.single = isinstance(world, Single)
        self.shard = shard and not self.single
        self._blas = None
        if world.local_size > 1 and model.ops.cpu_threads:
            workers, self._blas = self._share_cores(workers)
        if self.shard:
            self._pad_buffers()
        self.inner = CoreParallel(model, workers)   # after _pad_buffers: replicas share the weights

    def _share_cores(self, workers):
        """Ranks on one machine split its cores: threads and BLAS threads per rank."""
        from .runner import MAX_DEFAULT_WORKERS, cores
        per_rank = cores()
        if per_rank >= (os.cpu_count() or 1):          # not pinned by the launcher
            per_rank = max(1, per_rank // self.world.local_size)
        from threadpoolctl import threadpool_limits        # a core dependency
        limiter = threadpool_limits(limits=per_rank, user_api="blas")
        return workers or min(per_rank, MAX_DEFAULT_WORKERS), limiter

    def _pad_buffers(self):
        """Weights and gradients into buffers of size * S elements (the tail stays zero), so every
        rank owns an equal block [lo, hi) for reduce-scatter and all-gather."""
        from ..model import views
        m, xp, n = self.model, self.xp, self.world.size
        P = m.size
        self.S = -(-P // (n * SHARD_ALIGN)) * SHARD_ALIGN
        self.lo, self.hi = self.world.rank * self.S, (self.world.rank + 1) * self.S
        self.ppad = xp.zeros(n * self.S, dtype=m.params.dtype)
        self.ppad[:P] = m.params
        self.gpad = xp.zeros(n * self.S, dtype=m.grads.dtype)
        m.params, m.grads = self.ppad[:P], self.gpad[:P]
        m.p, m.g = views(m.params, m.cfg), views(m.grads, m.cfg)
        self.gshard = xp.zeros(self.S, dtype=m.grads.dtype)

    # ---------------------------------------------------------------- passes
    def loss_and_grad(self, idx, targets, weight: float = 1.0, mask=None, counted: int | None = None,
                      drop=None):
        """idx, targets: this rank's rows of the batch. Per-token losses of those rows; the grads
        (or, sharded, this rank's block of them) become the sum over ranks.

        mask: this rank's rows of a loss mask (host array), counted: the number of counted targets
        in the whole batch; the mean is then over those, each rank weighted by its share.
        drop: the step's Dropout over the whole batch (this rank's rows draw their part of it)."""
        n, T = idx.shape
        drop = None if drop is None else drop.rows(self.rows.start)
        if mask is None:
            self._tokens, self._masked = self.batch * T, False   # the whole batch, for mean_loss
            losses = self.inner.loss_and_grad(idx, targets, weight * n / self.batch, drop=drop)
        else:
            self._tokens, self._masked = counted, True
            share = int(np.count_nonzero(mask)) / counted
            losses = self.inner.loss_and_grad(idx, targets, weight * share, mask, drop=drop)
        if self.shard:
            self.world.reduce_scatter(self.gpad, self.gshard, "the gradient reduce-scatter")
        else:
            self.world.allreduce(self.model.grads, "the gradient all-reduce")
        return losses

    def mean_loss(self, losses):
        """Mean per-token loss over the whole batch (all ranks; over counted targets when the
        last loss_and_grad had a mask), as a 0-d array."""
        if self.single:
            return losses.sum() / self._tokens if self._masked else losses.mean()
        tot = losses.astype(np.float64).sum().reshape(1)
        self.world.allreduce(tot, "the loss all-reduce")
        return (tot / self._tokens).reshape(())

    def forward(self, idx, targets):
        """Per-token losses (B*T,) of a full batch without activations; rows split over ranks."""
        if self.single:
            return self.inner.forward(idx, targets)
        B, T = idx.shape
        r = rows(B, self.world.rank, self.world.size)
        out = self.xp.zeros(B * T, dtype=np.float32)
        if r.stop > r.start:
            out[r.start * T:r.stop * T] = self.inner.forward(idx[r], targets[r])
        return self.world.allreduce(out, "the validation all-reduce")

    # ---------------------------------------------------------------- gradient norm
    def _local_grads(self):
        return self.gshard if self.shard else self.model.grads

    def grad_norm_device(self):
        """Global gradient norm as a 0-d array (ops.global_norm; no host wait)."""
        norm = self.ops.global_norm(self._local_grads())
        if not self.shard:
            return norm
        sq = (norm * norm).reshape(1)
        self.world.allreduce(sq, "the gradient-norm all-reduce")
        return self.xp.sqrt(sq).reshape(())

    # ---------------------------------------------------------------- optimizer
    def optimizer(self, **kw):
        from .optim import AdamW
        if not self.shard:
            return AdamW(self.model, **kw)
        return ShardedAdamW(self, **kw)

    def host_moments(self, opt):
        """(m, v) as full host arrays in the model's layout on rank 0; (None, None) elsewhere.
        Collective when sharded (every rank must call it)."""
        P = self.model.size
        if not self.shard:
            if not self.world.main:
                return None, None
            return self.ops.to_numpy(opt.m), self.ops.to_numpy(opt.v)
        m = self.world.gather_host(self.ops.to_numpy(opt.m))
        v = self.world.gather_host(self.ops.to_numpy(opt.v))
        return (m[:P], v[:P]) if self.world.main else (None, None)

    def close(self):
        self.inner.close()
        if self._blas is not None:
            self._blas.restore_original_limits()


class ShardedAdamW:
    """AdamW over this rank's block of the flat buffers (ZeRO-1): the same update as AdamW on
    those elements, then the blocks all-gathered so every rank has the whole new weights.
    state(), load_state(d, m, v) and step() as AdamW; m and v are this rank's block only."""

    def __init__(self, dp: DataParallel, **kw):
        from .optim import AdamW
        self.dp = dp
        model = dp.model
        mask = dp.xp.zeros(dp.world.size * dp.S, dtype=model.params.dtype)
        mask[:model.size] = model.decay_mask().astype(model.params.dtype)
        part = types.SimpleNamespace(params=dp.ppad[dp.lo:dp.hi], grads=dp.gshard, ops=model.ops,
                                     xp=model.xp, decay_mask=lambda: mask[dp.lo:dp.hi])
        self.inner = AdamW(part, **kw)

    @property
    def m(self):
        return self.inner.m

    @property
    def v(self):
        return self.inner.v

    @property
    def t(self):
        return self.inner.t

    def step(self, lr: float, grad_scale: float = 1.0, clip: float = 0.0, norm=None) -> None:
        self.inner.step(lr, grad_scale=grad_scale, clip=clip, norm=norm)
        self.dp.world.allgather(self.dp.ppad, "the weight all-gather")

    def state(self) -> dict:
        return self.inner.state()

    def load_state(self, d: dict, m, v) -> None:
        """m, v: the full moments (as a checkpoint holds them); this rank keeps its block."""
        dp = self.dp

        def block(a):
            full = np.zeros(dp.world.size * dp.S, dtype=np.float32)
            full[:a.shape[0]] = a
            return full[dp.lo:dp.hi]
        self.inner.load_state(d, block(m), block(v))
