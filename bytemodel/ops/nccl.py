"""The GPU side of the collectives between MPI ranks: picking a rank's GPU and NCCL over CuPy arrays.

training/distributed.py (the MPI world) calls these when an array lives on a GPU; it never imports
CuPy itself. NCCL calls are queued on the current stream (the host does not wait); `queued()`
gives a done() test for the watchdog. Arrays are contiguous float32 or float64.
"""
from __future__ import annotations

import numpy as np


def on_device(a) -> bool:
    """True for a CuPy array (without importing CuPy)."""
    return type(a).__module__.startswith("cupy")


def pick_gpu(local_rank: int) -> tuple[int, str]:
    """Use GPU local_rank modulo the GPUs this process sees; -> (device id, its PCI bus id, which
    tells physical GPUs apart where each rank sees its own as device 0)."""
    import cupy
    dev = local_rank % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(dev).use()
    return dev, cupy.cuda.runtime.deviceGetPCIBusId(dev)


def use_gpu(dev: int) -> None:
    """Make `dev` current in the calling thread (the watchdog's, to query events)."""
    import cupy
    cupy.cuda.Device(dev).use()


def unique_id():
    from cupy.cuda import nccl
    return nccl.get_unique_id()


class Communicator:
    """NCCL between `size` ranks; this one is `rank`."""

    def __init__(self, size: int, uid, rank: int):
        from cupy.cuda import nccl
        self.nccl, self.size, self.rank = nccl, size, rank
        self.comm = nccl.NcclCommunicator(size, uid, rank)

    def _args(self, a):
        import cupy
        dtype = {np.dtype(np.float32): self.nccl.NCCL_FLOAT32, np.dtype(np.float64): self.nccl.NCCL_FLOAT64}[a.dtype]
        return dtype, cupy.cuda.get_current_stream().ptr

    def allreduce(self, a) -> None:
        """Sum `a` over ranks, in place."""
        dtype, stream = self._args(a)
        self.comm.allReduce(a.data.ptr, a.data.ptr, a.size, dtype, self.nccl.NCCL_SUM, stream)

    def reduce_scatter(self, full, shard) -> None:
        """shard = (sum over ranks of full)[this rank's block]."""
        dtype, stream = self._args(full)
        self.comm.reduceScatter(full.data.ptr, shard.data.ptr, shard.size, dtype, self.nccl.NCCL_SUM, stream)

    def allgather(self, full) -> None:
        """full (size * S,): this rank's block [rank*S, (rank+1)*S) sent to every rank, in place."""
        dtype, stream = self._args(full)
        n = full.size // self.size
        send = full[self.rank * n:(self.rank + 1) * n]
        self.comm.allGather(send.data.ptr, full.data.ptr, n, dtype, stream)

    def abort(self) -> None:
        self.comm.abort()

    def close(self) -> None:
        """Wait for the queued work, then free the communicator."""
        import cupy
        cupy.cuda.get_current_stream().synchronize()
        self.comm.destroy()


def queued():
    """An event recorded after the work queued so far; -> done(): has that work completed."""
    import cupy
    ev = cupy.cuda.Event(disable_timing=True)
    ev.record()
    return lambda: ev.done
