"""The device mixer on a GPU: ops/cuda_scatter.add_rows against the NumPy reference bit for bit;
ctx3d (compress/mix3d.py) on CuPy against ctx3d on NumPy (which is ctx3): the integer state
exact, the floats within rtol 1e-9 (the device's exp and log differ from the host's in the last
bits; a few dozen steps of float64 updates keep that near 1e-13 in practice), two device runs the
same bits; and `compress --adapt` on cuda with ctx3d named decodes. Skipped without
CuPy, a GPU or the coder (CI)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import gpu_marks

cp = pytest.importorskip("cupy")
pytestmark = gpu_marks(cp)

from bytemodel.ops import scatter_ops as so  # noqa: E402
from test_scatter import _case  # noqa: E402

def test_cuda_twin_is_the_reference_bit_for_bit():
    from bytemodel.ops import cuda_scatter as cs
    assert so.for_xp(cp) is cs.add_rows and so.for_xp(np) is so.add_rows
    rng = np.random.default_rng(2)
    for n, R, m in ((600, 37, 3), (5000, 11, 1), (1, 4, 2), (3000, 2000, 15)):
        out, idx, vals = _case(rng, n, R, m)
        mask = rng.random(n) < 0.7
        for mk in (None, mask):
            want = out.copy()
            so.add_rows(want, idx, vals, mk)
            runs = []
            for _ in range(2):
                d = cp.asarray(out)
                cs.add_rows(d, cp.asarray(idx), cp.asarray(vals), None if mk is None else cp.asarray(mk))
                runs.append(cp.asnumpy(d))
            assert np.array_equal(runs[0], want) and np.array_equal(runs[1], want), (n, R, m)
    for dt in (np.uint16, np.int64, np.int32):                 # the counts' types, with a broadcast one
        out = rng.integers(0, 60000 if dt == np.uint16 else 10**6, 300).astype(dt)
        idx = rng.integers(0, 300, 20000)
        want = out.copy()
        so.add_rows(want, idx, np.ones(1, dtype=dt))
        d = cp.asarray(out)
        cs.add_rows(d, cp.asarray(idx), cp.ones(1, dtype=dt))
        assert np.array_equal(cp.asnumpy(d), want), dt
    keys, at = so.first_of_each(cp.asarray(idx), cp)
    k2, at2 = so.first_of_each(idx)
    assert np.array_equal(cp.asnumpy(keys), k2) and np.array_equal(cp.asnumpy(at), at2)


def test_cuda_integer_scatters_are_the_references():
    # add_ones (uint16 wrapping, int64), put_last and claim_rows by atomics against the NumPy
    # references, over many repeats (the order atomics run in must not show), twice each
    from bytemodel.ops import cuda_scatter as cs
    rng = np.random.default_rng(4)
    for n, R in ((20000, 300), (5000, 7), (1, 3)):
        idx = rng.integers(0, R, n)
        mask = rng.random(n) < 0.7
        for dt in (np.uint16, np.int64):
            out = rng.integers(0, 65536 if dt == np.uint16 else 10**6, R).astype(dt)
            for mk in (None, mask):
                want = out.copy()
                so.add_ones(want, idx, mk)
                d = cp.asarray(out)
                cs.add_ones(d, cp.asarray(idx), None if mk is None else cp.asarray(mk))
                assert np.array_equal(cp.asnumpy(d), want), (n, R, dt)
        vals = rng.integers(0, 10**12, n)
        want = np.full(R, -1, dtype=np.int64)
        so.put_last(want, idx, vals)
        chk = rng.integers(1, 60000, n).astype(np.uint16)
        check = rng.integers(1, 60000, R).astype(np.uint16)
        table = rng.integers(0, 9, (R, 5)).astype(np.uint16)
        total = table.sum(axis=1).astype(np.int64)
        refs = [check.copy(), table.copy(), total.copy()]
        so.claim_rows(refs[0], idx, chk, mask, (refs[1], refs[2]))
        for _ in range(2):
            d = cp.full(R, -1, dtype=cp.int64)
            cs.put_last(d, cp.asarray(idx), cp.asarray(vals))
            assert np.array_equal(cp.asnumpy(d), want), (n, R)
            dc, dt_, dtot = cp.asarray(check), cp.asarray(table), cp.asarray(total)
            cs.claim_rows(dc, cp.asarray(idx), cp.asarray(chk), cp.asarray(mask), (dt_, dtot))
            for a, b in zip((dc, dt_, dtot), refs):
                assert np.array_equal(cp.asnumpy(a), b), (n, R)


def test_context_keys_kernel_is_ctx2s_keys():
    # the device's one kernel against ContextMix2._keys on the host, before and past the deepest context
    from bytemodel.compress.mix2 import ContextMix3
    from bytemodel.compress.mix3d import ContextMix3D
    rng = np.random.default_rng(6)
    S, T, A = 300, 20, 256
    host = ContextMix3(np.full(S, T), A, True)
    dev = ContextMix3D(np.full(S, T), A, True, cp)
    hist = rng.integers(0, A, host.hist.shape).astype(np.int32)
    host.hist[...] = hist
    dev.hist[...] = cp.asarray(hist)
    for t in (0, 1, 2, 5, host.depth - 1, host.depth, host.depth + 3, T - 1):
        for active in (S, S - 17):
            bh, kh = host._keys(t, active)
            bd, kd = dev._keys(t, active)
            assert np.array_equal(cp.asnumpy(bd), bh) and np.array_equal(cp.asnumpy(kd), kh), (t, active)


INTS = ("table", "total", "check", "mtab", "mptr", "mlen", "word", "prev_word", "c0", "hist")
FLOATS = ("Ws", "Wc", "V", "wm")


def _drive(xp, S=1024, T=24, A=256):
    from bytemodel.compress.mix3d import ContextMix3D
    rng = np.random.default_rng(5)
    lengths = np.full(S, T)
    lengths[S // 2:] = T - 5
    m = ContextMix3D(lengths, A, True, xp)
    zs = []
    for t in range(T):
        act = int((lengths > t).sum())
        net = np.log(rng.dirichlet(np.ones(A), act))
        zs.append(cp.asnumpy(m.predict(t, act, xp.asarray(net))) if xp is cp else m.predict(t, act, net))
        sym = np.where(np.arange(act) < S // 4, rng.integers(0, 2, act), rng.integers(0, A, act))
        m.update(t, act, sym)
    st = {k: (cp.asnumpy(getattr(m, k)) if xp is cp else getattr(m, k)) for k in INTS + FLOATS}
    return zs, st


def test_ctx3d_on_the_device_is_ctx3d_on_the_host():
    zh, sh = _drive(np)
    zd, sd = _drive(cp)
    zd2, sd2 = _drive(cp)
    for k in INTS:
        assert np.array_equal(sh[k], sd[k]), k
    for k in FLOATS:
        np.testing.assert_allclose(sd[k], sh[k], rtol=1e-9, atol=1e-12, err_msg=k)
    for a, b in zip(zh, zd):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9)
    for k in INTS + FLOATS:                                      # the device: the same bits every run
        assert np.array_equal(sd[k], sd2[k]), k
    assert all(np.array_equal(a, b) for a, b in zip(zd, zd2))


def test_compress_adapt_on_cuda_mixes_on_the_device_and_decodes():
    pytest.importorskip("constriction")
    from bytemodel import compress as bmz
    from bytemodel.compress.adapt import Fresh, settings
    small = dict(d_model=64, n_layers=2, n_heads=1, d_ff=128)
    text = (b"Counting learns at once; the second time a context occurs, its count predicts. " * 40)[:3000]
    lm = Fresh("tiny", "cuda", **small)
    a = settings(lm, segment=8, mix="ctx3d")     # (the default is ctx3f now: tests/test_mix3f_gpu.py)
    st = {}
    blob = bmz.compress(lm, text, adapt=a, streams=300, stats=st)
    assert bmz.read(blob)[0]["adapt"]["mix"] == "ctx3d"
    assert blob == bmz.compress(Fresh("tiny", "cuda", **small), text, adapt=a, streams=300)
    assert bmz.decompress(Fresh("tiny", "cuda", **small), blob) == text
    plain = {}
    bmz.compress(Fresh("tiny", "cuda", **small), text, adapt=settings(lm, segment=8, mix="none"), streams=300,
                 stats=plain)
    assert st["model_bits"] < plain["model_bits"], (st, plain)   # the counts learn the repeats
