"""Scatters in a fixed order, so that a mixer's state is the same bits on every run and device.

    add_rows(out (R, ...), idx (n,) int, vals (n, ...), mask (n,) bool or None) -> None
        out[idx[i]] += vals[i] for each i (where mask[i]), one after the other in i's order
    first_of_each(idx (n,) int, xp) -> (keys (u,), at (u,)): each distinct idx, sorted, and
        the position of its first occurrence
    last_of_each(idx, xp) -> the same with the last occurrence

add_rows is np.add.at, whose repeated rows add up in index order: for float64 that order is
the result's bits. `for_xp(xp)` gives the add_rows of an array module: this NumPy reference, or
its CUDA twin (ops/cuda_scatter.py, gpu/scatter.cu), which adds each row's values in the same
order (one thread per row and column) and so gives the same bits; CuPy's own scatter_add uses
atomics, whose order, and so whose float sums, change from run to run. first_of_each and
last_of_each are written once for either module (a sort of unique keys idx * n + i: no
stability assumed).
"""
from __future__ import annotations

import numpy as np


def add_rows(out, idx, vals, mask=None) -> None:
    """out[idx[i]] += vals[i], in the order of i (rows repeat: they add up); mask: only where True."""
    vals = np.broadcast_to(np.asarray(vals, dtype=out.dtype), idx.shape + out.shape[1:])
    if mask is not None:
        idx, vals = idx[mask], vals[mask]
    np.add.at(out, idx, vals)


def first_of_each(idx, xp=np):
    """-> (keys, at): the distinct values of idx (n,), ascending, and where each first occurs."""
    n = len(idx)
    key = idx.astype(np.int64) * max(n, 1) + xp.arange(n, dtype=np.int64)
    key = xp.sort(key)
    rows = key // max(n, 1)
    start = xp.ones(n, dtype=bool)
    start[1:] = rows[1:] != rows[:-1]
    return rows[start], key[start] % max(n, 1)


def last_of_each(idx, xp=np):
    """-> (keys, at): the distinct values of idx, ascending, and where each last occurs."""
    n = len(idx)
    keys, at = first_of_each(idx[::-1], xp)
    return keys, (n - 1) - at


def for_xp(xp):
    """The add_rows of array module xp: this one for NumPy, the CUDA twin for CuPy."""
    if xp is np:
        return add_rows
    from .cuda_scatter import add_rows as cuda_add_rows
    return cuda_add_rows
