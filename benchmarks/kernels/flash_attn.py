"""FlashAttention forward/backward TFLOP/s: ours (gpu/flash_attn.cu, and the study variants of
benchmarks/kernels/flash_variants.cu beside this file) against PyTorch's
scaled_dot_product_attention (flash backend) in the same run, fp16, causal.

    python benchmarks/kernels/flash_attn.py                 # the shapes of DESIGN.md
    python benchmarks/kernels/flash_attn.py --shapes 32,12,1024,64 64,6,512,64   # base, small
    python benchmarks/kernels/flash_attn.py --tma     # the TMA-fed forwards against the shipped one and SDPA
    ncu --clock-control none -k regex:flash_bwd_h --launch-skip 2 --launch-count 1 \
        python benchmarks/kernels/flash_attn.py --shapes 32,12,1024,64 --profile h_staged
                # --profile VERSION (shipped, a study of HOPPER_BWD_VARIANTS, or fwd): no timing, only
                # the checked calls for a profiler (benchmarks/device_check.sh ncu)

Validation: every variant's output against the shipped kernel's (same math, another tiling:
equal to fp16 rounding), the shipped kernel against NumPy in float64 in tests/; each backward
variant is also called 3 times on the same inputs and its dQ, dK, dV bytes compared: `same bits`
says whether they repeat (the shipped kernel's ordered dQ reduction must; the "atomic" variant,
the kernel before it, in general does not).

FLOPs (causal, FlashAttention's convention): forward 4*B*H*T*T*D / 2, backward 2.5x forward.
Each timing: 3 warm-up runs, then the median of 20 samples of 5 back-to-back calls timed with
CUDA events (one call alone would also time Python's launch cost at the small shapes).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

SHAPES = [(16, 12, 1024, 64), (16, 12, 1024, 128), (16, 12, 4096, 64), (16, 12, 4096, 128)]


import _bench  # noqa: E402  (benchmarks/kernels/_bench.py: the shared CUDA-event timer)

INNER = 5   # calls per timed sample, so that Python's launch cost hides behind the GPU work


def median_ms_cupy(fn):
    return _bench.median_ms(fn, inner=INNER)



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


# the configurations kept for study (benchmarks/kernels/flash_variants.cu): (version, D) -> tiles
VARIANTS_FWD = {("v1", 32): (64, 64), ("v1", 64): (64, 64), ("v1", 128): (64, 64),
                ("v3", 64): (128, 32), ("v3", 128): (128, 16)}
VARIANTS_BWD = {("v1", 32): (64, 64, 64), ("v1", 64): (64, 64, 64), ("atomic", 64): (32, 128, 32),
                ("single", 64): (32, 128, 32), ("pair_ticket", 64): (32, 128, 64), ("deferred", 64): (32, 128, 32)}
# the Hopper backward's study variants (flash_hopper_variants.cu, MODE bits of gpu/flash_hopper.cu):
# (version, D) -> (kernel, whether its dQ is the real one; "nodq" leaves the dQ product and its adds
# out, to time the rest: a difference, not a result)
HOPPER_BWD_VARIANTS = {("h_deferred", 64): ("flash_bwd_h64_m8", True), ("h_immediate", 64): ("flash_bwd_h64_m0", True),
                       ("h_nowait", 64): ("flash_bwd_h64_m1", True),
                       ("h_nodq", 64): ("flash_bwd_h64_m2", False), ("h_deferred", 128): ("flash_bwd_h128_m24", True),
                       ("h_nodq", 128): ("flash_bwd_h128_m2", False),
                       ("h_staged", 64): ("flash_bwd_h64_m24", True), ("h_v4", 128): ("flash_bwd_h128_m32", True),
                       ("h_pipe", 64): ("flash_bwd_h64_m128", True), ("h_pipe_v4", 64): ("flash_bwd_h64_m160", True),
                       ("h_pipe", 128): ("flash_bwd_h128_m128", True),
                       ("h_split", 64): ("flash_bwd_h64_m256", True), ("h_split_v4", 64): ("flash_bwd_h64_m288", True),
                       ("h_immediate", 128): ("flash_bwd_h128_m0", True),
                       ("h_split_v4", 128): ("flash_bwd_h128_m288", True)}
# the variants that must give the shipped kernel's bytes (the same adds in another form or order in time)
SAME_BITS = {"h_v4", "h_pipe", "h_pipe_v4", "h_staged"}
HOPPER_VARIANTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flash_hopper_variants.cu")
VARIANTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flash_variants.cu")


@functools.lru_cache(maxsize=None)
def _hopper_variants_source():
    """flash_hopper_variants.cu's text, read once (the kernel lookups run inside the timed calls)."""
    with open(HOPPER_VARIANTS_FILE) as f:
        return "\n" + f.read()


