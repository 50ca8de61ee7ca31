"""The decode attention (gpu/decode.cu dec_attn_d* / dec_attn_act_d*: one new query per (sequence,
head) over its cache) against the same math as CuPy expressions and, where PyTorch is importable,
its scaled_dot_product_attention on the same buffers.

    python benchmarks/kernels/decode_attn.py [--presets small base] [--precision fp16] [--json f]

Cases per preset (H heads of D = C / H, the cache S = the preset's context, n keys filled):
  batch1   1 sequence at n = S / 2, split over blocks as the kernel path splits it (Decoder's rule:
           the splits cover the SMs twice, at least 64 keys each), the last block merging
  gen64    64 sequences at n = 300, one split (the captured cuBLAS step's call, dec_attn_act), and
           the same split in 2 and 4 (gen64/2, gen64/4: does splitting the keys pay at 64?)
  lockstep 8,192 streams of a 256-token window, full, one split (the compressor's default layout
           on a 10 MB file)
Bytes counted: the n keys and values of every (sequence, head) read once, q and the output. The
check: the first 8 (sequence, head) rows against a float64 softmax on the same rounded cache,
norm-relative (fp32 accumulation over <= 1,024 keys: 1e-5; the act_t output's rounding: TOL).
"""
from __future__ import annotations

import math

import numpy as np

from _bench import TOL, check, main, median_ms, row

CASES = (("batch1", 1, None, None), ("gen64", 64, 300, 1), ("gen64/2", 64, 300, 2), ("gen64/4", 64, 300, 4),
         ("lockstep", 8192, 256, 1))   # (name, sequences, keys filled, splits: None = the kernel path's rule)
CHECK_ROWS = 8


def _torch():
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def run(ops, preset, shape):
    import cupy as cp
    from bytemodel.ops.cuda_ops import _module, _scale_log2
    _, ctx, C, _, H = shape
    D, K = C // H, H
    mod = _module("decode.cu", ops.precision)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    torch = _torch()
    rows = []
    rng = np.random.default_rng(0)
    cp.random.seed(0)
    for name, B, n, NS in CASES:
        S = ctx if n is None else n if name == "lockstep" else ctx
        n = S // 2 if n is None else n
        NS = max(1, min(math.ceil(S / 64), math.ceil(2 * sms / (B * H)))) if NS is None else NS
        CH = math.ceil(S / NS)
        kc = ops._act(cp.random.standard_normal((B, K, S, D), dtype=cp.float32))   # made on the device:
        vc = ops._act(cp.random.standard_normal((B, K, S, D), dtype=cp.float32))   # lockstep's is 3 GB a side
        qh = rng.standard_normal((B * H, D), dtype=np.float32)
        qf, qa = cp.asarray(qh), ops._act(qh)
        state = cp.asarray(np.array([n - 1, 0, 0, 0], dtype=np.int32))
        part = cp.zeros((max(1, B * H * NS * (D + 2)),), dtype=cp.float32)
        tickets = cp.zeros((B * H,), dtype=cp.int32)
        att = cp.zeros((B * H, D), dtype=cp.float32)
        out = ops._act(np.zeros((B * H, D), dtype=np.float32))
        sl, i32 = np.float32(_scale_log2(D)), np.int32
        if name.startswith("gen64"):
            fn, what = mod.get_function(f"dec_attn_act_d{D}"), "dec_attn_act"
            args = (qa, np.int64(H * D), np.int64(D), kc, vc, part, tickets, out, state, i32(H), i32(K), i32(S),
                    i32(CH), sl)
            res = out
        else:
            fn, what = mod.get_function(f"dec_attn_d{D}"), "dec_attn"
            args = (qf, kc, vc, part, tickets, att, state, i32(H), i32(K), i32(S), i32(CH), sl)
            res = att

        def ours():
            fn((B * H, NS), (128,), args)
        ours()
        # float64 on the first rows: the same rounded cache, q as the kernel read it
        qq = (ops.to_numpy(qa) if name.startswith("gen64") else qh).astype(np.float64)
        want = np.zeros((CHECK_ROWS, D))
        for r in range(CHECK_ROWS):
            b, h = divmod(r, H)
            k64 = ops.to_numpy(kc[b, h, :n]).astype(np.float64)
            v64 = ops.to_numpy(vc[b, h, :n]).astype(np.float64)
            s = k64 @ qq[r] / math.sqrt(D)
            p = np.exp(s - s.max())
            want[r] = p @ v64 / p.sum()
        tol = TOL[ops.precision] if name.startswith("gen64") else 1e-5
        err = check(f"{what} {name}", ops.to_numpy(res[:CHECK_ROWS]).astype(np.float64), want, tol)

        kv, vv = kc[:, :, :n], vc[:, :, :n]
        q4 = qa.reshape(B, H, 1, D)

        def peer():
            s = cp.matmul(q4.astype(cp.float32), kv.astype(cp.float32).transpose(0, 1, 3, 2)) / math.sqrt(D)
            s = cp.exp(s - s.max(axis=-1, keepdims=True))
            return cp.matmul(s / s.sum(axis=-1, keepdims=True), vv.astype(cp.float32))
        nbytes = B * K * n * D * 2 * kc.dtype.itemsize + B * H * D * (4 + res.dtype.itemsize)
        if B * K * n * D * 4 * 2 < 16 << 30:       # the CuPy peer's fp32 copies of the cache fit
            rows.append(row(f"{what} {name}", preset, (B, H, n, D), median_ms(ours), median_ms(peer), nbytes=nbytes,
                            err=err))
        else:
            rows.append(row(f"{what} {name}", preset, (B, H, n, D), median_ms(ours), None, nbytes=nbytes, err=err))
        if torch is not None and ops.precision == "fp16":   # (bf16's CuPy dtype has no DLPack code)
            tq = torch.from_dlpack(q4)
            tk, tv = torch.from_dlpack(kc)[:, :, :n], torch.from_dlpack(vc)[:, :, :n]
            sdpa = torch.nn.functional.scaled_dot_product_attention

            def tpeer():
                sdpa(tq, tk, tv)
            rows.append(row(f"{what} {name}", preset, (B, H, n, D), median_ms(ours), median_ms(tpeer), nbytes=nbytes,
                            err=err, peer="SDPA"))
    return rows


if __name__ == "__main__":
    main(run, __doc__)
