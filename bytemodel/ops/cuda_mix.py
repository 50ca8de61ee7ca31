"""The ctx3f mixer's kernels (gpu/mix_step.cu), compiled once per context count K.

    fn = kernel("mix_prepare", K)        # a cupy RawKernel; compress/mix3f.py launches them
    blocks(n) -> ((ceil(n / 256),), (256,))   one thread per item; THREADS a block per stream

Their NumPy reference is ctx3's arithmetic (compress/mix2.ContextMix3, and ctx3d on NumPy, which
is it bit for bit); the module doc of gpu/mix_step.cu says what each kernel is.
"""
from __future__ import annotations

import cupy as cp

from .cuda_ops import _source

THREADS = 256                     # gpu/mix_step.cu's block (its tree sums assume it)
_MODULES: dict = {}


def kernel(name: str, K: int):
    key = (int(K), cp.cuda.Device().id)
    if key not in _MODULES:
        _MODULES[key] = cp.RawModule(code=_source("mix_step.cu"), options=("-std=c++17", f"-DMIX_K={int(K)}"))
    return _MODULES[key].get_function(name)


def blocks(n: int):
    return ((max(1, (int(n) + THREADS - 1) // THREADS),), (THREADS,))
