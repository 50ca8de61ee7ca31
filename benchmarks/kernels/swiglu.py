"""SwiGLU forward and backward (gpu/swiglu.cu): ours against the same math as CuPy expressions.

    python benchmarks/kernels/swiglu.py [--presets small base] [--precision fp16] [--json f]

Shapes: h = [gate | up] (N = B*T, 2F), out (N, F). Bytes counted: forward reads h, writes out;
backward reads h and dout, writes dh.
"""
from __future__ import annotations

import numpy as np

from _bench import TOL, check, main, median_ms, rnd, row

from bytemodel.ops import numpy_ops as ref


def run(ops, preset, shape):
    import cupy as cp
    B, T, _, F, _ = shape
    N = B * T
    rng = np.random.default_rng(0)
    h, hd = rnd(ops, rng, (N, 2 * F))
    d, dd = rnd(ops, rng, (N, F))
    out, cache = ops.swiglu_forward(hd)
    out_ref, cache_ref = ref.swiglu_forward(h)
    err_f = check("swiglu forward", out, out_ref, TOL[ops.precision])
    err_b = check("swiglu backward", ops.swiglu_backward(dd, cache), ref.swiglu_backward(d, cache_ref), TOL[ops.precision])
    dt = ops.act_dtype

    def peer_f():
        g, u = hd[:, :F].astype(cp.float32), hd[:, F:].astype(cp.float32)
        return (g / (1 + cp.exp(-g)) * u).astype(dt)

    def peer_b():
        g, u, dv = hd[:, :F].astype(cp.float32), hd[:, F:].astype(cp.float32), dd.astype(cp.float32)
        s = 1 / (1 + cp.exp(-g))
        return cp.concatenate([(dv * u * s * (1 + g * (1 - s))).astype(dt), (dv * g * s).astype(dt)], axis=1)
    isz = dt.itemsize
    return [row("swiglu_fwd", preset, (N, F), median_ms(lambda: ops.swiglu_forward(hd)), median_ms(peer_f),
                nbytes=3 * N * F * isz, err=err_f),
            row("swiglu_bwd", preset, (N, F), median_ms(lambda: ops.swiglu_backward(dd, cache)), median_ms(peer_b),
                nbytes=5 * N * F * isz, err=err_b)]


if __name__ == "__main__":
    main(run, __doc__)
