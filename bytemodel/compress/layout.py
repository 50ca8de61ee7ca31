"""The stream layout: how a file's tokens are cut into streams that advance together, in lanes, with
which window, and the device defaults of each choice in one table (the figures behind them:
benchmarks/README.md, the compressor's sections)."""
from __future__ import annotations

import numpy as np

MIN_STREAM = 4               # default layout: at least this many windows of tokens per stream
CPU_MAX_LANE = 256           # streams per lane on the CPU (benchmarks/README.md: wider lanes spread each NumPy call)
CPU_MAX_STREAMS = 512
CPU_WINDOW = 32              # the CPU engine's default window (sliding): the attention reads the cache, so cost grows with it
FRESH_WINDOW = 16            # --adapt from a fresh model on the CPU: its window, in one lane (the mixer's thread takes
                             # the other core): a fresh network learns little long context, and the step costs
                             # 23% less than at 32 (benchmarks/README.md, "Fewer streams per update")
ENGINES = ("cpu", "lockstep")  # what computes the probabilities: cpu_engine.CpuLockstep or lockstep.Lockstep
GPU_MAX_STREAMS = 8192
LOCKSTEP_REREAD = 0          # the lockstep engine's default off the CPU: slide the window (no re-read passes)
GPU_WINDOW = 256             # default window on a GPU: half the cost per token of the full 1024 of base, 2.6%
                             # larger (benchmarks/README.md, the compressor on the H200)
GPU_CODERS = 8               # range coders on threads on the GPU's host (the coder is the serial part)


def split(n: int, streams: int) -> np.ndarray:
    """Token counts of `streams` contiguous streams covering n tokens: the first n % streams get one more."""
    if streams == 0:
        return np.zeros(0, dtype=np.int64)
    lengths = np.full(streams, n // streams, dtype=np.int64)
    lengths[: n % streams] += 1
    return lengths


def default_window(context: int, device: str) -> int:
    """The lockstep engine's window unless told: the model's context on the CPU, at most GPU_WINDOW on a GPU
    (the cpu engine's is CPU_WINDOW)."""
    return context if device == "cpu" else min(context, GPU_WINDOW)


def default_streams(n_tokens: int, window: int, device: str) -> int:
    """Enough streams to fill the batch, each at least MIN_STREAM windows long."""
    cap = CPU_MAX_STREAMS if device == "cpu" else GPU_MAX_STREAMS
    return int(min(cap, max(1, n_tokens // (MIN_STREAM * window)))) if n_tokens else 0


ADAPT_STREAM = 512           # --adapt: tokens per stream at least
ADAPT_MAX_STREAMS = 64       # --adapt: at most this many streams: fewer, longer streams take more updates per
                             # byte (an update is one step over all of them); 64 keeps a step's batch wide
                             # enough for the CPU (benchmarks/README.md, adapting while coding)


GPU_ADAPT_STREAM = 2048      # --adapt on a GPU: tokens per stream at least ...
GPU_ADAPT_MAX_STREAMS = 1024 # ... and at most this many streams: a GPU's step costs about the same at 64 rows as
                             # at 1,024, so wide steps are its speed (H200, small, 4 MB of English with ctx3d:
                             # 1,024 streams 2.07 bits/byte at 39 KB/s; with ctx3f 292 KB/s: benchmarks/README.md,
                             # "ctx3d", "ctx3f")


def adapt_streams(n_tokens: int, device: str = "cpu") -> int:
    """Streams under --adapt: long streams, so the model takes many steps through the file (on a
    GPU fewer, shorter ones: many streams a step are its speed)."""
    if not n_tokens:
        return 0
    if device != "cpu":
        return int(min(GPU_ADAPT_MAX_STREAMS, max(1, n_tokens // GPU_ADAPT_STREAM)))
    return int(min(ADAPT_MAX_STREAMS, max(1, n_tokens // ADAPT_STREAM)))


def default_lane(streams: int, device: str, cores: int = 1) -> int:
    """Streams per lane. On the CPU at least one lane per core, of at most CPU_MAX_LANE streams;
    on a device one lane holds them all. The lane goes into the header, so a machine with another
    core count decompresses the same way (its lanes just run in turn)."""
    if device != "cpu":
        return max(streams, 1)
    return max(1, min(CPU_MAX_LANE, -(-streams // max(cores, 1))))


def starts(lengths: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(lengths) else lengths


def groups(S: int, C: int) -> list[tuple[int, int]]:
    """C contiguous groups of streams, the first S % C one stream larger: (first, end) each."""
    sizes = split(S, C)
    ends = np.cumsum(sizes)
    return [(int(e - z), int(e)) for e, z in zip(ends, sizes)]