def hopper_bwd_variant(precision, name, D, drop=False):
    """A backward kernel of flash_hopper_variants.cu (flash_bwd_h<D>_m<MODE>, or with drop its
    twin name + "_drop" with attention dropout) -> (function, tiles) as
    CudaBackend._hopper_bwd_kernel gives them, the tiles naming the shared memory its MODE's dQ
    exchange takes (flash_bwd_h's sX). tests/conftest.py runs the GPU tests on one this way."""
    from bytemodel.ops import cuda_ops
    mod = cuda_ops._hopper_module(precision, _hopper_variants_source())
    mode = int(name.rsplit("_m", 1)[1])
    exchange = 128 * D if mode & 128 else 0 if mode & 256 else 64 * D
    return mod.get_function(name + ("_drop" if drop else "")), cuda_ops.FLASH_BWD_HOPPER[D][1][:3] + (exchange,)


def hopper_bwd_has_drop(name) -> bool:
    """Whether flash_hopper_variants.cu defines the dropout twin of the backward kernel `name`."""
    return f"BWD_H_DROP({name}_drop," in _hopper_variants_source()


def variant_backend():
    """The fp16 CUDA backend whose FlashAttention kernel can be switched to a study variant
    (compiled from flash_attn.cu + flash_variants.cu); .use = {"fwd": ver, "bwd": ver} or None."""
    import cupy as cp
    from bytemodel.ops import cuda_ops, gpu_source

    class Variants(cuda_ops.CudaBackend):
        use = {}

        def _flash_kernel(self, kind, D, drop=False):
            ver = self.use.get(kind)
            if ver is None or ver == "shipped" or drop:   # the study variants draw no dropout mask
                return super()._flash_kernel(kind, D, drop)
            if not hasattr(self, "_variants"):
                with open(VARIANTS_FILE) as f:
                    code = gpu_source.source("flash_attn.cu") + "\n" + f.read()
                opts = gpu_source.module_options("flash_attn.cu", self.precision)   # _module's
                self._variants = cp.RawModule(code=code, options=opts)
            tiles = (VARIANTS_FWD if kind == "fwd" else VARIANTS_BWD)[(ver, D)]
            return self._variants.get_function(f"flash_{kind}_{ver}_d{D}"), tiles

        def _hopper_bwd_kernel(self, D, drop=False):   # version = a key of HOPPER_BWD_VARIANTS
            ver = self.use.get("bwd")
            if (ver, D) not in HOPPER_BWD_VARIANTS or drop:   # the study variants draw no dropout mask
                return super()._hopper_bwd_kernel(D, drop=drop)
            return hopper_bwd_variant(self.precision, HOPPER_BWD_VARIANTS[(ver, D)][0], D)

        def _hopper_kernel(self, D, name=None, drop=False):   # version = a kernel of HOPPER_FWD_KERNELS
            ver = self.use.get("fwd")
            if ver not in cuda_ops.HOPPER_FWD_KERNELS or ver == cuda_ops.FLASH_FWD_HOPPER[D] or drop:
                return super()._hopper_kernel(D, drop=drop)
            mod = cuda_ops._hopper_module(self.precision, _hopper_variants_source())
            return mod.get_function(ver), cuda_ops.HOPPER_FWD_KERNELS[ver][1:]
    return Variants("fp16")


