"""Scoring's window sums (gpu/score.cu, ops/cuda_score.window_nll): ours against the same math as
CuPy expressions.

    python benchmarks/kernels/score.py [--presets small base] [--precision fp16] [--json f]

Shapes: a scoring call's batch (ops/scorer.GPU_TOKENS tokens: 64 windows of 1,024 at base), the
logits (B, L, Vl) of a byte vocabulary (Vl = 256 + the document separator), the targets (B, L) and
a mask scoring each window's last half (as `score` does past a document's first window). Bytes
counted: the logits read once, the targets and the mask. The check: the B float64 sums against
score_ops.window_nll on the same rounded logits, norm-relative (float32 log-softmax: 1e-6).
"""
from __future__ import annotations

import numpy as np

from _bench import check, main, median_ms, row

from bytemodel.ops import score_ops as ref
from bytemodel.ops.scorer import GPU_TOKENS

VOCAB = 257
TOL_SUMS = 1e-6   # float32 log-softmax terms, float64 sums on both sides: differences of rounding only


def run(ops, preset, shape):
    import cupy as cp
    from bytemodel.ops.cuda_score import window_nll
    T = shape[1]
    B, L = max(1, GPU_TOKENS // T), T
    rng = np.random.default_rng(0)
    z = (rng.standard_normal((B, L, VOCAB)) * 3).astype(ops.act_dtype)
    y = rng.integers(0, VOCAB - 1, (B, L))
    m = np.zeros((B, L), dtype=np.uint8)
    m[:, L // 2:] = 1
    zd, yd, md = cp.asarray(z), cp.asarray(y), cp.asarray(m)
    got = window_nll(zd, yd, md, VOCAB)
    err = check("window_nll", got, ref.window_nll(z.astype(np.float32), y, m, VOCAB), TOL_SUMS)

    def peer():
        f = zd.astype(cp.float32)
        mx = f.max(axis=-1, keepdims=True)
        lse = mx[..., 0] + cp.log(cp.exp(f - mx).sum(axis=-1))
        nll = lse - cp.take_along_axis(f, yd[..., None], -1)[..., 0]
        return cp.where(md != 0, nll, cp.float32(0)).astype(cp.float64).sum(axis=1)
    nbytes = B * L * (VOCAB * z.dtype.itemsize + 8 + 1)
    return [row("score_window_nll", preset, (B, L, VOCAB), median_ms(lambda: window_nll(zd, yd, md, VOCAB)),
                median_ms(peer), nbytes=nbytes, err=err)]


if __name__ == "__main__":
    main(run, __doc__)
