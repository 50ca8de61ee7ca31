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


def test_add_ones_put_last_and_claim_rows_against_loops():
    # the mixer's integer scatters (their CUDA twins, atomics, are held to these in test_mix_gpu.py)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 40, 500)
    mask = rng.random(500) < 0.6
    t = np.array([65535, 2] + [0] * 38, dtype=np.uint16)
    want = t.copy()
    for i in range(500):
        if mask[i]:
            want[idx[i]] = np.uint16((int(want[idx[i]]) + 1) % 65536)
    so.add_ones(t, idx, mask)
    assert np.array_equal(t, want) and t[0] <= 65535           # wrapped, as NumPy's uint16 does
    out = np.full(40, -1, dtype=np.int64)
    vals = rng.integers(0, 10**9, 500)
    so.put_last(out, idx, vals)
    loop = np.full(40, -1, dtype=np.int64)
    for i in range(500):                                        # a plain loop: the last write stays
        loop[idx[i]] = vals[i]
    assert np.array_equal(out, loop)
    check = rng.integers(1, 9, 40).astype(np.uint16)
    table = rng.integers(1, 9, (40, 3)).astype(np.uint16)
    total = table.sum(axis=1).astype(np.int64)
    chk = rng.integers(1, 9, 500).astype(np.uint16)
    c2, t2, tot2 = check.copy(), table.copy(), total.copy()
    seen = set()
    for i in range(500):                                        # first claimant of each row owns it
        if mask[i]:
            t2[idx[i]] = 0
            tot2[idx[i]] = 0
            if idx[i] not in seen:
                seen.add(idx[i])
                c2[idx[i]] = chk[i]
    so.claim_rows(check, idx, chk, mask, (table, total))
    assert np.array_equal(check, c2) and np.array_equal(table, t2) and np.array_equal(total, tot2)
