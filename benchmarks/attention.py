"""FlashAttention forward/backward TFLOP/s: ours (gpu/flash_attn.cu) against PyTorch's
scaled_dot_product_attention (flash backend) in the same run, fp16, causal.

    python benchmarks/attention.py                 # the shapes of DESIGN.md
    python benchmarks/attention.py --shapes 16,12,1024,64

FLOPs (causal, FlashAttention's convention): forward 4*B*H*T*T*D / 2, backward 2.5x forward.
Each timing: 3 warm-up runs, then the median of 20 samples of 5 back-to-back calls timed with
CUDA events (one call alone would also time Python's launch cost at the small shapes).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = [(16, 12, 1024, 64), (16, 12, 1024, 128), (16, 12, 4096, 64), (16, 12, 4096, 128)]


INNER = 5   # calls per timed sample, so that Python's launch cost hides behind the GPU work


def median_ms_cupy(fn, warm=3, reps=20):
    import cupy as cp
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        for _ in range(INNER):
            fn()
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / INNER)
    return float(np.median(times))


def median_ms_torch(fn, warm=3, reps=20):
    import torch
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(INNER):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / INNER)
    return float(np.median(times))


def ours(B, H, T, D):
    """-> {("fwd"|"bwd", version): ms} for every kernel version of this head dim."""
    import cupy as cp
    from bytemodel.ops.cuda_ops import FLASH_BWD, FLASH_DEFAULT, FLASH_FWD, CudaBackend
    ops = CudaBackend("fp16")
    rng = cp.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((B, H, T, D), dtype=cp.float32).astype(cp.float16) for _ in range(4))
    res = {}
    fdef, bdef = FLASH_DEFAULT[D]
    for (ver, d) in FLASH_FWD:
        if d == D:
            ops.flash_versions[D] = (ver, bdef)
            res[("fwd", ver)] = median_ms_cupy(lambda: ops.attention_forward(q, k, v))
    ops.flash_versions[D] = (fdef, bdef)
    out, lse = ops.attention_forward(q, k, v)
    for (ver, d) in FLASH_BWD:
        if d == D:
            ops.flash_versions[D] = (fdef, ver)
            res[("bwd", ver)] = median_ms_cupy(lambda: ops.attention_backward(do, q, k, v, out, lse))
    ops.flash_versions[D] = (fdef, bdef)
    res[("fwd", "default")] = res[("fwd", fdef)]
    res[("bwd", "default")] = res[("bwd", bdef)]
    return res


def sdpa(B, H, T, D):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v, do = (torch.randn(B, H, T, D, device="cuda", dtype=torch.float16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        f = median_ms_torch(fwd)
        out = fwd()
        b = median_ms_torch(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
    return f, b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", help="B,H,T,D ...")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.shapes] if a.shapes else SHAPES
    rows = []
    print(f"{'B,H,T,D':>18} | {'ours fwd':>9} {'bwd':>7} | {'SDPA fwd':>9} {'bwd':>7} | TFLOP/s; ratio fwd/bwd")
    for B, H, T, D in shapes:
        fl = 4.0 * B * H * T * T * D / 2
        res = ours(B, H, T, D)
        of, ob = res[("fwd", "default")], res[("bwd", "default")]
        r = dict(shape=[B, H, T, D], ours_fwd_ms=of, ours_bwd_ms=ob,
                 ours_fwd_tflops=fl / of / 1e9, ours_bwd_tflops=2.5 * fl / ob / 1e9,
                 versions={f"{p} {v}": (fl if p == "fwd" else 2.5 * fl) / ms / 1e9
                           for (p, v), ms in res.items() if v != "default"})
        print("   versions (TFLOP/s): " + ", ".join(f"{k} {x:.1f}" for k, x in r["versions"].items()))
        if not a.no_torch:
            try:
                sf, sb = sdpa(B, H, T, D)
                r.update(sdpa_fwd_ms=sf, sdpa_bwd_ms=sb, sdpa_fwd_tflops=fl / sf / 1e9,
                         sdpa_bwd_tflops=2.5 * fl / sb / 1e9)
            except Exception as e:  # no PyTorch here
                r["sdpa_error"] = repr(e)
        rows.append(r)
        s = f"{str((B, H, T, D)):>18} | {r['ours_fwd_tflops']:9.1f} {r['ours_bwd_tflops']:7.1f} |"
        if "sdpa_fwd_tflops" in r:
            s += (f" {r['sdpa_fwd_tflops']:9.1f} {r['sdpa_bwd_tflops']:7.1f} |"
                  f" {r['ours_fwd_tflops'] / r['sdpa_fwd_tflops']:.2f} / {r['ours_bwd_tflops'] / r['sdpa_bwd_tflops']:.2f}")
        print(s, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
