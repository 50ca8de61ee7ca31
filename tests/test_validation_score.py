"""Validation while training goes through the batched scoring path of `score` (issue 24): the
runner's window scorer (Runner.nll over scorer.Scorer) gives the held-out figures the per-token
losses of the model's training forward gave, on the plain corpus and on fine-tuning examples
(masked targets), and rows split over ranks add up to one rank's sums.

Tolerance 1e-4 bits/byte, the issue's bound: the paths differ only in where the float32
log-softmax is taken (the training loss kernel or ops/score_ops.window_nll) and in BLAS blocking
over other batch shapes; about 1e-7 is seen.
"""
import numpy as np
import pytest

from bytemodel.config import ModelConfig
from bytemodel.corpus import build_corpus
from bytemodel.model import Model
from bytemodel.ops import numpy_ops
from bytemodel.pairs import build_examples
from bytemodel.tokenizer import Tokenizer
from bytemodel.training.runner import Runner

CFG = dict(vocab_size=257, d_model=32, n_layers=2, n_heads=2, d_ff=64, context=16)


@pytest.fixture(scope="module")
def model():
    m = Model(ModelConfig(**CFG), numpy_ops)
    m.init_weights(3)
    m.load_flat(m.params * 8)   # spread the logits, so a wrong target, window or mask shows
    return m


def forward_nll(model):
    """The path validation took before: the training forward's per-token losses, summed per window
    over the counted targets in float64."""
    def nll(x, y, m):
        losses = np.asarray(model.forward(x, y), dtype=np.float64).reshape(x.shape)
        model._acts = None
        return (losses if m is None else losses * m).sum(axis=1)
    return nll


def _corpora(tmp_path):
    rng = np.random.default_rng(5)
    docs = [bytes(rng.integers(65, 75, 3000, dtype=np.uint8))]
    plain = build_corpus(docs, Tokenizer(), tmp_path / "plain", context=16)
    pairs = [(b"question %d? " % i, b"the answer is %d." % (i * 7)) for i in range(40)]
    examples = build_examples(tmp_path / "ex", Tokenizer(), "pairs", pairs[:30], pairs[30:])
    return {"plain": plain, "examples": examples}


@pytest.mark.parametrize("kind", ["plain", "examples"])
@pytest.mark.parametrize("max_tokens", [0, 100])
def test_validation_on_the_scorer_gives_the_figures_of_the_training_forward(tmp_path, model, kind, max_tokens):
    corpus = _corpora(tmp_path)[kind]
    runner = Runner(model, batch=4, workers=2)
    try:
        new_bpb, new_se = corpus.score(runner.nll, Tokenizer(), 16, max_tokens, runner.score_batch)
    finally:
        runner.close()
    old_bpb, old_se = corpus.score(forward_nll(model), Tokenizer(), 16, max_tokens, 16)
    assert np.isfinite(old_bpb) and abs(old_bpb - 8.0) > 1   # far from uniform logits (8 bits/byte)
    assert abs(new_bpb - old_bpb) < 1e-4
    assert np.isnan(new_se) == np.isnan(old_se) == (kind == "examples")
    if kind == "plain":
        assert abs(new_se - old_se) < 1e-4 * max(old_se, 1)


class _Rank:
    """One rank of a two-rank world whose all-reduce is left to the test (it adds the ranks' sums)."""
    size, local_size = 2, 1

    def __init__(self, rank):
        self.rank, self.main = rank, rank == 0

    def allreduce(self, a, what=""):
        return a


def test_rows_split_over_ranks_add_up_to_one_ranks_sums(model):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 257, (5, 16))
    y = rng.integers(0, 257, (5, 16))
    m = (rng.random((5, 16)) < 0.5).astype(np.uint8)
    one = Runner(model, batch=5, workers=1)
    ranks = [Runner(model, world=_Rank(r), batch=5, workers=1) for r in (0, 1)]
    for mask in (None, m):
        whole = one.nll(x, y, mask)
        parts = [r.nll(x, y, mask) for r in ranks]
        assert all(np.count_nonzero(p) in (2, 3) for p in parts)         # each rank scored its rows only
        assert np.array_equal(parts[0] + parts[1], whole)                # zeros elsewhere: exact
        assert np.allclose(whole, forward_nll(model)(x, y, mask), rtol=1e-6)
    assert ranks[0].score_batch == 2 * one.score_batch
