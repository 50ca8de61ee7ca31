"""The context mixers of `compress --adapt` (ctx1: compress/mix.py; ctx2, the default: compress/mix2.py):
their weight gradients against finite differences, what their counts and match model learn that the
network cannot, ctx2's checked rows and fresh start, exact round trips with each, and old files
(adapted before the mixer, or with ctx1) decoding as they were coded."""
from __future__ import annotations

import numpy as np
import pytest

from bytemodel.compress import mix as M, mix2 as M2, mix3d as M3D
from bytemodel.compress.adapt import Adapt, MIX


def _drive_mixer(data: bytes, S: int, make=M.ContextMix):
    """Code `data` (bytes as tokens, S streams) with a uniform network: the mix's bits and the mixer."""
    x = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    n = len(x)
    L = np.full(S, n // S, dtype=np.int64)
    L[: n % S] += 1
    st = np.concatenate([[0], np.cumsum(L)[:-1]])
    m = make(L, 256)
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


@pytest.mark.parametrize("make", [M.ContextMix, M2.ContextMix2, M2.ContextMix3], ids=["ctx1", "ctx2", "ctx3"])
def test_counts_and_matches_learn_what_a_uniform_network_cannot(make):
    # 2 KB of random bytes, four times: the network (uniform) pays 8 bits a byte; the first copy is
    # incompressible, the three repeats are what the match model and the counts must catch
    rng = np.random.default_rng(1)
    block = rng.integers(0, 256, 1024, dtype=np.uint8).tobytes()
    bits, _ = _drive_mixer(block * 4, 3, make)  # 3 streams: not in phase with the copies
    n = 4 * len(block)
    assert bits < 0.5 * 8 * n, bits / n          # at most half of the network's 8 bits a byte
    assert bits > 0.2 * 8 * n                    # and the incompressible first copy is still paid for


def test_a_file_adapted_before_the_mixer_reads_as_unmixed():
    a = Adapt()
    assert a.mix == MIX == M2.NAME3
    assert Adapt.from_header({**a.header(), "mix": M.NAME}).mix == "ctx1"      # ctx1 files keep their mixer
    assert Adapt.from_header({**a.header(), "mix": M2.NAME}).mix == "ctx2"     # and ctx2 files theirs
    assert type(M2.mixer("ctx1", [10], 256)) is M.ContextMix and type(M2.mixer("ctx2", [10], 256)) is M2.ContextMix2
    assert type(M2.mixer("ctx3", [10], 256)) is M2.ContextMix3
    from bytemodel.compress import mix3d
    assert type(mix3d.mixer("ctx3d", [10], 256)) is mix3d.ContextMix3D
    assert type(mix3d.mixer("ctx3", [10], 256)) is M2.ContextMix3
    from bytemodel.compress import mix3f
    assert type(mix3f.mixer("ctx3f", [10], 256)) is mix3f.ContextMix3F
    assert type(mix3f.mixer("ctx3d", [10], 256)) is mix3d.ContextMix3D
    old = {k: v for k, v in a.header().items() if k != "mix"}
    assert Adapt.from_header(old).mix == "none"
    with pytest.raises(ValueError):
        Adapt.from_header({**a.header(), "mix": "ctx0"})


def test_table_rows_fit_the_file_and_the_caps():
    assert M.rows_for(1000, 256) == 256
    assert M.rows_for(10 ** 8, 256) == 1 << M.MAX_ROWS_BITS
    assert M.rows_for(10 ** 8, 4096) * 4096 <= M.MAX_CELLS


def test_ctx2_weight_steps_match_finite_differences():
    # ctx2's update: each weight set k (its row Ws[sel_k], plus the contexts' confidence weights Wc)
    # steps LR * d log p_k[y] / dw with p_k = softmax(z_k), the set alone; the final layer V[order]
    # LR_FINAL * d log p[y] / dv with p the mix; Wc[i, cls_i] LR_CONF * the sets' mean gradient on
    # context i. Central differences in float64, step 1e-6: truncation O(h^2) ~ 1e-12, rounding
    # ~ 1e-16 * |log p| / h ~ 1e-9 on a gradient, 1.5e-12 after the rate: rtol 1e-6, atol 1e-11
    # (a wrong sign, factor or input is off by the gradient itself, >= 1e-6 here).
    rng = np.random.default_rng(2)
    data = rng.integers(0, 4, 700, dtype=np.uint8).tobytes()
    _, m = _drive_mixer(data, 1, M2.ContextMix2)
    t = 500
    m.hist[:, t + 1:] = 0
    net = np.log(rng.dirichlet(np.ones(256), size=1))
    m.predict(t, 1, net)
    _, _, X, _, _, _, sel, cls, order, zs, pred, has, lb, _ = m._step
    y = 3
    W = m.Ws[sel[0]].copy()                                      # (SETS, M) the chosen rows
    W[:, 2:] += m.Wc[np.arange(m.K), cls[0]]
    v0, Ws0, Wc0 = m.V[order[0]].copy(), m.Ws.copy(), m.Wc.copy()
    bonus = np.zeros(256)
    if has[0]:
        bonus[pred[0]] = m.wm[lb[0]]

    def lsm(zz):
        zz = zz - zz.max()
        return zz[y] - np.log(np.exp(zz).sum())

    def num(f, x):
        out = np.empty_like(x)
        for i in range(len(x)):
            e = np.zeros_like(x)
            e[i] = 1e-6
            out[i] = (f(x + e) - f(x - e)) / 2e-6
        return out

    g = [num(lambda w: lsm(w @ X[0]), W[k]) for k in range(M2.SETS)]
    gv = num(lambda v: lsm(v[0] * (W[0] @ X[0]) + v[1] * (W[1] @ X[0]) + bonus), v0)
    m.update(t, 1, np.array([y]))
    for k in range(M2.SETS):
        np.testing.assert_allclose(m.Ws[sel[0, k]] - Ws0[sel[0, k]], M2.LR * g[k], rtol=1e-6, atol=1e-11)
    np.testing.assert_allclose(m.V[order[0]] - v0, M2.LR_FINAL * gv, rtol=1e-6, atol=1e-11)
    dc = m.Wc[np.arange(m.K), cls[0]] - Wc0[np.arange(m.K), cls[0]]
    np.testing.assert_allclose(dc, M2.LR_CONF * (g[0] + g[1])[2:] / 2, rtol=1e-6, atol=1e-11)


def test_ctx2_a_row_another_context_owns_reads_as_empty():
    # a hashed row carries its owner's check: a stream whose context hashes to a row another context
    # owns must read it as empty (the prior: every token log(1/A)), and then own it, cleared
    rng = np.random.default_rng(3)
    data = rng.integers(0, 8, 1200, dtype=np.uint8).tobytes()
    _, m = _drive_mixer(data, 2, M2.ContextMix2)
    t, i = 500, 2                                               # context 2: (1, 2, 3), hashed
    assert m.hashed[i]
    m.predict(t, 2, np.full((2, 256), -np.log(256.0)))
    X, rows, chk = m._step[2], m._step[3], m._step[4]
    r = rows[0, i]
    assert m.total[r] > 0 and m.check[r] == chk[0, i]          # seen before: counts, not the prior
    assert not np.allclose(X[0, 2 + i], -np.log(256.0))
    m.check[r] ^= 0x8000                                         # now another context's row
    m.predict(t, 2, np.full((2, 256), -np.log(256.0)))
    X = m._step[2]
    np.testing.assert_allclose(X[0, 2 + i], -np.log(256.0), rtol=1e-12)
    m.update(t, 2, np.array([5, 6]))
    assert m.check[r] == chk[0, i] and m.table[r, 5] == 1 and m.total[r] == 1   # taken over, cleared, counted


@pytest.mark.parametrize("fresh", [True, False])
def test_ctx2_a_fresh_start_gives_the_network_no_weight(fresh):
    # at the first step (no counts yet) the mix of a fresh start must not depend on the network; from a
    # checkpoint it must
    m = M2.ContextMix2([50, 50], 256, fresh=fresh)
    rng = np.random.default_rng(4)
    z = [m.predict(0, 2, np.log(rng.dirichlet(np.ones(256), size=2))) for _ in range(2)]
    d = lambda a: a - a.max(axis=1, keepdims=True)
    assert np.allclose(d(z[0]), d(z[1])) == fresh


@pytest.mark.parametrize("mix", ["ctx1", "ctx2", "ctx3", "ctx3d", "ctx3f"])
def test_each_mixer_round_trips_and_its_name_decides(mix):
    pytest.importorskip("constriction")
    from bytemodel import compress as bmz
    from bytemodel.compress.adapt import Fresh, settings
    from bytemodel.errors import CompressError
    small = dict(d_model=32, n_layers=2, n_heads=2, d_ff=64)
    lm = Fresh("tiny", **small)
    text = (b"Counting learns at once; the second time a context occurs, its count predicts. " * 10)[:700]
    blob = bmz.compress(lm, text, adapt=settings(lm, segment=8, mix=mix), streams=2)
    header, payload = bmz.read(blob)
    assert header["adapt"]["mix"] == mix
    assert bmz.decompress(Fresh("tiny", **small), blob) == text
    other = "ctx2" if mix == "ctx1" else "ctx1"                  # the same payload read with another mixer
                                                                 # (ctx2 and ctx3 agree at 2 streams)
    from bytemodel.compress.container import _pack
    header["adapt"]["mix"] = other
    with pytest.raises(CompressError):
        bmz.decompress(Fresh("tiny", **small), _pack(header, payload))


def test_ctx2_keys_at_once_are_ctx1s_keys_one_by_one():
    # ContextMix2._keys computes every token context's key in one pass; they must be the very
    # integers ctx1's _key gives context by context (the rows and checks are the format), at the
    # start (contexts reaching before the stream: A) and later, with streams that ended
    L = np.array([40, 40, 39, 12])
    mx = M2.ContextMix2(L, 256)
    mx.hist[:] = np.random.default_rng(3).integers(0, 256, mx.hist.shape)
    for t in (0, 1, 2, 5, 7, 8, 9, 20, 38):
        active = int(np.count_nonzero(L > t))
        back, multi = mx._keys(t, active)
        for n, i in enumerate(mx.multi):
            assert np.array_equal(multi[:, n], mx._key(t, active, M2.CONTEXTS[i], i + 1)), (t, i)
        for i, j in zip(mx.single, mx.single_j):
            assert np.array_equal(back[:, j], mx._key(t, active, M2.CONTEXTS[i], i + 1)), (t, i)


def _steps(make, S: int, steps: int = 3):
    """A mixer of S streams driven `steps` steps on fixed random inputs: its weights after each step."""
    rng = np.random.default_rng(7)
    m = make(np.full(S, 40, dtype=np.int64), 256)
    out = []
    for t in range(steps):
        net = np.log(rng.dirichlet(np.ones(256), size=S))
        m.predict(t, S, net)
        m.update(t, S, rng.integers(0, 256, S))
        out.append((m.Ws.copy(), m.Wc.copy(), m.V.copy(), m.wm.copy()))
    return out


def test_ctx3_is_ctx2_up_to_256_streams_and_scales_its_steps_past_them():
    # ctx3 (the default of new files): at up to FULL_RATE_STREAMS streams a step, ctx2's weights bit
    # for bit; at 1,024 its first step is ctx2's times 256/1024 (the scaled rate multiplies each
    # stream's step before the sums: equal to float64 rounding, rtol 1e-12)
    assert M2.FULL_RATE_STREAMS == 256
    for a, b in zip(_steps(M2.ContextMix2, 200), _steps(M2.ContextMix3, 200)):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    two, three = _steps(M2.ContextMix2, 1024, 1)[0], _steps(M2.ContextMix3, 1024, 1)[0]
    start = M2.ContextMix2(np.full(1024, 40, dtype=np.int64), 256)
    assert np.abs(two[0] - start.Ws).max() > 0 and np.abs(two[2] - start.V).max() > 0   # the step moved them
    for x, y, w0 in zip(two, three, (start.Ws, start.Wc, start.V, start.wm)):
        np.testing.assert_allclose(y - w0, (x - w0) * (256 / 1024), rtol=1e-12, atol=1e-15)


def test_ctx3d_on_numpy_is_ctx3_bit_for_bit():
    # compress/mix3d.py writes ctx3 once for NumPy or CuPy (the GPU's mixer); with NumPy every logit
    # and every piece of state must be ctx3's, through the paths that differ in how they are written:
    # past 256 streams (the scaled steps), rows changing hands (first claimant), rows halved past
    # LIMIT (half the streams code token 0 only), the match table (last write wins), and
    # streams ending
    from bytemodel.compress.mix3d import ContextMix3D
    S, T, A = 1024, 24, 256
    rng = np.random.default_rng(1)
    lengths = np.full(S, T)
    lengths[S // 2:] = T - 5
    a, b = M2.ContextMix3(lengths, A, True), ContextMix3D(lengths, A, True)
    claims = halved = 0
    for t in range(T):
        act = int((lengths > t).sum())
        net = np.log(rng.dirichlet(np.ones(A), act))
        assert np.array_equal(a.predict(t, act, net), b.predict(t, act, net.copy())), t
        sym = np.where(np.arange(act) < S // 2, 0, rng.integers(0, A, act))
        claims += int(a._step[5].sum())
        before = a.total.copy()
        a.update(t, act, sym)
        b.update(t, act, sym)
        zero = a.offset[a.single]                                   # the one-token contexts' rows of token 0
        halved += int((a.total[zero] < before[zero]).sum())         # (never claimed: only halving lowers them)
    assert claims > 0 and halved > 0, (claims, halved)
    for k in ("table", "total", "check", "Ws", "Wc", "V", "wm", "mtab", "mptr", "mlen", "word", "prev_word", "c0", "hist"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), k


def test_ctx3d_reads_floor_log2_exactly_as_ctx3s_log2():
    from bytemodel.compress.mix3d import _floor_log2
    n = np.arange(1, 1 << 20, dtype=np.float64)
    assert np.array_equal(_floor_log2(n, np), np.log2(n).astype(np.int64))


@pytest.mark.parametrize("make", [M.ContextMix, M2.ContextMix3, M3D.ContextMix3D])
def test_a_match_slot_two_streams_write_at_once_keeps_the_last_streams(make):
    # three streams with the same bytes hash every context to the same slot at the same step: the
    # match table must keep the last stream's position (NumPy's assignment order, which ctx3d makes
    # explicit with last_of_each so a GPU gives the same); broken to the first, every entry points at 0
    text = b"the match model points at where a context was seen before; " * 4
    _, m = _drive_mixer(text * 3, 3, make)
    written = m.mtab[m.mtab >= 0]
    assert written.size > 0
    assert ((written - 1) // m.row_len == 2).all()   # an entry: stream * row_len + t + 2, t + 2 <= row_len
