"""The MPI world: ranks, their collectives, and ending the job when one fails.

    mpiexec -n 4 bytemodel train ...      srun -n 4 --mpi=pmi2 bytemodel train ...

Every rank runs the same loop on its own slice of each batch (training/runner.py, the runner over
ranks and threads; training/zero.py, the sharded optimizer). The collectives sum host arrays with
MPI (mpi4py) and GPU arrays with NCCL (ops/nccl.py, queued on the compute stream: the host does
not wait); the world holds no array of its own.

Rank 0 writes the checkpoint, the metrics and the progress bar; every rank reads the corpus and,
on resume, the checkpoint from the shared run directory (a cluster's shared file system).

Failures end the job instead of hanging it: an error on any rank prints one line and calls
MPI_Abort, which the launcher turns into the end of every rank. A watchdog thread also times the
collectives (MPI calls while they block, NCCL work until its event completes): one that gets no
answer within BYTEMODEL_COLLECTIVE_TIMEOUT seconds (default 300) means a rank died or hangs, and
the job is aborted with an error naming the collective.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
import traceback

import numpy as np

from ..config import DISTRIBUTED_MODES as MODES
from ..errors import BytemodelError, ConfigError

TIMEOUT_ENV = "BYTEMODEL_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT = 300.0   # seconds; a checkpoint write on rank 0 (others wait) must fit in it

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
        self.device = None                  # GPU id, for querying events from the thread
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
                from ..ops import nccl
                nccl.use_gpu(self.device)
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
        from ..ops import nccl
        dev, mine = nccl.pick_gpu(self.local_rank)
        # NCCL refuses two ranks on one GPU: say so plainly (with srun --gpus-per-task each rank
        # sees one GPU as device 0, so compare the physical GPUs, not the device numbers)
        bus = self._blocking("the GPU check", lambda: self.local.allgather(mine))
        if len(set(bus)) < len(bus):
            raise ConfigError(f"{self.local_size} ranks on this machine share {len(set(bus))} GPU(s); "
                              f"start one rank per GPU")
        self.watchdog.device = dev
        uid = nccl.unique_id() if self.main else None
        uid = self._blocking("the NCCL id broadcast", lambda: self.comm.bcast(uid, root=0))
        self.nccl = nccl.Communicator(self.size, uid, self.rank)

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
        from ..ops import nccl
        self.watchdog.add(what, nccl.queued())

    def _gpu(self, a):
        """The NCCL communicator if `a` lives on a GPU, else None (MPI sums host arrays)."""
        from ..ops.nccl import on_device
        if not on_device(a):
            return None
        if self.nccl is None:
            raise RuntimeError("a GPU array in a collective before use_device('cuda')")
        return self.nccl

    def _collective(self, what: str, a, on_gpu, on_host) -> None:
        """on_gpu(communicator) when `a` lives on a GPU (queued; the watchdog waits for it), else
        on_host() (MPI, blocking, timed)."""
        gpu = self._gpu(a)
        if gpu is not None:
            on_gpu(gpu)
            self._queued(what)
        else:
            self._blocking(what, on_host)

    def allreduce(self, a, what: str = "all-reduce"):
        """Sum `a` (contiguous) over ranks, in place."""
        self._collective(what, a, lambda g: g.allreduce(a),
                         lambda: self.comm.Allreduce(self.MPI.IN_PLACE, a, op=self.MPI.SUM))
        return a

    def reduce_scatter(self, full, shard, what: str = "reduce-scatter"):
        """shard[...] = (sum over ranks of full)[rank's block]; full is (size * len(shard),)."""
        assert full.shape[0] == self.size * shard.shape[0]
        self._collective(what, full, lambda g: g.reduce_scatter(full, shard),
                         lambda: self.comm.Reduce_scatter_block(full, shard, op=self.MPI.SUM))

    def allgather(self, full, what: str = "all-gather"):
        """full (size * S,): rank r's block [r*S, (r+1)*S) sent to every rank, in place."""
        self._collective(what, full, lambda g: g.allgather(full),
                         lambda: self.comm.Allgather(self.MPI.IN_PLACE, full))

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
            self.nccl.close()
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