def forward_versions(ops, D):
    """The forward versions to time at head dim D: -> [(version, use hopper)]. "shipped" is what
    attention_forward runs here (on Hopper the TMA-fed kernel where FLASH_FWD_TMA has one, else the
    wgmma kernel); "fa2" the FlashAttention-2 kernel; the wgmma kernels by name (the TMA kernel off
    while they run: ours())."""
    on_hopper = ops.hopper
    vs = [("shipped", on_hopper)]
    if on_hopper:
        from bytemodel.ops import cuda_ops
        tma = D in cuda_ops.FLASH_FWD_TMA
        vs += [("fa2", False)] + [(v, True) for v, (d, *_) in cuda_ops.HOPPER_FWD_KERNELS.items()
                                  if d == D and (tma or v != cuda_ops.FLASH_FWD_HOPPER[D])]
    return vs + [(v, False) for (v, d) in VARIANTS_FWD if d == D]


def close(a, b):
    """fp16 outputs of two tilings of the same math: the same to fp16 rounding."""
    import cupy as cp
    a, b = a.astype(cp.float32), b.astype(cp.float32)
    return float(cp.linalg.norm(a - b) / cp.linalg.norm(b)) < 2e-3


def profile(B, H, T, D, ver, calls):
    """The calls a profiler times: the backward `ver` ("shipped" or a study version; "fwd": the
    shipped forward) `calls` times, after one shipped backward and one checked call of `ver`
    (so the profiled kernel's launches start at the third: ncu --launch-skip 2)."""
    import cupy as cp
    ops = variant_backend()
    if not ops.hopper:
        raise SystemExit("error: --profile runs the Hopper kernels: a GPU of compute capability 9.x")
    rng = cp.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((B, H, T, D), dtype=cp.float32).astype(cp.float16) for _ in range(4))
    ops.use = {}
    out, lse = ops.attention_forward(q, k, v)
    if ver == "fwd":
        for _ in range(calls + 1):
            ops.attention_forward(q, k, v)
    else:
        ref = ops.attention_backward(do, q, k, v, out, lse)
        ops.use = {"bwd": ver}
        got = ops.attention_backward(do, q, k, v, out, lse)
        real_dq = HOPPER_BWD_VARIANTS.get((ver, D), (None, True))[1]   # "nodq": dK, dV only
        if not all(close(a, b) for a, b in list(zip(got, ref))[0 if real_dq else 1:]):
            raise SystemExit(f"error: backward {ver} d{D} differs from the shipped kernel")
        for _ in range(calls):
            ops.attention_backward(do, q, k, v, out, lse)
    cp.cuda.Device().synchronize()
    print(f"{'forward' if ver == 'fwd' else 'backward ' + ver} at {B},{H},{T},{D}: {calls} calls after the checks")


