"""The qkv split + RoPE forward and backward (gpu/rope.cu): ours against the same rotation as CuPy
expressions, in the same run.

    python benchmarks/kernels/rope.py [--presets small base] [--precision fp16] [--json f]

Shapes: qkv (N = B*T, 3C) -> q, k, v (B, H, T, D); the backward takes dq in fp32 (the flash
backward's accumulator) and dk, dv. Bytes counted: forward reads q and k of qkv and the tables,
writes the rotated q and k (v stays in place); backward reads dq (fp32), dk, dv, writes dqkv.
"""
from __future__ import annotations

import numpy as np

from _bench import TOL, check, main, median_ms, rnd, row

from bytemodel.ops import numpy_ops as ref
from bytemodel.ops.host import rope_tables


def run(ops, preset, shape):
    import cupy as cp
    B, T, C, _, H = shape
    D = C // H
    rng = np.random.default_rng(0)
    qkv, qkvd = rnd(ops, rng, (B * T, 3 * C))
    cos, sin = rope_tables(np.arange(T), D, 10000.0, ops.act_dtype)
    cosd, sind = cp.asarray(cos), cp.asarray(sin)
    cos64, sin64 = cos.astype(np.float64), sin.astype(np.float64)
    q, k, v = ops.qkv_rope_forward(qkvd, cosd, sind, B, T, H, H)
    qr, kr, vr = ref.qkv_rope_forward(qkv, cos64, sin64, B, T, H, H)
    err_f = max(check("rope forward " + n, a, b, TOL[ops.precision]) for n, a, b in (("q", q, qr), ("k", k, kr), ("v", v, vr)))
    dq, dqd = rnd(ops, rng, (B, H, T, D))
    dk, dkd = rnd(ops, rng, (B, H, T, D))
    dv, dvd = rnd(ops, rng, (B, H, T, D))
    dq32 = dqd.astype(cp.float32)
    err_b = check("rope backward", ops.qkv_rope_backward(dq32, dkd, dvd, cosd, sind),
                  ref.qkv_rope_backward(dq, dk, dv, cos64, sin64), TOL[ops.precision])
    h = D // 2
    c4, s4 = cosd.astype(cp.float32)[None, None], sind.astype(cp.float32)[None, None]
    dt = ops.act_dtype

    def peer_f():
        t = qkvd.reshape(B, T, 3 * H, D)[:, :, :2 * H].transpose(0, 2, 1, 3).astype(cp.float32)
        x1, x2 = t[..., :h], t[..., h:]
        return cp.concatenate([x1 * c4 - x2 * s4, x2 * c4 + x1 * s4], axis=-1).astype(dt)

    def peer_b():
        qk = cp.concatenate([dq32, dkd.astype(cp.float32)], axis=1)
        x1, x2 = qk[..., :h], qk[..., h:]
        r = cp.concatenate([x1 * c4 + x2 * s4, x2 * c4 - x1 * s4], axis=-1).astype(dt)
        return cp.concatenate([r, dvd], axis=1).transpose(0, 2, 1, 3).reshape(B * T, 3 * C)
    isz = dt.itemsize
    nf = 2 * B * T * C * isz * 2 + 2 * T * h * isz
    nb = B * T * C * 4 + 2 * B * T * C * isz + 3 * B * T * C * isz
    return [row("qkv_rope_fwd", preset, (B * T, 3 * C), median_ms(lambda: ops.qkv_rope_forward(qkvd, cosd, sind, B, T, H, H)),
                median_ms(peer_f), nbytes=nf, err=err_f),
            row("qkv_rope_bwd", preset, (B * T, 3 * C), median_ms(lambda: ops.qkv_rope_backward(dq32, dkd, dvd, cosd, sind)),
                median_ms(peer_b), nbytes=nb, err=err_b)]


if __name__ == "__main__":
    main(run, __doc__)
