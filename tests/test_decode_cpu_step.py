"""The CPU's one-token generation step (decode/cpu_step.py) against the general path it stands in
for: the same logits as Model.forward_cached, bit for bit (np.array_equal: no tolerance, since
generation must draw the same bytes), and the same cache; generate gives the same bytes with and
without it (plain, GQA, tied head, top-k/top-p, a byte mask, a cache that fills and is re-read)."""
import numpy as np
import pytest

from bytemodel.config import ModelConfig
from bytemodel.decode import generate as gen
from bytemodel.decode.cpu_step import OneToken
from bytemodel.model import Model
from bytemodel.ops import numpy_ops
from bytemodel.tokenizer import Tokenizer

CFGS = {
    "plain": dict(vocab_size=257, d_model=32, n_layers=2, n_heads=2, d_ff=64, context=24),
    "gqa": dict(vocab_size=257, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96, context=24),
    "tied": dict(vocab_size=300, d_model=48, n_layers=3, n_heads=3, d_ff=80, context=24, tie_embeddings=True),
}


def _model(name):
    m = Model(ModelConfig(**CFGS[name]), numpy_ops)
    m.init_weights(7)
    m.load_flat(m.params * 6)   # spread the logits: far from uniform, so a slip shows
    return m


@pytest.mark.parametrize("name", sorted(CFGS))
@pytest.mark.parametrize("prompt", [1, 5])
def test_one_token_step_gives_the_cached_forwards_logits_bit_for_bit(name, prompt):
    m = _model(name)
    T, W = m.cfg.context, m.weights()
    rng = np.random.default_rng(prompt)
    ids = rng.integers(0, m.cfg.vocab_size, T)
    ref, fast = m.new_cache(1, T), m.new_cache(1, T)
    m.forward_cached(ids[None, :prompt], ref, 0, W)
    m.forward_cached(ids[None, :prompt], fast, 0, W)
    step = OneToken(m, fast, W)
    for pos in range(prompt, T):
        want = m.forward_cached(ids[None, pos:pos + 1], ref, pos, W)[0, -1]
        got = step(int(ids[pos]), pos)
        assert np.array_equal(got, want), (name, pos, np.abs(got - want).max())
    for (k1, v1), (k2, v2) in zip(ref, fast):
        assert np.array_equal(k1, k2) and np.array_equal(v1, v2)


@pytest.mark.parametrize("name", sorted(CFGS))
@pytest.mark.parametrize("kw", [dict(), dict(temperature=0.7, top_k=20, top_p=0.9), dict(temperature=0)])
def test_generate_draws_the_same_bytes_with_and_without_the_step(name, kw, monkeypatch):
    m, tok = _model(name), Tokenizer()
    allowed = None
    if name == "tied":   # a byte mask too (and <doc> barred from the draw)
        allowed = np.zeros(tok.vocab_size, bool)
        allowed[65:91] = True
        m = Model(ModelConfig(**{**CFGS[name], "vocab_size": tok.vocab_size}), numpy_ops)
        m.init_weights(7)
        m.load_flat(m.params * 6)
    n = 3 * m.cfg.context + 5            # past a full cache and its re-read, twice
    outs = {}
    for on in (True, False):
        monkeypatch.setattr(gen, "ONE_TOKEN_STEP", on)
        outs[on] = [gen.generate(m, tok, n, b"AB", seed=s, allowed=allowed, **kw) for s in (0, 1, 2)]
    assert outs[True] == outs[False]
    assert all(len(o) == n for o in outs[True])
    assert kw.get("temperature") == 0 or len(set(outs[True])) == 3     # the seeds draw different bytes


