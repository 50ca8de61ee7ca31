"""The corpus (corpus.py): the token file, the sampler, validation's figure, and the protocol every
corpus a run trains on answers (sample, score, verify), plain data and fine-tuning examples alike."""
import numpy as np
import pytest

from bytemodel.corpus import build_corpus, sample_batch
from bytemodel.errors import SourceError
from bytemodel.pairs import build_examples
from bytemodel.tokenizer import Tokenizer


def test_sampler_is_a_pure_function_of_seed_and_step():
    tokens = np.arange(1000, dtype=np.uint16)
    a = sample_batch(tokens, 4, 16, seed=7, step=3)
    b = sample_batch(tokens, 4, 16, seed=7, step=3)
    c = sample_batch(tokens, 4, 16, seed=7, step=4)
    assert (a[0] == b[0]).all() and not (a[0] == c[0]).all()
    assert (a[1] == a[0] + 1).all()  # targets are the next tokens


def test_corpus_from_pieces_equals_corpus_from_documents(tmp_path):
    from bytemodel.corpus import build_corpus
    from bytemodel.tokenizer import Tokenizer
    docs = [bytes(range(256)) * 3, b"second document", b"third" * 50]
    pieces = [(d[i:i + 100], i + 100 >= len(d)) for d in docs for i in range(0, len(d), 100)]
    a = build_corpus(docs, Tokenizer(), tmp_path / "a", context=16)
    b = build_corpus(None, Tokenizer(), tmp_path / "b", context=16, pieces=pieces)
    assert a.sha256 == b.sha256 and a.n_docs == b.n_docs == 3 and a.n_bytes == b.n_bytes
    assert int((np.asarray(a.tokens) == 256).sum()) == 3  # one separator after each document


def test_validation_standard_error_by_hand():
    """score_tokens' figure and standard error against the ratio-estimate formula, computed by
    hand over the windows, with a stand-in model whose loss for target y is y / 100 nats."""
    from bytemodel.corpus import LN2, eval_windows, score_tokens
    from bytemodel.tokenizer import Tokenizer
    nll = lambda x, y, m: (y / 100.0).astype(np.float32).astype(np.float64).sum(axis=1)   # noqa: E731
    tokens = np.random.default_rng(3).integers(0, 256, 1000).astype(np.uint16)
    bpb, nats, se = score_tokens(nll, tokens, Tokenizer(), 32, 0)
    wins = list(eval_windows(tokens, 32, 10 ** 9))
    bits = np.array([(y / 100.0).astype(np.float32).astype(np.float64).sum() / LN2 for _, y in wins])
    nb = np.array([y.size for _, y in wins], dtype=float)      # plain bytes: one byte per token
    r = bits.sum() / nb.sum()
    n = len(wins)
    assert n == 32 and bpb == pytest.approx(r, rel=1e-12)
    assert se == pytest.approx(np.sqrt(((bits - r * nb) ** 2).sum() / (n * (n - 1))) / nb.mean(), rel=1e-9)
    # and a subset (eval_tokens) scores fewer windows
    bpb8, _, se8 = score_tokens(nll, tokens, Tokenizer(), 32, 8 * 32)
    assert bpb8 != bpb and se8 > se


def _corpora(tmp_path):
    rng = np.random.default_rng(5)
    docs = [bytes(rng.integers(65, 70, 3000, dtype=np.uint8))]
    plain = build_corpus(docs, Tokenizer(), tmp_path / "plain", context=16)
    pairs = [(b"q%d " % i, b"answer %d." % i) for i in range(12)]
    examples = build_examples(tmp_path / "ex", Tokenizer(), "pairs", pairs[:9], pairs[9:])
    return {"plain": (plain, tmp_path / "plain"), "examples": (examples, tmp_path / "ex")}


@pytest.mark.parametrize("kind", ["plain", "examples"])
def test_both_corpora_answer_the_protocol(tmp_path, kind):
    """sample -> x, y (B, T) and a mask or None; score -> bits per byte of the held-out part under
    a stand-in model (every target 1 nat: 1/ln 2 bits per token); verify passes, then refuses a
    changed token file."""
    corpus, run_dir = _corpora(tmp_path)[kind]
    x, y, mask = corpus.sample(4, 16, seed=1, step=2)
    again = corpus.sample(4, 16, seed=1, step=2)
    assert x.shape == y.shape == (4, 16) and np.array_equal(again[0], x)      # pure in (seed, step)
    assert (mask is None) == (kind == "plain") and (mask is None or mask.shape == (4, 16))
    ones = lambda x, y, m: (np.ones(y.shape) if m is None else m).sum(axis=1).astype(np.float64)   # noqa: E731
    bpb, se = corpus.score(ones, Tokenizer(), 16, 10 ** 6)
    # one byte per counted token, except the <doc> that ends each example (no bytes, its bits count)
    assert bpb >= 1 / np.log(2) - 1e-9 and np.isfinite(bpb)
    assert np.isfinite(se) == (kind == "plain")                              # examples: no spread kept
    corpus.verify(257, run_dir)
    tokens = run_dir / "tokens.u16"
    raw = bytearray(tokens.read_bytes())
    raw[10] ^= 1
    tokens.write_bytes(bytes(raw))
    with pytest.raises(SourceError):
        _corpora_reopen(kind, run_dir).verify(257, run_dir)


def _corpora_reopen(kind, run_dir):
    from bytemodel.training.prepare import open_run_corpus
    return open_run_corpus(run_dir, "pairs" if kind == "examples" else "")
