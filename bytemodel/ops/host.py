"""Host maths: what every engine computes on the CPU in float64, whatever its backend.

The backends' ops (numpy_ops, cuda_ops) run the layers; this module holds the arithmetic that
stays on the host for every device, so a CPU and a GPU run agree on it bit for bit:
    rope_tables   the RoPE angles' cosines and sines (made on the host, then copied to the device)
    log_probs     a float64 log-softmax of host logits (sampling, scoring, the compressor's figures)
RoPE, rotate-half convention (as Llama): with x = [x1, x2] split along D,
    out = [x1*cos - x2*sin, x2*cos + x1*sin],  angle(t, i) = pos_t * theta^(-2i/D)
"""
from __future__ import annotations

import numpy as np


def rope_tables(positions, D, theta, dtype):
    """positions (T,) int -> cos, sin (T, D/2), computed in float64 then cast."""
    inv_freq = theta ** (-np.arange(0, D // 2, dtype=np.float64) * 2.0 / D)   # (D/2,)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def log_probs(logits) -> np.ndarray:
    """Host logits (..., V) of any float dtype -> log-probabilities in float64 (numpy_ops.log_softmax)."""
    from .numpy_ops import log_softmax
    return log_softmax(np.asarray(logits).astype(np.float64))