def test_a_tokens_logits_do_not_depend_on_the_blas_thread_count():
    """A token's logits at one BLAS thread are those of two, bit for bit, at the tiny preset's
    shapes, from one cache (a prefill's are not: its (T, C) products round by thread count)."""
    from threadpoolctl import threadpool_limits
    from bytemodel.config import preset
    m = Model(preset("tiny"), numpy_ops)
    m.init_weights(0)
    W, ids = m.weights(), np.random.default_rng(0).integers(0, 257, 200)
    first = m.new_cache(1, m.cfg.context)
    m.forward_cached(ids[None, :8], first, 0, W)
    got = {}
    for n in (1, 2):
        with threadpool_limits(limits=n, user_api="blas"):
            step = OneToken(m, [(k.copy(), v.copy()) for k, v in first], W)
            got[n] = np.stack([step(int(t), p).copy() for p, t in enumerate(ids[8:], 8)])
    assert np.array_equal(got[1], got[2])


def test_generate_holds_blas_to_one_thread_prefills_included(monkeypatch):
    """generate holds BLAS to one thread while a small model makes one sample (cpu_step.OneBlasThread),
    its prefill and re-reads included, so its bytes do not depend on the caller's BLAS threads;
    the caller's count is back afterwards; base's products are left to the caller's count."""
    from threadpoolctl import threadpool_info, threadpool_limits
    from bytemodel.config import preset
    from bytemodel.decode.cpu_step import small_products
    blas = lambda: sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})   # noqa: E731
    m, tok = _model("plain"), Tokenizer()
    seen, real = [], m.forward_cached

    def spy(idx, *a, **kw):
        seen.append((idx.shape[1], blas()))
        return real(idx, *a, **kw)
    monkeypatch.setattr(m, "forward_cached", spy)
    outs = {}
    for n in (1, 2):
        with threadpool_limits(limits=n, user_api="blas"):
            outs[n] = gen.generate(m, tok, 2 * m.cfg.context, b"ABC", seed=3)
            assert blas() == [n]
    assert outs[1] == outs[2]
    prefills = [s for s in seen if s[0] > 1]
    assert len(prefills) >= 4 and all(t == [1] for _, t in prefills), seen    # 2 x (prompt + re-reads)
    assert small_products(preset("small")) and not small_products(preset("base"))   # base: left alone


@pytest.mark.parametrize("shape", [dict(d_model=256, n_heads=4, d_ff=256), dict(d_model=384, n_heads=6, d_ff=1024)])
def test_steps_at_two_blas_threads_draw_the_same_bytes_prefills_at_one(shape, monkeypatch):
    """With two cores, generate may run a step's products at two BLAS threads (cpu_step.BlasThreads,
    chosen by timing; here the choice is forced to alternate so both counts run): the same bytes
    as one thread throughout, every prefill and re-read at one thread, the caller's count back
    afterwards. Models: one product above PAIR_MACS (qkv, 256 x 768), all under SPLIT_MACS; and
    one layer of the small preset's shapes, whose qkv and down are padded at two threads."""
    from threadpoolctl import threadpool_info, threadpool_limits
    from bytemodel.decode import cpu_pair, cpu_step
    from bytemodel.ops import scorer
    blas = lambda: sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})   # noqa: E731
    m = Model(ModelConfig(vocab_size=257, n_layers=1, context=24, **shape), numpy_ops)
    m.init_weights(7)
    m.load_flat(m.params * 6)
    tok = Tokenizer()
    monkeypatch.setattr(scorer, "_cores", lambda: 2)
    assert cpu_step.pair_for(m.cfg) and cpu_step.small_products(m.cfg)
    flip = iter(range(10 ** 6))
    monkeypatch.setattr(cpu_pair.Faster, "pick", lambda self: next(flip) % 2)
    seen, real_fwd, real_step = [], m.forward_cached, OneToken._step

    def fwd(idx, *a, **kw):
        seen.append(("prefill", tuple(blas())))
        return real_fwd(idx, *a, **kw)

    def step(self, *a):
        seen.append(("step", tuple(blas())))
        return real_step(self, *a)
    monkeypatch.setattr(m, "forward_cached", fwd)
    monkeypatch.setattr(OneToken, "_step", step)
    outs = {}
    for two in (False, True):
        monkeypatch.setattr(gen, "TWO_BLAS_STEP", two)
        seen.clear()
        with threadpool_limits(limits=2, user_api="blas"):
            outs[two] = gen.generate(m, tok, 3 * m.cfg.context, b"ABC", seed=3)
            assert blas() == [2]
        counts = {kind: {t for k, t in seen if k == kind} for kind in ("prefill", "step")}
        assert counts["prefill"] == {(1,)} and len([k for k, _ in seen if k == "prefill"]) >= 3
        assert counts["step"] == ({(1,), (2,)} if two else {(1,)}), counts
    assert outs[False] == outs[True]


def test_padded_columns_for_two_blas_threads():
    """qkv's and down's weights of the small preset get zero columns up to OpenBLAS's two-thread
    size, each half a multiple of ALIGN; products already that large, or that would grow by more
    than PAD_MAX, keep their columns."""
    from bytemodel.decode.cpu_pair import ALIGN
    from bytemodel.decode.cpu_step import PAD_MAX, SPLIT_ELEMS, padded_cols
    assert padded_cols(384, 1152) == 1216 and padded_cols(1024, 384) == 480     # small's qkv and down
    for C, N in [(384, 1152), (1024, 384)]:
        n = padded_cols(C, N)
        assert C * n >= SPLIT_ELEMS and n % (2 * ALIGN) == 0 and n <= PAD_MAX * N
    assert padded_cols(384, 2048) == 2048 and padded_cols(768, 2304) == 2304      # already split
    assert padded_cols(384, 384) == 384 and padded_cols(128, 384) == 384          # would more than x1.25
    assert padded_cols(384, 1160) == 1160      # not a multiple of ALIGN: its tail columns would round otherwise


def test_splits_alike_finds_a_padded_product_that_rounds_otherwise():
    """The check that keeps padding honest: a padded copy whose real columns give other bits at
    two threads is refused (here one weight off by 0.1%), an exact copy is taken."""
    from bytemodel.decode import cpu_step

    class Threads:       # BlasThreads' interface; the count does not matter to the check's logic
        n = 1

        def set(self, n):
            self.n = n
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    good, bad = np.zeros((64, 64), np.float32), np.zeros((64, 96), np.float32)   # shapes: the memo's keys
    good[:, :32] = w
    bad[:, :32] = w
    bad[3, 5] *= np.float32(1.001)
    cpu_step._ALIKE.clear()
    assert cpu_step.splits_alike(w, good, Threads())
    assert not cpu_step.splits_alike(w, bad, Threads())
    cpu_step._ALIKE.clear()


def test_small_presets_padded_products_at_two_blas_threads_give_the_cached_forwards_logits():
    """At the small preset's layer shapes (one layer), the two-thread way's products (qkv and down
    padded, cpu_step.padded_cols) give Model.forward_cached's logits bit for bit, and the padding
    is really in use (a padded shape that rounds otherwise would be refused by splits_alike)."""
    from threadpoolctl import ThreadpoolController
    from bytemodel.decode.cpu_step import BlasThreads
    m = Model(ModelConfig(vocab_size=257, d_model=384, n_layers=1, n_heads=6, d_ff=1024, context=48), numpy_ops)
    m.init_weights(3)
    m.load_flat(m.params * 4)
    W, ids = m.weights(), np.random.default_rng(2).integers(0, 257, 48)
    libs = ThreadpoolController().select(user_api="blas").lib_controllers
    if not libs:
        pytest.skip("no BLAS library that threadpoolctl can set")
    threads = BlasThreads(libs)
    ref, fast = m.new_cache(1, 48), m.new_cache(1, 48)
    m.forward_cached(ids[None, :4], ref, 0, W)
    m.forward_cached(ids[None, :4], fast, 0, W)
    step = OneToken(m, fast, W, None, threads)
    qkv, down = step.ways[1][0][0][0], step.ways[1][0][0][3]
    assert qkv.args[1].shape == (384, 1216) and down.args[1].shape == (1024, 480)
    try:
        for pos in range(4, 48):
            want = m.forward_cached(ids[None, pos:pos + 1], ref, pos, W)[0, -1]
            threads.set(2)
            got = step._step(step.ways[1], int(ids[pos]), pos)
            threads.set(1)
            assert np.array_equal(got, want), (pos, np.abs(got - want).max())
    finally:
        threads.one()
