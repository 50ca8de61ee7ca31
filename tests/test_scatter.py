"""ops/scatter_ops (the NumPy reference) against plain Python loops, and its CUDA twin
(ops/cuda_scatter.py) against the reference bit for bit in tests/test_mix_gpu.py. The values are chosen so that the order
of the additions shows in the float64 result (1e16 + 1 - 1e16 is 0 one way, 1 the other)."""
from __future__ import annotations

import numpy as np
import pytest

from bytemodel.ops import scatter_ops as so


def _case(rng, n=600, R=37, m=3):
    idx = rng.integers(0, R, n)
    vals = rng.choice([1e16, 1.0, -1e16, 0.5, 3.0], size=(n, m)) * rng.choice([1, -1], size=(n, m))
    out = rng.normal(size=(R, m))
    return out, idx, vals


def _loop(out, idx, vals, mask=None):
    out = out.copy()
    for i in range(len(idx)):
        if mask is None or mask[i]:
            out[idx[i]] = out[idx[i]] + vals[i]
    return out


def test_add_rows_adds_in_index_order():
    rng = np.random.default_rng(0)
    out, idx, vals = _case(rng)
    got = out.copy()
    so.add_rows(got, idx, vals)
    assert np.array_equal(got, _loop(out, idx, vals))
    rev = out.copy()                                   # the order matters for these values
    so.add_rows(rev, idx[::-1], vals[::-1])
    assert not np.array_equal(rev, got)
    mask = rng.random(len(idx)) < 0.5
    got = out.copy()
    so.add_rows(got, idx, vals, mask=mask)
    assert np.array_equal(got, _loop(out, idx, vals, mask))


def test_add_rows_broadcasts_a_value_and_wraps_uint16_as_numpy():
    t = np.array([65534, 3, 0], dtype=np.uint16)
    so.add_rows(t, np.array([0, 0, 0, 2]), np.ones(1, dtype=np.uint16))
    assert t.tolist() == [1, 3, 1]


def test_first_and_last_of_each():
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 50, 400)
    keys, first = so.first_of_each(idx)
    k2, last = so.last_of_each(idx)
    want = sorted(set(idx.tolist()))
    assert keys.tolist() == want and k2.tolist() == want
    assert first.tolist() == [idx.tolist().index(k) for k in want]
    assert last.tolist() == [len(idx) - 1 - idx.tolist()[::-1].index(k) for k in want]
