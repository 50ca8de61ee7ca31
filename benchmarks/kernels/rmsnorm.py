"""RMSNorm forward and backward (gpu/rmsnorm.cu): ours against the same math as CuPy expressions
and, where installed, PyTorch's rms_norm with autograd, in the same run.

    python benchmarks/kernels/rmsnorm.py [--presets small base] [--precision fp16] [--json f]

Shapes: the presets' (rows N = B*T, width C); also C = 100 (the any-width kernels). Bytes
counted: forward reads x and g, writes out and 1/rms; backward reads dout, x, g and 1/rms,
writes dx and dg (the dg partial rows, one per 64 rows, are counted as written and read once).
Checked against numpy_ops in float64 on the same rounded inputs.
"""
from __future__ import annotations

import numpy as np

from _bench import TOL, check, main, median_ms, rnd, row

from bytemodel.ops import numpy_ops as ref


def run(ops, preset, shape):
    import cupy as cp
    B, T, C0, _, _ = shape
    N = B * T
    rows = []
    for C in (C0, 100):
        rng = np.random.default_rng(0)
        x, xd = rnd(ops, rng, (N, C))
        g, gd = rnd(ops, rng, (C,))
        d, dd = rnd(ops, rng, (N, C))
        out, cache = ops.rmsnorm_forward(xd, gd, 1e-5)
        out_ref, cache_ref = ref.rmsnorm_forward(x, g, 1e-5)
        err_f = check("rmsnorm forward", out, out_ref, TOL[ops.precision])
        dg = cp.zeros((C,), dtype=cp.float32)
        dx = ops.rmsnorm_backward(dd, cache, dg)
        dg_ref = np.zeros(C)
        dx_ref = ref.rmsnorm_backward(d, cache_ref, dg_ref)
        err_b = max(check("rmsnorm backward dx", dx, dx_ref, TOL[ops.precision]),
                    check("rmsnorm backward dg", dg, dg_ref, 1e-4))
        dt = ops.act_dtype

        def peer_f():
            xf = xd.astype(cp.float32)
            r = 1 / cp.sqrt(cp.mean(xf * xf, axis=1, keepdims=True) + 1e-5)
            return (xf * r * gd.astype(cp.float32)).astype(dt), r
        _, r2 = peer_f()

        def peer_b():
            xf, df, gf = xd.astype(cp.float32), dd.astype(cp.float32), gd.astype(cp.float32)
            xh = xf * r2
            dxh = df * gf
            return ((dxh - xh * cp.mean(dxh * xh, axis=1, keepdims=True)) * r2).astype(dt), (df * xh).sum(axis=0)
        isz = dt.itemsize
        nf = 2 * N * C * isz + C * isz + 4 * N
        nb = 3 * N * C * isz + C * isz + 4 * N + 4 * C + 2 * 4 * C * ((N + 63) // 64)
        tag = "" if C == C0 else f" C={C}"
        rows.append(row("rmsnorm_fwd" + tag, preset, (N, C), median_ms(lambda: ops.rmsnorm_forward(xd, gd, 1e-5)),
                        median_ms(peer_f), nbytes=nf, err=err_f))
        rows.append(row("rmsnorm_bwd" + tag, preset, (N, C), median_ms(lambda: ops.rmsnorm_backward(dd, cache, dg)),
                        median_ms(peer_b), nbytes=nb, err=err_b))
        if C == C0:
            try:
                import torch
                xt = torch.as_tensor(xd, device="cuda").requires_grad_(True)
                gt = torch.as_tensor(gd, device="cuda").requires_grad_(True)
                dtt = torch.as_tensor(dd, device="cuda")
                ot = torch.nn.functional.rms_norm(xt, (C,), gt, 1e-5)
                tb = lambda: torch.autograd.grad(ot, (xt, gt), dtt, retain_graph=True)   # noqa: E731
                rows.append(row("rmsnorm_bwd", preset, (N, C), rows[-1]["ms"], median_ms(tb), nbytes=nb,
                                err=err_b, peer="PyTorch"))
            except Exception as e:   # no PyTorch (or no rms_norm) here
                print(f"   (no PyTorch peer: {e!r:.80})")
    return rows


if __name__ == "__main__":
    main(run, __doc__)
