"""What the kernel benchmarks share (benchmarks/kernels/<op>.py, one per op of gpu/, as llm.c's
dev/cuda/): inputs rounded to the compute dtype, the check against the NumPy reference in
float64, CUDA-event timing and one line per case.

Each benchmark: for each preset's shape, run our op, check it against numpy_ops on the same
rounded inputs (norm-relative error under the tests' tolerance, tests/test_cuda_ops.py; a failure
prints `error:` and exits 1), then time it and a peer doing the same math (CuPy array
expressions, or PyTorch where noted) in the same run, and print GB/s (bytes the op must move at
least, counted in each file) or TFLOP/s and the ratio.

Timing: 3 warm-up calls, then the median of 20 samples of INNER back-to-back calls between two
CUDA events (one call alone would also time Python's launch cost at the small shapes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# preset -> (B, T, C, F, H): the shapes gpu_train.py times (tiny at the CLI's defaults)
PRESETS = {"tiny": (16, 256, 128, 384, 4), "small": (64, 512, 384, 1024, 6), "base": (32, 1024, 768, 2048, 12)}
TOL = {"fp16": 2e-3, "bf16": 1.6e-2, "fp32": 1e-5}   # as tests/test_cuda_ops.py, with its reasons
INNER = 10


def backend(precision: str):
    from bytemodel.ops.cuda_ops import CudaBackend
    return CudaBackend(precision)


def rnd(ops, rng, shape, scale=1.0):
    """A fresh array rounded to the compute dtype: (float64 host copy, device array)."""
    x = (rng.standard_normal(shape) * scale).astype(ops.act_dtype)
    import cupy as cp
    return x.astype(np.float64), cp.asarray(x)


def host(a) -> np.ndarray:
    import cupy as cp
    return cp.asnumpy(a).astype(np.float64)


def check(what: str, got, want, tol: float) -> float:
    """Norm-relative error of got (device or host) against want (float64); exits 1 above tol."""
    g = host(got) if not isinstance(got, np.ndarray) else got.astype(np.float64)
    w = np.asarray(want, dtype=np.float64)
    err = float(np.linalg.norm(g - w) / (np.linalg.norm(w) + 1e-30))
    if not np.isfinite(g).all() or err > tol:
        print(f"error: {what}: relative error {err:.3g} over the tolerance {tol:g}")
        sys.exit(1)
    return err


def median_ms(fn, warm: int = 3, reps: int = 20, inner: int = INNER) -> float:
    import cupy as cp
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / inner)
    return float(np.median(times))


def row(op: str, preset: str, shape, ms: float, peer_ms: float | None, nbytes: float = 0, flops: float = 0,
        err: float | None = None, peer: str = "CuPy") -> dict:
    r = dict(op=op, preset=preset, shape=list(shape), ms=ms, err=err, peer=peer, peer_ms=peer_ms)
    if nbytes:
        r["GBs"] = nbytes / ms / 1e6
    if flops:
        r["TFLOPs"] = flops / ms / 1e9
    if peer_ms:
        r["speedup"] = peer_ms / ms
    rate = f"{r['GBs']:8.0f} GB/s" if nbytes else f"{r.get('TFLOPs', 0):8.1f} TFLOP/s"
    vs = f"{r['speedup']:5.2f}x {peer}" if peer_ms else ""
    e = f"err {err:.1e}" if err is not None else ""
    print(f"{op:<28} {preset:>6} {str(tuple(shape)):>22} {ms * 1e3:9.1f} us {rate}  {vs:>14}  {e}", flush=True)
    return r


def main(run, doc: str):
    """run(ops, preset, (B, T, C, F, H)) -> list of row() dicts, for each preset asked for."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--presets", nargs="*", default=["small", "base"], choices=list(PRESETS))
    ap.add_argument("--precision", default="fp16", choices=list(TOL))
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    ops = backend(a.precision)
    rows = []
    print(f"{'op':<28} {'preset':>6} {'shape':>22} {'time':>12} {'rate':>13}  {'against':>14}  check ({a.precision})")
    for p in a.presets:
        rows += run(ops, p, PRESETS[p])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows
