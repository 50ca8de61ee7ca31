"""ctx3f (compress/mix3f.py: ctx3 in fused kernels, gpu/mix_step.cu) on a GPU against its
reference, ctx3d on NumPy (which is ctx3 bit for bit, tests/test_mix.py). The integer state
(counts, checks, history, words, the match model) must be the reference's exactly: it depends on
the tokens only, and the kernels' claims, halving and match table must pick the rows and winners
the reference does. The floats (weights, logits) within rtol 1e-9: the kernels sum in other fixed
orders (trees over the alphabet, each weight row's contributions summed before they are added),
~1e-16 relative a sum, and two dozen steps of float64 updates keep that near 1e-13. The coder's
frequencies: those compress/coder.quantise gives on the kernel's own logits, in every cell but
the rare one whose floor a last-bit difference of exp crosses (at most 1 in 10^4 cells, each row
still summing to 2^24). Two device runs give the same bits. Skipped without CuPy or a GPU (CI)."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import gpu_marks

cp = pytest.importorskip("cupy")
pytestmark = gpu_marks(cp)

INTS = ("table", "total", "check", "mtab", "mptr", "mlen", "word", "prev_word", "c0", "hist")
FLOATS = ("Ws", "Wc", "V", "wm")


def _drive(make, xp, S, T, A, seed=5):
    """A mixer of S streams (half of them ending 5 steps early) over T steps of fixed random inputs,
    a quarter of the streams coding tokens 0 and 1 only (counts past LIMIT, halved; matches):
    -> (logits each step, frequencies each step, final state), all on the host."""
    from bytemodel.compress.coder import quantise
    rng = np.random.default_rng(seed)
    lengths = np.full(S, T)
    lengths[S // 2:] = T - 5
    m = make(lengths, A, True, xp)
    zs, fs = [], []
    for t in range(T):
        act = int((lengths > t).sum())
        net = np.log(rng.dirichlet(np.ones(A), act))
        z = m.predict(t, act, xp.asarray(net))
        f = m.frequencies(z)
        zs.append(cp.asnumpy(z) if xp is cp else z.copy())
        fs.append(cp.asnumpy(f).astype(np.int64) if xp is cp else quantise(z, A))
        sym = np.where(np.arange(act) < S // 4, rng.integers(0, 2, act), rng.integers(0, A, act))
        m.update(t, act, sym)
    st = {k: (cp.asnumpy(getattr(m, k)) if xp is cp else getattr(m, k)) for k in INTS + FLOATS}
    return zs, fs, st


@pytest.mark.parametrize("S,T,A", [(1024, 24, 256), (300, 30, 300), (37, 40, 40)])
def test_ctx3f_on_the_device_is_ctx3ds_arithmetic(S, T, A):
    from bytemodel.compress.coder import TOTAL, quantise
    from bytemodel.compress.mix3d import ContextMix3D
    from bytemodel.compress.mix3f import ContextMix3F
    zh, _, sh = _drive(ContextMix3D, np, S, T, A)
    zd, fd, sd = _drive(ContextMix3F, cp, S, T, A)
    for k in INTS:
        assert np.array_equal(sh[k], sd[k]), k
    for k in FLOATS:
        np.testing.assert_allclose(sd[k], sh[k], rtol=1e-9, atol=1e-12, err_msg=k)
    off = cells = 0
    for a, b, f in zip(zh, zd, fd):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9)
        assert (f >= 1).all() and (f.sum(axis=1) == TOTAL).all()
        q = quantise(b, A)
        off += int((q != f).sum())
        cells += f.size
    assert off <= max(2, cells // 10_000), (off, cells)
    zd2, fd2, sd2 = _drive(ContextMix3F, cp, S, T, A)                 # the same bits every run
    for k in INTS + FLOATS:
        assert np.array_equal(sd[k], sd2[k]), k
    assert all(np.array_equal(a, b) for a, b in zip(zd, zd2))
    assert all(np.array_equal(a, b) for a, b in zip(fd, fd2))


def test_ctx3f_halves_and_claims_as_the_reference(monkeypatch):
    # LIMIT lowered to 40 (the kernels read mix3d.LIMIT, as ctx3d's _count does) so that rows are
    # halved many times over, in a small table (rows_for's 256 rows at a few hundred tokens) where
    # hashed rows change hands every step
    from bytemodel.compress import mix3d
    from bytemodel.compress.mix3d import ContextMix3D
    from bytemodel.compress.mix3f import ContextMix3F
    monkeypatch.setattr(mix3d, "LIMIT", 40)
    _, _, sh = _drive(ContextMix3D, np, 64, 20, 64, seed=9)
    _, _, sd = _drive(ContextMix3F, cp, 64, 20, 64, seed=9)
    for k in INTS:
        assert np.array_equal(sh[k], sd[k]), k
    assert sh["total"].max() <= 40 + 64                           # halving held the counts down
    for k in FLOATS:
        np.testing.assert_allclose(sd[k], sh[k], rtol=1e-9, atol=1e-12, err_msg=k)


def test_compress_adapt_on_cuda_names_ctx3f_and_ctx3d_files_still_decode():
    pytest.importorskip("constriction")
    from bytemodel import compress as bmz
    from bytemodel.compress.adapt import Fresh, settings
    small = dict(d_model=64, n_layers=2, n_heads=1, d_ff=128)
    text = (b"Counting learns at once; the second time a context occurs, its count predicts. " * 40)[:3000]
    fresh = lambda: Fresh("tiny", "cuda", **small)   # noqa: E731
    a = settings(fresh(), segment=8)
    assert a.mix == "ctx3f"
    st, old = {}, {}
    blob = bmz.compress(fresh(), text, adapt=a, streams=300, stats=st)
    assert bmz.read(blob)[0]["adapt"]["mix"] == "ctx3f"
    assert blob == bmz.compress(fresh(), text, adapt=a, streams=300)
    assert bmz.decompress(fresh(), blob) == text
    d = settings(fresh(), segment=8, mix="ctx3d")
    blob_d = bmz.compress(fresh(), text, adapt=d, streams=300, stats=old)
    assert bmz.read(blob_d)[0]["adapt"]["mix"] == "ctx3d" and bmz.decompress(fresh(), blob_d) == text
    # the same arithmetic: the two files' model bits agree to a millionth
    assert abs(st["model_bits"] - old["model_bits"]) <= 1e-6 * old["model_bits"], (st, old)
