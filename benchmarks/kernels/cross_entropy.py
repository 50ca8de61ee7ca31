"""Softmax + cross-entropy forward and backward (gpu/cross_entropy.cu), without and with a loss
mask: ours against the same math as CuPy expressions, in the same run.

    python benchmarks/kernels/cross_entropy.py [--presets small base] [--precision fp16] [--json f]

Shapes: logits (N = B*T, V = 256), targets (N,). Bytes counted: forward reads the logits, writes
the loss and log-sum-exp; backward reads the logits, writes dlogits. The masked case counts half
the rows (the others are neither read nor softmaxed).
"""
from __future__ import annotations

import numpy as np

from _bench import TOL, check, main, median_ms, rnd, row

from bytemodel.ops import numpy_ops as ref


def run(ops, preset, shape):
    import cupy as cp
    B, T, _, _, _ = shape
    N, V = B * T, 256
    rng = np.random.default_rng(0)
    x, xd = rnd(ops, rng, (N, V), 3.0)
    t = rng.integers(0, V, N)
    td = cp.asarray(t, dtype=cp.int32)
    dl = np.ones(N)   # d(sum of losses): gradients of order 1/V (1/N would be fp16 subnormals)
    dld = cp.asarray(dl, dtype=cp.float32)
    rows = []
    for mask in (None, (rng.random(N) < 0.5).astype(np.uint8)):
        md = None if mask is None else cp.asarray(mask)
        losses, cache = ops.cross_entropy_forward(xd, td, md)
        l_ref, c_ref = ref.cross_entropy_forward(x, t, mask)
        err_f = check("cross-entropy forward", losses, l_ref, 1e-5)    # fp32 statistics of exact inputs
        err_b = check("cross-entropy backward", ops.cross_entropy_backward(dld, cache),
                      ref.cross_entropy_backward(dl, c_ref), TOL[ops.precision])
        dt = ops.act_dtype

        def peer_f():
            z = xd.astype(cp.float32)
            m = z.max(axis=1, keepdims=True)
            lse = m[:, 0] + cp.log(cp.exp(z - m).sum(axis=1))
            loss = lse - z[cp.arange(N), td]
            return (loss if md is None else loss * md), lse

        _, lse_p = peer_f()

        def peer_b():
            p = cp.exp(xd.astype(cp.float32) - lse_p[:, None])
            p[cp.arange(N), td] -= 1
            w = dld if md is None else dld * md
            return (p * w[:, None]).astype(dt)
        isz = dt.itemsize
        tag = "" if mask is None else " masked"
        rows.append(row("ce_fwd" + tag, preset, (N, V), median_ms(lambda: ops.cross_entropy_forward(xd, td, md)),
                        median_ms(peer_f), nbytes=N * V * isz + 8 * N, err=err_f))
        rows.append(row("ce_bwd" + tag, preset, (N, V), median_ms(lambda: ops.cross_entropy_backward(dld, cache)),
                        median_ms(peer_b), nbytes=2 * N * V * isz, err=err_b))
    return rows


if __name__ == "__main__":
    main(run, __doc__)
