"""The context mixer of `compress --adapt` (compress/mix.py): its weight gradient against finite
differences, what its counts and match model learn that the network cannot, exact round trips
with it, and old files (adapted before the mixer) decoding as they were coded."""
from __future__ import annotations

import numpy as np
import pytest

from bytemodel.compress import mix as M
from bytemodel.compress.adapt import Adapt, MIX


def _drive_mixer(data: bytes, S: int, net_bits: bool = False):
    """Code `data` (bytes as tokens, S streams) with a uniform network: the mix's bits and the mixer."""
    x = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    n = len(x)
    L = np.full(S, n // S, dtype=np.int64)
    L[: n % S] += 1
    st = np.concatenate([[0], np.cumsum(L)[:-1]])
    m = M.ContextMix(L, 256)
    net = np.full((S, 256), -np.log(256.0))
    bits = 0.0
    for t in range(int(L[0])):
        a = int((L > t).sum())
        z = m.predict(t, a, net[:a])
        z = z - z.max(axis=1, keepdims=True)
        lp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        y = x[st[:a] + t]
        bits -= lp[np.arange(a), y].sum() / np.log(2)
        m.update(t, a, y)
    return bits, m


def test_weight_gradient_matches_finite_differences():
    # the update adds LR * g to the chosen weight set, g = d(log p[y])/dw; check g in float64 by
    # central differences of log softmax(sum_i w_i X_i + match bonus)[y] (step 1e-6: the error is
    # O(h^2), about 1e-12 on terms of order 1, so rtol 1e-6 is far above rounding and far below a wrong
    # sign, factor or input)
    rng = np.random.default_rng(0)
    data = rng.integers(0, 4, 1500, dtype=np.uint8).tobytes()
    _, m = _drive_mixer(data, 1)                 # counts and weights away from their start
    t = 1000
    m.hist[:, t + 1:] = 0
    net = np.log(rng.dirichlet(np.ones(256), size=1))
    m.predict(t, 1, net)
    _, _, X, _, sel, pred, has, lb, _ = m._step
    y = 2
    w0 = m.W[sel[0]].copy()

    def logp(w):
        zz = w @ X[0]
        if has[0]:
            zz[pred[0]] += m.wm[lb[0]]
        zz = zz - zz.max()
        return zz[y] - np.log(np.exp(zz).sum())

    num = np.empty_like(w0)
    for i in range(len(w0)):
        e = np.zeros_like(w0)
        e[i] = 1e-6
        num[i] = (logp(w0 + e) - logp(w0 - e)) / 2e-6
    m.update(t, 1, np.array([y]))
    np.testing.assert_allclose(m.W[sel[0]] - w0, M.LR * num, rtol=1e-6, atol=1e-13)


def test_counts_and_matches_learn_what_a_uniform_network_cannot():
    # 2 KB of random bytes, four times: the network (uniform) pays 8 bits a byte; the first copy is
    # incompressible, the three repeats are what the match model and the counts must catch
    rng = np.random.default_rng(1)
    block = rng.integers(0, 256, 2048, dtype=np.uint8).tobytes()
    bits, _ = _drive_mixer(block * 4, 3)        # 3 streams: not in phase with the copies
    n = 4 * len(block)
    assert bits < 0.5 * 8 * n, bits / n          # at most half of the network's 8 bits a byte
    assert bits > 0.2 * 8 * n                    # and the incompressible first copy is still paid for


def test_a_file_adapted_before_the_mixer_reads_as_unmixed():
    a = Adapt()
    assert a.mix == MIX == M.NAME
    old = {k: v for k, v in a.header().items() if k != "mix"}
    assert Adapt.from_header(old).mix == "none"
    with pytest.raises(ValueError):
        Adapt.from_header({**a.header(), "mix": "ctx0"})


def test_table_rows_fit_the_file_and_the_caps():
    assert M.rows_for(1000, 256) == 256
    assert M.rows_for(10 ** 8, 256) == 1 << M.MAX_ROWS_BITS
    assert M.rows_for(10 ** 8, 4096) * 4096 <= M.MAX_CELLS
