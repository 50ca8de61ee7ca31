"""Windows of tokens -> their summed negative log-likelihood: the one scoring path for `score`,
`eval`, the API (bytemodel.decode.score puts documents into windows) and validation while
training (training/runner.Runner.nll hands Scorer.nll to corpus.score / pairs.score_windows,
which put the held-out tokens into windows). In ops/, below both wings, so either imports it; like
ops/cuda_decode.py it drives the model it is given (forward_cached, weights) and imports no model.

    s = Scorer(model, vocab)          # vocab: the tokenizer's ids (model.cfg.vocab_size by default)
    s.nll(x, y, m)                    # x, y (B, L) int, m (B, L) 0/1 or None -> (B,) float64 nats

A window is a forward pass without a cache and without kept activations (Model.forward_cached
with no cache: the same block function as training), then ops/score_ops.window_nll on the
device it ran on: float32 log-softmax and target gather, float64 sums; only B numbers come back.

On the GPU a call runs its B windows as one batch (callers give `batch` windows a call). On the CPU
the windows are cut into fixed chunks of `chunk` windows, one forward each, run on `workers`
threads (NumPy and BLAS release the GIL) with BLAS held to one thread meanwhile, so a chunk's
arithmetic, and so every figure, is the same whatever the number of threads.

Shapes: B windows, L tokens a window (<= context), Vl the model's vocabulary.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import held, poll
from . import score_ops

GPU_TOKENS = 1 << 16       # tokens a GPU call scores at once (64 windows of 1024): the batch where
                           # the forward reaches its throughput, activations a few hundred MB at base
CPU_ROWS = 2048            # tokens a CPU chunk scores in one forward: products large enough for BLAS,
                           # activations a few MB at tiny
TAIL = True                # the last layer and the head only from the first scored position (False: the
                           # whole forward; benchmarks/score.py --whole-forward times both)


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # pragma: no cover
        return max(1, os.cpu_count() or 1)


def _scored_tail(m) -> int | None:
    """m (b, L) 0/1 host mask or None -> the positions from the first one any window scores to
    the end (None: all of them)."""
    if m is None:
        return None
    cols = np.flatnonzero(np.asarray(m).any(axis=0))
    first = int(cols[0]) if cols.size else m.shape[1] - 1
    return m.shape[1] - first if first > 0 else None


class Scorer:
    """Summed losses of windows under `model` (see the module docstring)."""

    def __init__(self, model, vocab: int | None = None, workers: int | None = None):
        self.model, self.ops = model, model.ops
        self.vocab = vocab or model.cfg.vocab_size
        self.cpu = bool(self.ops.cpu_threads)
        T = model.cfg.context
        self.workers = max(1, workers or _cores()) if self.cpu else 1
        self.chunk = max(1, CPU_ROWS // T)                   # windows a CPU forward takes
        self.batch = self.chunk * 8 if self.cpu else max(1, GPU_TOKENS // T)   # windows a caller gives a call
        self._nll = score_ops.for_backend(self.ops)

    def _forward(self, x, y, m, W):
        """One forward over windows x (b, L) -> (b,) float64 on the device. The last layer and the
        head run only from the first position any window scores (a document's later windows score
        their last half): about a tenth of a forward at tiny, a twentieth at base; the figures
        agree with the whole forward's to float32 rounding (tests/test_score.py, on the GPU
        test_gpu_scored_tail_is_the_whole_forwards_last_rows)."""
        ops = self.ops
        keep = _scored_tail(m) if TAIL else None
        if keep is not None:
            y, m = y[:, -keep:], m[:, -keep:]
        logits = self.model.forward_cached(ops.asarray(x), [None] * self.model.cfg.n_layers, 0, W, keep=keep)
        return self._nll(logits, ops.asarray(y), None if m is None else ops.asarray(m), self.vocab)

    def nll(self, x, y, m=None) -> np.ndarray:
        """x, y (B, L) int host arrays, m (B, L) 0/1 or None -> (B,) float64 nats on the host."""
        poll()            # a `kill` kept during the training loop lands between batches
        x, y = np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.int64)
        W = self.model.weights()
        if not self.cpu:
            return self.ops.to_numpy(self._forward(x, y, m, W)).astype(np.float64)
        parts = [slice(i, i + self.chunk) for i in range(0, x.shape[0], self.chunk)]

        def one(s):
            return self._forward(x[s], y[s], None if m is None else m[s], W)
        from threadpoolctl import threadpool_limits
        with held(), threadpool_limits(limits=1, user_api="blas"):   # a `kill` waits for the workers
            if self.workers == 1 or len(parts) == 1:
                outs = [one(s) for s in parts]
            else:
                with ThreadPoolExecutor(min(self.workers, len(parts))) as pool:
                    outs = list(pool.map(one, parts))
        return np.concatenate(outs) if outs else np.zeros(0)