def ours(B, H, T, D, same=None, fwd_variants=True, bwd_only=None):
    """-> {("fwd"|"bwd", version): ms} for the shipped kernel ("shipped") and every study variant
    of this head dim (bwd_only: only these Hopper backward studies beside the shipped kernel),
    each checked against the shipped kernel's output first; same[version]: whether the
    backward's bytes repeat over 3 calls."""
    import cupy as cp
    ops = variant_backend()
    rng = cp.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((B, H, T, D), dtype=cp.float32).astype(cp.float16) for _ in range(4))
    res = {}
    ops.use = {}
    out, lse = ops.attention_forward(q, k, v)
    grads = ops.attention_backward(do, q, k, v, out, lse)
    on_hopper = ops.hopper
    for ver, hop in forward_versions(ops, D) if fwd_variants else [("shipped", on_hopper)]:
        ops.use = {"fwd": ver if ver != "fa2" else "shipped"}
        ops.hopper = hop
        ops.tma = ver == "shipped"          # a wgmma kernel by name: the TMA forward stands aside
        o2, _ = ops.attention_forward(q, k, v)
        assert close(o2, out), f"forward {ver} d{D} differs from the shipped kernel"
        res[("fwd", ver)] = median_ms_cupy(lambda: ops.attention_forward(q, k, v))
    ops.hopper, ops.tma = on_hopper, True
    # on Hopper "shipped" is the wgmma backward and "fa2" FlashAttention-2's, timed beside it
    hop_bwd = [v for (v, d) in HOPPER_BWD_VARIANTS if d == D and (bwd_only is None or v in bwd_only)] if on_hopper else []
    fa2_bwd = [v for (v, d) in VARIANTS_BWD if d == D] if bwd_only is None else []
    for ver in ["shipped"] + (["fa2"] if on_hopper and bwd_only is None else []) + hop_bwd + fa2_bwd:
        ops.use = {"bwd": ver if ver != "fa2" else "shipped"}
        ops.hopper = on_hopper and (ver == "shipped" or ver in hop_bwd)
        g2 = ops.attention_backward(do, q, k, v, out, lse)
        real_dq = HOPPER_BWD_VARIANTS.get((ver, D), (None, True))[1]   # "nodq": dK, dV only
        checked = list(zip(g2, grads))[0 if real_dq else 1:]
        assert all(close(a, b) for a, b in checked), f"backward {ver} d{D} differs from the shipped kernel"
        if ver in SAME_BITS and not all(cp.asnumpy(a).tobytes() == cp.asnumpy(b).tobytes() for a, b in zip(g2, grads)):
            print(f"   FAIL: backward {ver} d{D} is not the shipped kernel's bytes", flush=True)
            if same is not None:
                same[ver + " (as shipped)"] = False
        if same is not None:
            first = [cp.asnumpy(a).tobytes() for a in g2]
            same[ver] = all([cp.asnumpy(a).tobytes() for a in ops.attention_backward(do, q, k, v, out, lse)] == first
                            for _ in range(2))
        res[("bwd", ver)] = median_ms_cupy(lambda: ops.attention_backward(do, q, k, v, out, lse))
    ops.use = {}
    ops.hopper = on_hopper
    res[("fwd", "default")] = res[("fwd", "shipped")]
    res[("bwd", "default")] = res[("bwd", "shipped")]
    return res


