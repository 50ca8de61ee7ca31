"""Scoring's one op: each window's summed negative log-likelihood, so only B numbers come back.

    window_nll(logits (B, L, Vl), targets (B, L) int, mask (B, L) 0/1 or None, vocab) -> (B,) float64

The first `vocab` columns of the logits count (the tokenizer's ids; Vl >= vocab). The
log-softmax and the target's gather are float32, each row's loss is summed in float64: the
bits of a 10 MB file are a sum of 10^7 terms, which float32 would round at the 1e-4 level.
This is the NumPy reference (the oracle); the CUDA twin with the same name and signature is
ops/cuda_score.py (gpu/score.cu). `for_backend(ops)` gives the one a backend computes with.
"""
from __future__ import annotations

import numpy as np


def window_nll(logits, targets, mask, vocab: int):
    """logits (B, L, Vl) -> (B,) float64: sum over counted targets of -log softmax(row[:vocab])[target]."""
    z = np.asarray(logits)[..., :vocab].astype(np.float32, copy=False)
    m = z.max(axis=-1, keepdims=True)                                     # (B, L, 1)
    lse = m[..., 0] + np.log(np.exp(z - m).sum(axis=-1))                  # (B, L) float32
    nll = lse - np.take_along_axis(z, np.asarray(targets)[..., None].astype(np.int64), -1)[..., 0]
    if mask is not None:
        nll = np.where(np.asarray(mask) != 0, nll, np.float32(0))
    return nll.astype(np.float64).sum(axis=1)


def for_backend(ops):
    """The window_nll that runs where `ops` computes: this one, or the CUDA twin."""
    if getattr(ops, "name", "") != "cuda":
        return window_nll
    from .cuda_score import window_nll as cuda_window_nll
    return cuda_window_nll
