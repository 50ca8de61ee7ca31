"""Scatters in a fixed order, so that a mixer's state is the same bits on every run and device.

    add_rows(out (R, ...), idx (n,) int, vals (n, ...), mask (n,) bool or None) -> None
        out[idx[i]] += vals[i] for each i (where mask[i]), one after the other in i's order
    first_of_each(idx (n,) int, xp) -> (keys (u,), at (u,)): each distinct idx, sorted, and
        the position of its first occurrence
    last_of_each(idx, xp) -> the same with the last occurrence
    add_ones(out (R,) integer, idx (n,), mask) -> None: out[idx[i]] += 1 (where mask[i])
    put_last(out (R,), idx (n,), vals (n,)) -> None: out[idx[i]] = vals[i], a repeated row keeping the last i's
    claim_rows(check (R,), idx (n,), chk (n,), mask (n,), cleared) -> None: each row idx[i] where
        mask[i] zeroed in every array of `cleared` (R, ...) and its check set to the chk of its first such i

add_rows is np.add.at, whose repeated rows add up in index order: for float64 that order is
the result's bits. `for_xp(xp)` gives the add_rows of an array module: this NumPy reference, or
its CUDA twin (ops/cuda_scatter.py, gpu/scatter.cu), which adds each row's values in the same
order (one thread per row and column) and so gives the same bits; CuPy's own scatter_add uses
atomics, whose order, and so whose float sums, change from run to run. first_of_each and
last_of_each are written once for either module (a sort of unique keys idx * n + i: no
stability assumed). add_ones, put_last and claim_rows are a mixer's counts, match table and
claims (compress/mix3d.py): integer results, so their CUDA twins may use atomics (an integer sum
does not depend on its order; the last / first writer is chosen by the largest / smallest i) and
need no sort, and still give these bits.
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


def add_ones(out, idx, mask=None) -> None:
    """out[idx[i]] += 1 for each i (where mask[i]); out of an integer type, wrapping as NumPy does."""
    if mask is not None:
        idx = idx[mask]
    np.add.at(out, idx, out.dtype.type(1))


def put_last(out, idx, vals) -> None:
    """out[idx[i]] = vals[i] for each i; where idx repeats, the last i's value is the one kept."""
    keys, at = last_of_each(idx, np)
    out[keys] = vals[at]


def claim_rows(check, idx, chk, mask, cleared=()) -> None:
    """Rows changing hands: every row idx[i] with mask[i] is zeroed in each array of `cleared` and
    given to its first claimant: check[row] = chk[the first such i]."""
    rb = idx[mask]
    if len(rb):
        for a in cleared:
            a[rb] = 0
        owners, first = first_of_each(rb, np)
        check[owners] = chk[mask][first]


class Kit:
    """The scatters of one array module: this file's (NumPy) or their CUDA twins (ops/cuda_scatter.py)."""

    def __init__(self, add_rows, add_ones, put_last, claim_rows):
        self.add_rows, self.add_ones, self.put_last, self.claim_rows = add_rows, add_ones, put_last, claim_rows


def kit_for(xp) -> Kit:
    """The scatters of array module xp: NumPy's references here, or the CUDA twins for CuPy."""
    if xp is np:
        return Kit(add_rows, add_ones, put_last, claim_rows)
    from . import cuda_scatter as cs
    return Kit(cs.add_rows, cs.add_ones, cs.put_last, cs.claim_rows)


def for_xp(xp):
    """The add_rows of array module xp: this one for NumPy, the CUDA twin for CuPy."""
    return kit_for(xp).add_rows
