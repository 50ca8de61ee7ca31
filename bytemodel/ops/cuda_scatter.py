"""The CUDA twin of ops/scatter_ops.add_rows (kernel: gpu/scatter.cu).

    add_rows(out (R, ...) device, idx (n,) int, vals (n, ...), mask (n,) bool or None) -> None

Each row's values are added to it in index order by one thread per row and column, after a sort
of the unique keys row * n + i: the bits of np.add.at on the same inputs, every run. Types:
float64, float32, int64, int32, uint16 (out's; vals are cast to it, as np.add.at casts).
"""
from __future__ import annotations

import numpy as np
import cupy as cp

from .cuda_ops import _source

_KINDS = {np.dtype(np.float64): 0, np.dtype(np.float32): 1, np.dtype(np.int64): 2, np.dtype(np.int32): 3,
          np.dtype(np.uint16): 4}          # gpu/scatter.cu's VAL_KIND of each type
_MODULES: dict = {}
_THREADS = 256


def _fn(dtype):
    kind = _KINDS[np.dtype(dtype)]
    if kind not in _MODULES:
        _MODULES[kind] = cp.RawModule(code=_source("scatter.cu"), options=("-std=c++17", f"-DVAL_KIND={kind}"))
    return _MODULES[kind].get_function("add_rows")


def add_rows(out, idx, vals, mask=None) -> None:
    """out[idx[i]] += vals[i] in the order of i (see ops/scatter_ops.py); out is changed in place."""
    if np.dtype(out.dtype) not in _KINDS:
        raise TypeError(f"add_rows: out of dtype {out.dtype}")
    if not out.flags.c_contiguous:
        raise ValueError("add_rows: out must be C-contiguous")
    n = int(idx.shape[0])
    if n == 0:
        return
    R = int(out.shape[0])
    m = int(np.prod(out.shape[1:], dtype=np.int64))
    idx = cp.asarray(idx).astype(cp.int64, copy=False)
    if mask is not None:
        idx = cp.where(cp.asarray(mask), idx, R)          # masked: row R, sorted last, skipped
    key = cp.sort(idx * n + cp.arange(n, dtype=cp.int64))
    v = cp.ascontiguousarray(cp.broadcast_to(cp.asarray(vals, dtype=out.dtype), (n,) + out.shape[1:]))
    total = n * m
    _fn(out.dtype)(((total + _THREADS - 1) // _THREADS,), (_THREADS,),
                   (key, v, out, np.int64(n), np.int64(m), np.int64(R)))
