"""Runs the attention backward (or forward) a few times at one shape, for Nsight Compute: the
shipped kernel or a study variant of flash_attn.py's HOPPER_BWD_VARIANTS, fp16, causal. The
timing is ncu's; this script only makes the calls (benchmarks/device_check.sh ncu runs it).

    ncu --clock-control none -k regex:flash_bwd_h --launch-skip 2 --launch-count 1 \\
        python3 benchmarks/kernels/flash_profile.py --shape 32,12,1024,64 --bwd h_staged

--bwd: "shipped" (default) or a version of HOPPER_BWD_VARIANTS at the shape's head dim;
--fwd: profile the forward instead (the shipped kernel). Each call is checked against the
shipped kernel's result first, as flash_attn.py does, so a profile is of a kernel that works.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flash_attn  # noqa: E402  (benchmarks/kernels/flash_attn.py: the study variants)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="32,12,1024,64", help="B,H,T,D")
    ap.add_argument("--bwd", default="shipped", help="shipped, or a version of HOPPER_BWD_VARIANTS")
    ap.add_argument("--fwd", action="store_true", help="profile the forward")
    ap.add_argument("--calls", type=int, default=4, help="calls of the profiled kernel (ncu picks with --launch-skip)")
    a = ap.parse_args()
    try:
        B, H, T, D = (int(x) for x in a.shape.split(","))
    except ValueError:
        raise SystemExit(f"error: --shape takes B,H,T,D, got {a.shape!r}")
    if a.bwd != "shipped" and (a.bwd, D) not in flash_attn.HOPPER_BWD_VARIANTS:
        known = sorted(v for v, d in flash_attn.HOPPER_BWD_VARIANTS if d == D)
        raise SystemExit(f"error: no backward version {a.bwd!r} at head dim {D}; known: shipped, {', '.join(known)}")
    import cupy as cp
    ops = flash_attn.variant_backend()
    if not ops.hopper:
        raise SystemExit("error: the Hopper kernels need a GPU of compute capability 9.x")
    rng = cp.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((B, H, T, D), dtype=cp.float32).astype(cp.float16) for _ in range(4))
    ops.use = {}
    out, lse = ops.attention_forward(q, k, v)
    if a.fwd:
        for _ in range(a.calls):
            ops.attention_forward(q, k, v)
    else:
        ref = ops.attention_backward(do, q, k, v, out, lse)
        ops.use = {"bwd": a.bwd}
        got = ops.attention_backward(do, q, k, v, out, lse)
        real_dq = flash_attn.HOPPER_BWD_VARIANTS.get((a.bwd, D), (None, True))[1]
        for g, r in list(zip(got, ref))[0 if real_dq else 1:]:
            err = float(cp.linalg.norm(g.astype(cp.float32) - r.astype(cp.float32)) / cp.linalg.norm(r.astype(cp.float32)))
            if err > 2e-3:
                raise SystemExit(f"error: backward {a.bwd} differs from the shipped kernel (relative {err:.1e})")
        for _ in range(a.calls):
            ops.attention_backward(do, q, k, v, out, lse)
    cp.cuda.Device().synchronize()
    print(f"{'forward' if a.fwd else 'backward ' + a.bwd} at {B},{H},{T},{D}: {a.calls} calls after the checks")


if __name__ == "__main__":
    main()
