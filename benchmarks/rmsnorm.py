"""RMSNorm forward and backward on the GPU: our kernels (rmsnorm_fwd_v8, rmsnorm_bwd_r*) against
the same math as CuPy array expressions and, where installed, PyTorch's rms_norm with autograd,
measured in the same run, fp16 activations, fp32 statistics.

    PYTHONPATH=. python benchmarks/rmsnorm.py [--json out.json]

Shapes: the presets' (rows N = batch x context, width C). Bytes counted: forward reads x and g,
writes out and 1/rms; backward reads dout, x, g and 1/rms, writes dx and dg (fp16 = 2 bytes,
fp32 = 4). Each timing: 3 warm-up runs, then the median of 20 samples of 10 back-to-back calls
timed with CUDA events. Before timing, each peer's output is checked against ours.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = {"tiny": (16 * 256, 128), "small": (64 * 512, 384), "base": (32 * 1024, 768)}
INNER = 10


def median_ms(fn, sync_event, warm=3, reps=20):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = sync_event(), sync_event()
        a.record()
        for _ in range(INNER):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed(b) / INNER)
    return float(np.median(times))


class _CpEvent:
    def __init__(self):
        import cupy as cp
        self.e = cp.cuda.Event()

    def record(self):
        self.e.record()

    def synchronize(self):
        self.e.synchronize()

    def elapsed(self, other):
        import cupy as cp
        return cp.cuda.get_elapsed_time(self.e, other.e)


class _TorchEvent:
    def __init__(self):
        import torch
        self.e = torch.cuda.Event(enable_timing=True)

    def record(self):
        self.e.record()

    def synchronize(self):
        self.e.synchronize()

    def elapsed(self, other):
        return self.e.elapsed_time(other.e)


def run(name, N, C, use_torch=True):
    import cupy as cp
    from bytemodel.ops.cuda_ops import CudaBackend
    ops = CudaBackend("fp16")
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((N, C), dtype=cp.float32).astype(cp.float16)
    g = (1 + 0.1 * rng.standard_normal(C, dtype=cp.float32)).astype(cp.float16)
    d = rng.standard_normal((N, C), dtype=cp.float32).astype(cp.float16)
    dg = cp.zeros(C, dtype=cp.float32)
    eps = 1e-5
    fwd_bytes = 2 * N * C * 2 + 2 * C + 4 * N
    bwd_bytes = 3 * N * C * 2 + 2 * C + 4 * N + 4 * C
    out, cache = ops.rmsnorm_forward(x, g, eps)
    dx = ops.rmsnorm_backward(d, cache, dg)

    def cupy_fwd():
        xf = x.astype(cp.float32)
        r = cp.reciprocal(cp.sqrt(cp.mean(xf * xf, axis=1, keepdims=True) + eps))
        return (xf * r * g.astype(cp.float32)).astype(cp.float16), r

    def cupy_bwd(r):
        xf, df, gf = x.astype(cp.float32), d.astype(cp.float32), g.astype(cp.float32)
        xh = xf * r
        dxh = df * gf
        dgc = (df * xh).sum(axis=0)
        return ((dxh - xh * cp.mean(dxh * xh, axis=1, keepdims=True)) * r).astype(cp.float16), dgc

    o2, r2 = cupy_fwd()
    dx2, _ = cupy_bwd(r2)
    rel = lambda a, b: float(cp.linalg.norm(a.astype(cp.float32) - b.astype(cp.float32)) / cp.linalg.norm(b.astype(cp.float32)))  # noqa: E731
    assert rel(out, o2) < 2e-3 and rel(dx, dx2) < 2e-3, "CuPy peer disagrees with our kernels"
    row = dict(preset=name, N=N, C=C,
               ours_fwd_ms=median_ms(lambda: ops.rmsnorm_forward(x, g, eps), _CpEvent),
               ours_bwd_ms=median_ms(lambda: ops.rmsnorm_backward(d, cache, dg), _CpEvent),
               cupy_fwd_ms=median_ms(cupy_fwd, _CpEvent),
               cupy_bwd_ms=median_ms(lambda: cupy_bwd(r2), _CpEvent))
    if use_torch:
        try:
            import torch
            xt = torch.as_tensor(x, device="cuda").requires_grad_(True)
            gt = torch.as_tensor(g, device="cuda").requires_grad_(True)
            dt = torch.as_tensor(d, device="cuda")
            ot = torch.nn.functional.rms_norm(xt, (C,), gt, eps)
            assert rel(cp.asarray(ot.detach()), out) < 5e-3, "PyTorch rms_norm disagrees with our kernel"

            def tb():
                torch.autograd.grad(ot, (xt, gt), dt, retain_graph=True)
            row["torch_fwd_ms"] = median_ms(lambda: torch.nn.functional.rms_norm(xt, (C,), gt, eps), _TorchEvent)
            row["torch_bwd_ms"] = median_ms(tb, _TorchEvent)
        except Exception as e:   # no PyTorch (or no rms_norm) here
            row["torch_error"] = repr(e)[:200]
    for k in ("ours", "cupy", "torch"):
        if f"{k}_fwd_ms" in row:
            row[f"{k}_fwd_GBs"] = fwd_bytes / row[f"{k}_fwd_ms"] / 1e6
            row[f"{k}_bwd_GBs"] = bwd_bytes / row[f"{k}_bwd_ms"] / 1e6
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    rows = []
    print(f"{'preset':>6} {'N x C':>13} | ours fwd/bwd GB/s | CuPy fwd/bwd GB/s | torch fwd/bwd GB/s | ours/CuPy, ours/torch (bwd)")
    for name, (N, C) in SHAPES.items():
        r = run(name, N, C, not a.no_torch)
        rows.append(r)
        t = (f"{r['torch_fwd_GBs']:7.0f} {r['torch_bwd_GBs']:7.0f}" if "torch_fwd_GBs" in r else f"{'n/a':>15}")
        ratio = f"{r['cupy_fwd_ms'] / r['ours_fwd_ms']:.2f}/{r['cupy_bwd_ms'] / r['ours_bwd_ms']:.2f}"
        if "torch_bwd_ms" in r:
            ratio += f", {r['torch_fwd_ms'] / r['ours_fwd_ms']:.2f}/{r['torch_bwd_ms'] / r['ours_bwd_ms']:.2f}"
        print(f"{name:>6} {f'{N}x{C}':>13} | {r['ours_fwd_GBs']:7.0f} {r['ours_bwd_GBs']:7.0f} | "
              f"{r['cupy_fwd_GBs']:7.0f} {r['cupy_bwd_GBs']:7.0f} | {t} | {ratio}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
