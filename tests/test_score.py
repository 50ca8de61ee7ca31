"""Scoring (decode/score.py, ops/scorer.py, ops/score_ops.py): the batched path against the float64
host path it replaced, the window policy by hand, streaming, threads, and the CUDA twin.

Tolerances: batched against the reference, 1e-4 bits/byte (the issue's bound): the two differ by
the float32 log-softmax (relative 1e-7 of each term) and by BLAS blocking over different batch
shapes; about 1e-7 is seen. Threads: exactly equal (each chunk's arithmetic is fixed).
"""
import numpy as np
import pytest

from bytemodel.config import ModelConfig
from bytemodel.decode.score import doc_windows, reference_score, score, score_documents, score_stream
from bytemodel.model import Model
from bytemodel.ops import cuda_available, numpy_ops
from bytemodel.ops.score_ops import window_nll
from bytemodel.tokenizer import Tokenizer

CFG = dict(vocab_size=257, d_model=32, n_layers=2, n_heads=2, d_ff=64, context=16)


@pytest.fixture(scope="module")
def model():
    m = Model(ModelConfig(**CFG), numpy_ops)
    m.init_weights(3)
    m.load_flat(m.params * 8)   # spread the logits, so a wrong target or window shows
    return m


def _data(n, seed=0):
    return bytes(np.random.default_rng(seed).integers(65, 75, n, dtype=np.uint8))


@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 31, 40, 100, 333])
def test_batched_score_matches_the_float64_host_path(model, n):
    tok = Tokenizer()
    a, b = score(model, tok, _data(n, n)), reference_score(model, tok, _data(n, n))
    assert a["tokens"] == b["tokens"] == n and a["bytes"] == b["bytes"] == n
    assert abs(a["bits_per_byte"] - b["bits_per_byte"]) < 1e-4


def test_bpe_documents_match_the_reference(model):
    tok = Tokenizer.train([b"abcabcabd" * 30], 5)
    m = Model(ModelConfig(**{**CFG, "vocab_size": tok.vocab_size}), numpy_ops)
    m.init_weights(1)
    data = b"abcabdabcabc" * 9
    assert abs(score(m, tok, data)["bits_per_byte"] - reference_score(m, tok, data)["bits_per_byte"]) < 1e-4


def test_windows_by_hand():
    """T = 8: windows start at 0, 4, 8, ... and each target is scored once, after >= 4 of history."""
    ids = np.arange(22)                              # <doc> + 21 ids: 21 targets
    w = list(doc_windows([ids], 8))
    assert [(int(x[0]), len(x), k) for x, y, k in w] == [(0, 8, 0), (4, 8, 4), (8, 8, 4), (12, 8, 4), (16, 5, 4)]
    scored = np.concatenate([y[k:] for _, y, k in w])
    assert np.array_equal(scored, np.arange(1, 22))
    assert [len(x) for x, _, _ in doc_windows([np.arange(21)], 8)] == [8, 8, 8, 8]   # 20 targets: no short tail
    for x, y, _ in w:
        assert np.array_equal(y, x + 1)


def test_windows_stream_in_bounded_memory():
    """Ids given one at a time give the same windows, and a window is out before the stream ends."""
    ids = np.arange(1001)
    whole = list(doc_windows([ids], 16))
    pulled = []

    def one_by_one():
        for i in ids:
            pulled.append(i)
            yield np.array([i])
    it = doc_windows(one_by_one(), 16)
    first = next(it)
    assert len(pulled) <= 16 + 2                      # no more than a window's ids were read
    rest = [first] + list(it)
    assert len(rest) == len(whole)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
               for a, b in zip(rest, whole))


def test_documents_are_scored_each_from_its_start(model):
    tok = Tokenizer()
    docs = [_data(30, 1), b"", _data(5, 2), _data(50, 3)]
    r = score_documents(model, tok, docs)
    assert r["documents"] == 3 and r["bytes"] == 85
    want = sum(reference_score(model, tok, d)["bits"] for d in docs if d)
    assert abs(r["bits"] - want) < 1e-4 * r["bytes"]
    # pieces of a document, cut anywhere, are the document
    pieces = [(docs[0][:7], False), (docs[0][7:], True), (docs[2], True), (docs[3][:1], False),
              (b"", False), (docs[3][1:], True)]
    assert score_stream(model, tok, pieces)["bits"] == pytest.approx(r["bits"], rel=1e-9)


def test_threads_give_the_same_bits(model):
    tok = Tokenizer()
    data = _data(600, 4)        # 75 windows of 16: several chunks
    one = score(model, tok, data, workers=1)["bits"]
    assert score(model, tok, data, workers=2)["bits"] == one
    assert score(model, tok, data, workers=5)["bits"] == one


def test_window_nll_by_hand():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 5, 9)).astype(np.float32) * 4
    y = rng.integers(0, 7, (3, 5))
    m = (rng.random((3, 5)) < 0.6).astype(np.uint8)
    z = logits[..., :7].astype(np.float64)             # the last 2 columns do not count
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    want = -(np.take_along_axis(lp, y[..., None], -1)[..., 0] * m).sum(1)
    got = window_nll(logits, y, m, 7)
    assert got.dtype == np.float64
    assert np.allclose(got, want, rtol=1e-6, atol=1e-6)   # float32 log-softmax of |logits| < 20
    assert np.allclose(window_nll(logits, y, None, 7), -np.take_along_axis(lp, y[..., None], -1)[..., 0].sum(1),
                       rtol=1e-6, atol=1e-6)


gpu = pytest.mark.skipif(not cuda_available(), reason="needs CuPy and a GPU")


@gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_cuda_window_nll_matches_numpy(precision):
    """The CUDA twin on the same (rounded) logits: float32 log-softmax both sides, so 1e-5
    relative plus 1e-5 a row covers the differing exp/log and summation orders."""
    import cupy as cp
    from bytemodel.ops import get_backend
    from bytemodel.ops.cuda_score import window_nll as cuda_nll
    ops = get_backend("cuda", precision)
    rng = np.random.default_rng(1)
    for B, L, Vl, V in [(1, 1, 257, 257), (3, 37, 261, 257), (5, 200, 300, 33), (2, 1024, 257, 257)]:
        lg = ops.asarray(rng.standard_normal((B, L, Vl)).astype(np.float32) * 3).astype(ops.act_dtype)
        y = rng.integers(0, V, (B, L))
        m = (rng.random((B, L)) < 0.7).astype(np.uint8)
        host = cp.asnumpy(lg.astype(cp.float32))
        for mask in (m, None):
            got = cp.asnumpy(cuda_nll(lg, cp.asarray(y), None if mask is None else cp.asarray(mask), V))
            want = window_nll(host, y, mask, V)
            assert np.allclose(got, want, rtol=1e-5, atol=1e-5 * L), (precision, B, L, got, want)


@gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_score_matches_the_cpu_reference(model, precision):
    """Same weights on the GPU: fp32 within 1e-4 bits/byte of the CPU's float64 path; fp16 within
    2e-2 (fp16 weights and activations through 2 layers, logits of |8x init|)."""
    from bytemodel.ops import get_backend
    g = Model(model.cfg, get_backend("cuda", precision))
    g.load_flat(model.ops.to_numpy(model.params))
    tok = Tokenizer()
    for n in (9, 100, 333):
        a, b = score(g, tok, _data(n, n)), reference_score(model, tok, _data(n, n))
        assert a["tokens"] == b["tokens"]
        tol = 1e-4 if precision == "fp32" else 2e-2
        assert abs(a["bits_per_byte"] - b["bits_per_byte"]) < tol * max(1.0, b["bits_per_byte"])


@gpu
def test_cli_score_on_a_gpu_computes_in_fp16_by_default(tmp_path):
    """`score` / `eval --device cuda` compute as compress codes (fp16) unless --precision says
    otherwise: the default's line is the fp16 line to the bit, and not the fp32 one (6,000 bytes
    through fp16 rounding move the summed bits by far more than the one bit the line shows)."""
    from typer.testing import CliRunner
    from bytemodel.cli import app
    data = tmp_path / "x.bin"
    data.write_bytes(_data(6000, 5))
    from conftest import MODEL_FLAGS
    r = CliRunner()
    assert r.invoke(app, ["train", "--source", str(data), "--preset", "tiny", "--steps", "20",
                          "--out", str(tmp_path / "run")] + MODEL_FLAGS).exit_code == 0
    line = {p: r.invoke(app, ["score", str(data), "-c", str(tmp_path / "run"), "--device", "cuda"]
                        + (["--precision", p] if p else [])).output for p in ("", "fp16", "fp32")}
    assert line[""] == line["fp16"] != line["fp32"], line


def test_the_scored_tail_is_the_whole_forwards_last_rows():
    """forward_cached(keep=k): the last layer and the head for the last k positions only (the
    Scorer's CPU path) give the whole forward's last k rows of logits, to float32 rounding (the
    products run over fewer rows, so BLAS may block them otherwise: 1e-5 of logits of order 1)."""
    from bytemodel.gradcheck import tiny_config
    cfg = tiny_config(context=32)
    m = Model(cfg, numpy_ops)
    m.init_weights(3)
    x = np.random.default_rng(0).integers(0, cfg.vocab_size, (3, 32))
    none = [None] * cfg.n_layers
    whole = m.forward_cached(x, none, 0)
    for k in (1, 12, 31):
        tail = m.forward_cached(x, none, 0, keep=k)
        assert tail.shape == (3, k, cfg.vocab_size)
        np.testing.assert_allclose(tail, whole[:, -k:], rtol=1e-5, atol=1e-5)
    assert m.forward_cached(x, none, 0, keep=32).shape == whole.shape


@gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_gpu_scored_tail_is_the_whole_forwards_last_rows(precision):
    """The Scorer's tail on the GPU (queries a strided view of the last `keep` rows, keys and values
    every row: FlashAttention's query offset at head dim 64, the Hopper kernels on an H100 / H200):
    the whole forward's last rows. fp32 to 1e-4 (cuBLAS over fewer rows, float32 softmax sums);
    fp16 / bf16 to 2e-2 / 5e-2 of the largest logit (weights x4: logits up to ~16, so a row off by
    one is off by ~16; the products over fewer rows may round otherwise, 2^-10 / 2^-7 relative a
    rounding, a few roundings through 2 layers)."""
    from bytemodel.ops import get_backend
    cfg = ModelConfig(vocab_size=257, d_model=128, n_layers=2, n_heads=2, d_ff=256, context=256)
    m = Model(cfg, get_backend("cuda", precision))
    m.init_weights(4)
    ops = m.ops
    m.load_flat(ops.to_numpy(m.params).astype(np.float32) * 4)
    x = ops.asarray(np.random.default_rng(0).integers(0, 257, (3, 256)))
    none = [None] * cfg.n_layers
    whole = ops.to_numpy(m.forward_cached(x, none, 0)).astype(np.float64)
    tol = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 5e-2}[precision]
    for k in (1, 100, 128, 255):
        tail = ops.to_numpy(m.forward_cached(x, none, 0, keep=k)).astype(np.float64)
        assert tail.shape == (3, k, 257)
        assert np.abs(tail - whole[:, -k:]).max() < tol * np.abs(whole).max(), (precision, k)
