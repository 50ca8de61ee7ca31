"""The CUDA twins of ops/scatter_ops (kernels: gpu/scatter.cu, gpu/mixer.cu).

    add_rows(out (R, ...) device, idx (n,) int, vals (n, ...), mask (n,) bool or None) -> None
    add_ones(out (R,) uint16 or int64, idx, mask) / put_last(out (R,) int64, idx, vals) /
    claim_rows(check (R,) uint16, idx, chk, mask, (table (R, A) uint16, total (R,) int64)) -> None
    context_keys(hist, t, active, depth, A, dist, off, salts) -> (back, keys): ContextMix2._keys

add_rows: each row's values are added to it in index order by one thread per row and column, after
a sort of the unique keys row * n + i: np.add.at's sequence of additions, so its bits on the same
inputs, every run. Types: float64, float32, int64, int32, uint16 (out's; vals are cast to it, as
np.add.at casts). (A scan with no sort, one thread per cell walking every i, was tried for the
mixer's small weight tables and measured slower on the H200: 937 against ~150 us at 14,336 values
into 168 cells, 140 against 94 at 2,048 into 4,496; benchmarks/README.md.) The rest give integer
results, so they use atomics and still give the references' bits (ops/scatter_ops.py's module doc).
"""
from __future__ import annotations

import numpy as np
import cupy as cp

from .gpu_source import MIXER_OPTIONS, SCATTER_KINDS as _KINDS, scatter_options, source

_MODULES: dict = {}
_THREADS = 256


def _fn(dtype):
    kind = _KINDS[np.dtype(dtype)]
    if kind not in _MODULES:
        _MODULES[kind] = cp.RawModule(code=source("scatter.cu"), options=scatter_options(kind))
    return _MODULES[kind].get_function("add_rows")


def _mixer(name):
    if "mixer" not in _MODULES:
        _MODULES["mixer"] = cp.RawModule(code=source("mixer.cu"), options=MIXER_OPTIONS)
    return _MODULES["mixer"].get_function(name)


def _grid(n):
    return ((int(n) + _THREADS - 1) // _THREADS,), (_THREADS,)


def _mask(mask, n):
    """(mask array, has_mask) for the kernels: a bool array, or a dummy with has_mask 0."""
    if mask is None:
        return _no_mask(), np.int32(0)
    m = cp.ascontiguousarray(cp.asarray(mask))
    if m.dtype != cp.bool_ or m.shape != (n,):
        raise ValueError("mask must be (n,) bool")
    return m, np.int32(1)


def _ints(idx):
    """idx as a C-contiguous int64 device array (what the kernels index with)."""
    return cp.ascontiguousarray(cp.asarray(idx).astype(cp.int64, copy=False))


_CACHE: dict = {}     # per device: the dummy mask, and one scratch per resting value


def _no_mask():
    key = ("mask", cp.cuda.Device().id)
    if key not in _CACHE:
        _CACHE[key] = cp.zeros(1, dtype=cp.bool_)
    return _CACHE[key]


def _scratch(R, rest):
    """An int32 scratch of at least R slots at its resting value `rest`, kept between calls (each
    call restores the slots it takes): one per resting value and device, grown to the largest R
    asked, so memory stays at one table's worth however many sizes pass through."""
    key = ("scratch", int(rest), cp.cuda.Device().id)
    have = _CACHE.get(key)
    if have is None or have.shape[0] < int(R):
        _CACHE[key] = have = cp.full(int(R), rest, dtype=cp.int32)
    return have


_MAX_REST, _MIN_REST = -1, np.iinfo(np.int32).max


def add_ones(out, idx, mask=None) -> None:
    """out[idx[i]] += 1 where mask[i] (scatter_ops.add_ones): uint16 (wrapping) or int64, by atomics."""
    n = int(idx.shape[0])
    if n == 0:
        return
    kind = {np.dtype(np.uint16): "add_ones_u16", np.dtype(np.int64): "add_ones_i64"}.get(np.dtype(out.dtype))
    if kind is None or not out.flags.c_contiguous:
        raise TypeError(f"add_ones: out must be C-contiguous uint16 or int64, got {out.dtype}")
    m, has = _mask(mask, n)
    i = _ints(idx)
    _mixer(kind)(*_grid(n), (out, i, m, has, np.int64(n)))


def put_last(out, idx, vals) -> None:
    """out[idx[i]] = vals[i], the last i of a repeated row kept (scatter_ops.put_last): int64 out."""
    n = int(idx.shape[0])
    if n == 0:
        return
    if np.dtype(out.dtype) != np.int64 or out.ndim != 1:
        raise TypeError("put_last: out must be (R,) int64")
    i = _ints(idx)
    v = cp.ascontiguousarray(cp.asarray(vals, dtype=cp.int64))
    sc = _scratch(out.shape[0], _MAX_REST)
    m, has = _mask(None, n)
    _mixer("claim")(*_grid(n), (i, m, has, sc, np.int32(1), np.int64(n)))
    _mixer("put_won_i64")(*_grid(n), (out, i, v, sc, np.int64(n)))
    _mixer("release")(*_grid(n), (i, m, has, sc, np.int32(_MAX_REST), np.int64(n)))


def claim_rows(check, idx, chk, mask, cleared=()) -> None:
    """Rows idx[i] where mask[i] zeroed in `cleared` ((table (R, A) uint16, total (R,) int64), or
    nothing) and given to their first claimant: check[row] = chk[i] (scatter_ops.claim_rows)."""
    n = int(idx.shape[0])
    if n == 0:
        return
    if np.dtype(check.dtype) != np.uint16 or np.dtype(chk.dtype) != np.uint16:
        raise TypeError("claim_rows: check and chk must be uint16")
    i = _ints(idx)
    m, has = _mask(cp.ones(n, dtype=cp.bool_) if mask is None else mask, n)
    if cleared:
        table, total = cleared
        if np.dtype(table.dtype) != np.uint16 or np.dtype(total.dtype) != np.int64 or not table.flags.c_contiguous:
            raise TypeError("claim_rows: cleared must be (table uint16 (R, A), total int64 (R,))")
        A = int(table.shape[1])
        _mixer("zero_rows")(*_grid(n * A), (table, total, i, m, np.int64(n), np.int64(A)))
    sc = _scratch(check.shape[0], _MIN_REST)
    _mixer("claim")(*_grid(n), (i, m, has, sc, np.int32(0), np.int64(n)))
    _mixer("put_won_u16")(*_grid(n), (check, i, cp.ascontiguousarray(chk), sc, np.int64(n)))
    _mixer("release")(*_grid(n), (i, m, has, sc, np.int32(_MIN_REST), np.int64(n)))


def context_keys(hist, t: int, active: int, depth: int, A: int, dist, off, salts, P):
    """ContextMix2._keys on the device: hist (S, steps + 1) int32; dist, off (int64): each hashed
    context's token distances, flattened, and where each starts (nm + 1); salts (nm,) uint64; P the
    hash's multiplier -> (back (active, depth + 1) int64, keys (active, nm) uint64)."""
    nm = int(salts.shape[0])
    back = cp.empty((active, depth + 1), dtype=cp.int64)
    keys = cp.empty((active, nm), dtype=cp.uint64)
    if active:
        if hist.dtype != cp.int32 or not hist.flags.c_contiguous:
            raise TypeError("context_keys: hist must be C-contiguous int32")
        _mixer("context_keys")(*_grid(active), (hist, np.int64(hist.shape[1]), np.int64(t), np.int64(active),
                                                np.int32(depth), np.int64(A), dist, off, salts, np.int32(nm),
                                                np.uint64(P), back, keys))
    return back, keys


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