def tma(B, H, T, D):
    """The TMA-fed forwards (cuda_ops.TMA_FWD_KERNELS) of head dim D beside the wgmma forward
    (FLASH_FWD_HOPPER's, shipped before them), on the same q, k, v: -> {version: ms}; each checked
    first (at the wgmma kernel's key tile the same bytes, else equal to fp16 rounding)."""
    import cupy as cp
    from bytemodel.ops import cuda_ops
    ops = variant_backend()
    ops.use = {}
    if not ops.hopper:
        raise SystemExit("error: --tma runs the Hopper kernels: a GPU of compute capability 9.x")
    rng = cp.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, H, T, D), dtype=cp.float32).astype(cp.float16) for _ in range(3))
    tma_on, cuda_ops.FLASH_FWD_TMA = cuda_ops.FLASH_FWD_TMA, {}
    try:
        out, lse = ops.attention_forward(q, k, v)
        res = {"wgmma": median_ms_cupy(lambda: ops.attention_forward(q, k, v))}
    finally:
        cuda_ops.FLASH_FWD_TMA = tma_on
    qq, qs = ops._bhtd(q)
    kk, ks = ops._bhtd(k)
    vv, vs = ops._bhtd(v)
    shipped_bn = cuda_ops.HOPPER_FWD_KERNELS[cuda_ops.FLASH_FWD_HOPPER[D]][2]
    for name, (d, BM, BN, *_rest) in cuda_ops.TMA_FWD_KERNELS.items():
        if d != D:
            continue
        kern = ops._tma_kernel(name)
        obuf = ops._empty((B, T, H, D))
        o2 = obuf.transpose(0, 2, 1, 3)
        l2 = cp.empty((B, H, T), dtype=cp.float32)
        os_ = ops._strides(o2)

        def call():
            ops._attention_forward_tma(kern, qq, qs, kk, ks, vv, vs, o2, os_, l2)
        call()
        same = bool(cp.array_equal(o2, out) and cp.array_equal(l2, lse))
        if BN == shipped_bn and not same:
            raise SystemExit(f"error: {name} is not the wgmma forward's bytes at {B},{H},{T},{D}")
        assert close(o2, out), f"forward {name} d{D} differs from the wgmma kernel"
        shipped = " (shipped)" if cuda_ops.FLASH_FWD_TMA.get(D) == name else ""
        res[name + shipped + (" (same bytes)" if same else "")] = median_ms_cupy(call)
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
    ap.add_argument("--shipped-forward", action="store_true", help="time only the shipped forward (the backward's studies)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--profile", metavar="VERSION", help="no timing: the checked calls of the backward VERSION "
                    "(shipped or a study) or of the forward (fwd) at the first shape, for a profiler")
    ap.add_argument("--calls", type=int, default=4, help="with --profile: the calls after the checks")
    ap.add_argument("--bwd-versions", help="comma-separated: time only these Hopper backward studies beside "
                    "the shipped kernel (no FlashAttention-2 backward)")
    ap.add_argument("--tma", action="store_true", help="only the forward: the TMA-fed kernels (cuda_ops."
                    "TMA_FWD_KERNELS) beside the wgmma forward they replaced and SDPA's")
    a = ap.parse_args()
    try:
        shapes = [tuple(int(x) for x in s.split(",")) for s in a.shapes] if a.shapes else SHAPES
    except ValueError:
        raise SystemExit(f"error: --shapes takes B,H,T,D each, got {' '.join(a.shapes)}")
    if any(len(s) != 4 for s in shapes):
        raise SystemExit(f"error: --shapes takes B,H,T,D each, got {' '.join(a.shapes)}")
    if a.profile:
        B, H, T, D = shapes[0]
        if a.profile not in ("shipped", "fwd") and (a.profile, D) not in HOPPER_BWD_VARIANTS:
            known = sorted(v for v, d in HOPPER_BWD_VARIANTS if d == D)
            raise SystemExit(f"error: no backward version {a.profile!r} at head dim {D}; known: shipped, fwd, {', '.join(known)}")
        profile(B, H, T, D, a.profile, a.calls)
        return
    if a.tma:
        rows = []
        for B, H, T, D in shapes:
            fl = 4.0 * B * H * T * T * D / 2
            res = tma(B, H, T, D)
            r = {"shape": [B, H, T, D], "tflops": {k: fl / ms / 1e9 for k, ms in res.items()}}
            if not a.no_torch:
                r["tflops"]["SDPA"] = fl / sdpa(B, H, T, D)[0] / 1e9
            sd = r["tflops"].get("SDPA")
            print(f"forward {B},{H},{T},{D} TFLOP/s: " + ", ".join(
                f"{k} {x:.1f}" + (f" ({x / sd:.2f}x SDPA)" if sd and k != "SDPA" else "") for k, x in r["tflops"].items()),
                flush=True)
            rows.append(r)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
    rows = []
    print(f"{'B,H,T,D':>18} | {'ours fwd':>9} {'bwd':>7} | {'SDPA fwd':>9} {'bwd':>7} | TFLOP/s; ratio fwd/bwd")
    for B, H, T, D in shapes:
        fl = 4.0 * B * H * T * T * D / 2
        same = {}
        only = set(a.bwd_versions.split(",")) if a.bwd_versions else None
        res = ours(B, H, T, D, same, fwd_variants=not a.shipped_forward, bwd_only=only)
        of, ob = res[("fwd", "default")], res[("bwd", "default")]
        r = dict(shape=[B, H, T, D], ours_fwd_ms=of, ours_bwd_ms=ob,
                 ours_fwd_tflops=fl / of / 1e9, ours_bwd_tflops=2.5 * fl / ob / 1e9,
                 versions={f"{p} {v}": (fl if p == "fwd" else 2.5 * fl) / ms / 1e9
                           for (p, v), ms in res.items() if v != "default"}, same_bits=same)
        print("   versions (TFLOP/s): " + ", ".join(f"{k} {x:.1f}" for k, x in r["versions"].items()))
        print("   backward bytes repeat over 3 calls: " + ", ".join(f"{k} {'yes' if x else 'NO'}" for k, x in same.items()))
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
