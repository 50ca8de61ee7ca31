"""Attention dropout on the GPU (flash_fwd_d*_drop, flash_bwd_d*_drop of gpu/flash_attn.cu; on Hopper
at head dims 64 and 128 flash_fwd_h*_drop, flash_bwd_h*_drop of gpu/flash_hopper.cu): the
FlashAttention forward and backward with the mask drawn inside (p = 0.1) against the same kernels
without dropout, at each preset's attention shape, in the same run.

    PYTHONPATH=. python benchmarks/kernels/attn_dropout.py [--presets small base] [--precision bf16]

Shape: (B, H, T, D) with the preset's batch, heads, context and head dim (_bench.PRESETS);
causal, K = H. Check first, on a small shape (2, 4, 200, D): out and the three gradients against
numpy_ops in float64 with the same drop (tests/test_cuda_attn_dropout.py's tolerances), then the
forward's kept pattern against numpy_ops.attn_keep (V one-hot on the first D keys: exact zeros
where dropped). Timing: _bench.median_ms (3 warm-ups, median of 20 samples of 10 calls, CUDA
events). TFLOP/s counted as flash_attn.py's (forward 4 B H T^2 D / 2, backward 2.5x); the ratio
is (time without dropout) / (time with it): below 1 is the cost. On Hopper the forward without
dropout is now the TMA-fed kernel (cuda_ops.FLASH_FWD_TMA) and with dropout the wgmma _drop twin
until cuda_ops.TMA_DROP is on: the ratio is then what a run pays, not the same kernel's two forms.
"""
from __future__ import annotations

import math
import sys

import numpy as np

import _bench  # (benchmarks/kernels/_bench.py: the shared CUDA-event timer)

P = 0.1
TOL = {"fp16": (4e-3, 1e-2), "bf16": (3.2e-2, 8e-2), "fp32": (1e-4, 1e-4)}   # (out, grads): tests/test_cuda_attn_dropout.py


def check(ops, D: int, precision: str) -> float:
    import cupy as cp
    from bytemodel.model import dropout_key
    from bytemodel.ops import numpy_ops as ref
    rng = np.random.default_rng(0)
    B, H, T = 2, 4, 200
    drop = (P, dropout_key(0, 1, 1 << 40), 0)
    q, k, v, d = (_bench.rnd(ops, rng, (B, H, T, D)) for _ in range(4))
    out, lse = ops.attention_forward(q[1], k[1], v[1], drop=drop)
    o_ref, _ = ref.attention_forward(q[0], k[0], v[0], drop=drop)
    to, tg = TOL[precision]
    err = _bench.check("attention_forward drop", out, o_ref, to)
    grads = ops.attention_backward(d[1], q[1], k[1], v[1], out, lse, drop=drop)
    refs = ref.attention_backward(d[0], q[0], k[0], v[0], _bench.host(out), _bench.host(lse), drop=drop)
    for name, g, r in zip(("dq", "dk", "dv"), grads, refs):
        err = max(err, _bench.check(f"attention_backward drop {name}", g, r, tg))
    one = np.zeros((B, H, T, D))
    one[:, :, :D, :D] = np.eye(D)
    small = cp.asarray((0.3 * q[0]).astype(ops.act_dtype))
    o1, _ = ops.attention_forward(small, small, cp.asarray(one.astype(ops.act_dtype)), drop=drop)
    keep = ref.attn_keep(drop, B, H, T, T, 0, T, T)[0][..., :D] & np.tril(np.ones((T, D), dtype=bool))
    if not np.array_equal(_bench.host(o1)[..., :D] != 0, keep):
        print("error: the forward's kept pattern differs from numpy_ops.attn_keep")
        sys.exit(1)
    return err


def run(ops, preset, shape):
    import cupy as cp
    from bytemodel.model import dropout_key
    B, T, C, _, H = shape
    D = C // H
    err = check(ops, D, ops.precision)
    rng = cp.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((B, H, T, D), dtype=cp.float32).astype(ops.act_dtype) for _ in range(4))
    drop = (P, dropout_key(0, 1, 1 << 40), 0)
    fl = 4.0 * B * H * T * T * D / 2
    rows = []
    times = {}
    for name, dr in (("none", None), ("drop", drop)):
        out, lse = ops.attention_forward(q, k, v, drop=dr)
        times["fwd", name] = _bench.median_ms(lambda: ops.attention_forward(q, k, v, drop=dr))
        times["bwd", name] = _bench.median_ms(lambda: ops.attention_backward(do, q, k, v, out, lse, drop=dr))
    for kind, f in (("fwd", fl), ("bwd", 2.5 * fl)):
        rows.append(_bench.row(f"attention_{kind} p={P}", preset, (B, H, T, D), times[kind, "drop"],
                               times[kind, "none"], flops=f, err=err, peer="no dropout"))
    tot_none, tot_drop = times["fwd", "none"] + times["bwd", "none"], times["fwd", "drop"] + times["bwd", "drop"]
    rows.append(_bench.row(f"attention fwd+bwd p={P}", preset, (B, H, T, D), tot_drop, tot_none,
                           flops=3.5 * fl, err=err, peer="no dropout"))
    assert math.isfinite(tot_drop)
    return rows


if __name__ == "__main__":
    _bench.main(run, __doc__)
