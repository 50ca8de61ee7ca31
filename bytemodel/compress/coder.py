"""Probabilities -> the range coder's integer frequencies, and the coder itself (the `constriction`
package, an optional dependency imported only here)."""
from __future__ import annotations

import numpy as np

from ..errors import CompressError

PREC_BITS = 24               # frequencies sum to 2^24: constriction's range coder precision
TOTAL = 1 << PREC_BITS


def _coder():
    try:
        import constriction
    except ImportError:
        raise CompressError("compression needs the constriction package: pip install 'bytemodel[compress]'") from None
    return constriction


def _coder_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("constriction")
    except PackageNotFoundError:
        return "unknown"


def quantise(logits, alphabet: int, xp=np):
    """logits (B, >= alphabet) -> frequencies (B, alphabet) int64, each >= 1, each row summing to 2^24.

    Softmax over the first `alphabet` logits in float64; floor(p * (2^24 - alphabet)) + 1; the
    rounding remainder (>= 0) goes to the first likeliest symbol. xp: numpy or cupy.
    """
    z = logits[:, :alphabet].astype(xp.float64)
    z -= z.max(axis=1, keepdims=True)
    p = xp.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    f = xp.floor(p * (TOTAL - alphabet)).astype(xp.int64) + 1
    rows = xp.arange(f.shape[0])
    f[rows, xp.argmax(f, axis=1)] += TOTAL - f.sum(axis=1)
    return f
