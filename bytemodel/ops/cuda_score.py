"""The CUDA twin of ops/score_ops.window_nll (kernel: gpu/score.cu, one block per window).

    window_nll(logits (B, L, Vl) device, targets (B, L) int, mask (B, L) 0/1 or None, vocab)
        -> (B,) float64 device array

Float32 log-softmax over the first `vocab` columns, float64 sums, in a fixed order (the same
result every run). The caller copies the B sums to the host: the logits never leave the device.
"""
from __future__ import annotations

import numpy as np
import cupy as cp

from .cuda_ops import _module

_WARPS = 16   # SCORE_WARPS in gpu/score.cu: one block of 16 warps per window


def _precision(dtype) -> str:
    if dtype == np.float16:
        return "fp16"
    if dtype == np.float32:
        return "fp32"
    if dtype.name == "bfloat16":
        return "bf16"
    raise TypeError(f"window_nll: logits of dtype {dtype} (fp16, bf16 or fp32)")


def window_nll(logits, targets, mask, vocab: int):
    """logits (B, L, Vl) -> (B,) float64 on the device (see ops/score_ops.py)."""
    logits = cp.ascontiguousarray(cp.asarray(logits))
    B, L, Vl = logits.shape
    if not 0 < vocab <= Vl:
        raise ValueError(f"window_nll: vocab {vocab} outside 1..{Vl}")
    t = cp.ascontiguousarray(cp.asarray(targets), dtype=cp.int32).reshape(B * L)
    m = np.uint64(0) if mask is None else cp.ascontiguousarray(cp.asarray(mask) != 0, dtype=cp.uint8).reshape(B * L)
    out = cp.empty((B,), dtype=cp.float64)
    fn = _module("score.cu", _precision(logits.dtype)).get_function("score_window_nll")
    if B:
        fn((B,), (_WARPS * 32,), (logits, t, m, out, np.int32(L), np.int32(Vl), np.int32(vocab)))
    return out
