"""Dropout on the GPU (gpu/dropout.cu): the kernels against their peers, and what dropout costs a
training step at the base preset, measured in the same run.

    PYTHONPATH=. python benchmarks/kernels/dropout.py [--precision bf16] [--steps 20] [--json out.json]

1. Kernels at the base preset's activation (N = 32 x 1024 rows, C = 768): dropout_res_v8
   (out = residual + dropout(x), the forward of a residual branch) against add_v8 (out = a + b,
   what the branch costs without dropout), and dropout_mul_v8 (dx = dropout(dout), the backward)
   against a CuPy copy of the same array. Bytes counted: 3 arrays (res) or 2 (mul) of N x C
   activations. Each: 3 warm-ups, then the median of 20 samples of 10 back-to-back launches
   (CUDA events). The mask is checked against numpy_ops first (bit for bit).
2. A training step (zero grads, forward, backward, global norm, AdamW), base preset, batch 32 x
   1024, each of STEP_SETTINGS (residual / attention dropout: none, 0.1 / 0, the 0.2 / 0.2 that
   `--dropout auto` picks for little data, and on Hopper that again on FlashAttention-2's kernels,
   the path attention dropout took before the wgmma twins) in its own model of the same weights,
   timed in turns so drift hits all; the mean of `--steps` steps each over 3 rounds, after 2 warm-ups,
   CUDA events around each block of steps.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import _bench  # noqa: E402  (benchmarks/kernels/_bench.py: the shared CUDA-event timer)

INNER = 10


def median_ms(fn):
    return _bench.median_ms(fn, inner=INNER)


def kernels(precision: str) -> dict:
    import cupy as cp
    from bytemodel.model import dropout_key
    from bytemodel.ops import numpy_ops
    from bytemodel.ops.cuda_ops import CudaBackend
    ops = CudaBackend(precision)
    N, C = 32 * 1024, 768
    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal((N, C)).astype(np.float32)).astype(ops.act_dtype)
    r = cp.asarray(rng.standard_normal((N, C)).astype(np.float32)).astype(ops.act_dtype)
    key = dropout_key(0, 1, 2)
    out, cache = ops.dropout_forward(x, 0.1, key, 0, residual=r)
    keep = numpy_ops.dropout_keep(N * C, key, 0, 0.1).reshape(N, C)
    ones = cp.ones((N, C), dtype=ops.act_dtype)          # dropout of ones: 0 exactly where dropped
    assert np.array_equal(cp.asnumpy(ops.dropout_backward(ones, cache) != 0), keep), "mask differs from numpy_ops"
    nbytes = N * C * x.itemsize
    res = {
        "dropout_res_v8": median_ms(lambda: ops.dropout_forward(x, 0.1, key, 0, residual=r)),
        "add_v8": median_ms(lambda: ops.add(x, r)),
        "dropout_mul_v8": median_ms(lambda: ops.dropout_backward(x, cache)),
        "cupy_copy": median_ms(lambda: x.copy()),
    }
    out = {}
    for k, ms in res.items():
        arrays = 3 if k in ("dropout_res_v8", "add_v8") else 2
        out[k] = {"ms": ms, "GB_s": arrays * nbytes / ms / 1e6}
        print(f"{precision} {k:16s} {ms * 1e3:8.1f} us  {out[k]['GB_s']:7.0f} GB/s")
    print(f"{precision} dropout_res / add = {res['dropout_res_v8'] / res['add_v8']:.3f}; "
          f"dropout_mul / copy = {res['dropout_mul_v8'] / res['cupy_copy']:.3f}")
    del x, r, ones
    cp.get_default_memory_pool().free_all_blocks()
    return out


# the step's settings, timed in turns: (label, residual p, attention p, the wgmma attention kernels on Hopper)
STEP_SETTINGS = (("none", 0.0, 0.0, True), ("0.1 / 0", 0.1, 0.0, True), ("0.2 / 0.2", 0.2, 0.2, True),
                 ("0.2 / 0.2 on FA2", 0.2, 0.2, False))


def step_cost(precision: str, steps: int, rounds: int = 3) -> dict:
    import cupy as cp
    from bytemodel.config import preset
    from bytemodel.model import Dropout, Model
    from bytemodel.ops.cuda_ops import CudaBackend
    B, T = 32, 1024
    data = np.random.default_rng(0).integers(0, 256, size=(B, T + 1))
    idx, tgt = cp.asarray(data[:, :-1], dtype=cp.int32), cp.asarray(data[:, 1:], dtype=cp.int32)
    dl = cp.full(B * T, 1.0 / (B * T), dtype=cp.float32)
    t = {"n": 0}
    runs = {}
    for label, p, pa, hopper in STEP_SETTINGS:
        ops = CudaBackend(precision, hopper=hopper)
        if not hopper and not CudaBackend(precision).hopper:
            continue   # not a Hopper GPU: FA2 is every setting's path already
        model = Model(preset("base", dropout=p, dropout_attn=pa), ops)
        model.init_weights(0)
        runs[label] = (ops, model, cp.zeros_like(model.params), cp.zeros_like(model.params), model.decay_mask(),
                       p > 0 or pa > 0)

    def step(label):
        ops, model, m, v, mask, drops = runs[label]
        t["n"] += 1
        model.grads.fill(0)
        model.forward(idx, tgt, heads=True, drop=Dropout(0, t["n"]) if drops else None)
        model.backward(dl)
        nrm = ops.global_norm(model.grads)
        ops.adamw_step(model.params, model.grads, m, v, mask, lr=1e-5, beta1=0.9, beta2=0.95, eps=1e-8,
                       weight_decay=0.1, step=t["n"], clip=1.0, norm=nrm)

    def block(label):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        for _ in range(steps):
            step(label)
        e1.record()
        e1.synchronize()
        return cp.cuda.get_elapsed_time(e0, e1) / steps

    for _ in range(2):
        for label in runs:
            step(label)
    cp.cuda.Device().synchronize()
    times = {label: [] for label in runs}
    for _ in range(rounds):   # in turns, so drift hits every setting
        for label in runs:
            times[label].append(block(label))
    ms = {label: float(np.mean(x)) for label, x in times.items()}
    out = {}
    for label in runs:
        r = ms[label] / ms["none"]
        print(f"{precision} base step, batch {B}x{T}, dropout (residual / attention) {label:18s} {ms[label]:7.2f} ms, "
              f"{r:.4f} x none  (blocks {[round(x, 2) for x in times[label]]})")
        out[label] = {"ms": ms[label], "ratio": r, "blocks": times[label]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", nargs="*", default=["bf16"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    out = {}
    for p in a.precision:
        out[p] = {"kernels": kernels(p), "step": step_cost(p, a.steps)}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
