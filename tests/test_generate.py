"""Generation and scoring: deterministic, sized right, sampling rules honoured."""
import numpy as np
import pytest

import bytemodel
from bytemodel.errors import ConfigError
from bytemodel.decode.generate import sample_next


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from tests.conftest import FAST
    import numpy as np
    d = tmp_path_factory.mktemp("gen")
    rng = np.random.default_rng(0)
    (d / "toy.txt").write_text("".join(rng.choice(list("ACGT"), 3000)))
    r = bytemodel.train(d / "toy.txt", d / "run", steps=10, **{**FAST, "model": dict(FAST["model"])})
    return bytemodel.load(r.run_dir)


def test_same_seed_same_bytes(lm):
    a = lm.generate(300, seed=5)
    assert len(a) == 300
    assert a == lm.generate(300, seed=5)
    assert a != lm.generate(300, seed=6)


def test_generation_longer_than_the_context(lm):
    out = lm.generate(3 * lm.cfg.context + 7, prompt=b"ACGT", seed=1)
    assert len(out) == 3 * lm.cfg.context + 7


def test_greedy_is_argmax_and_top_k_1_equals_greedy(lm):
    assert lm.generate(50, temperature=0) == lm.generate(50, top_k=1, seed=9)


def test_sample_next_rules():
    rng = np.random.default_rng(0)
    logits = np.array([0.0, 5.0, 4.9, -3.0])
    assert sample_next(logits, rng, temperature=0) == 1
    picks = {sample_next(logits, rng, top_k=2) for _ in range(200)}
    assert picks == {1, 2}
    picks = {sample_next(logits, rng, top_p=0.4) for _ in range(50)}
    assert picks == {1}  # the top id alone holds more than 40% of the mass


@pytest.mark.parametrize("kw", [{"temperature": -1}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}])
def test_bad_sampling_settings(lm, kw):
    with pytest.raises(ConfigError):
        lm.generate(10, **kw)


def test_score_counts_every_byte_once(lm):
    data = b"ACGT" * 40  # longer than the context (32): several overlapping windows
    r = lm.score(data)
    assert r["bytes"] == 160 and r["tokens"] == 160
    # within one window the score is exactly the training loss of (separator + data) -> data
    head = lm.score(data[:20])
    ids = np.array([[lm.tokenizer.doc_id] + list(data[:20])])
    nats = lm.model.forward(ids[:, :-1], ids[:, 1:]).astype(np.float64).sum()
    assert abs(head["bits"] - nats / np.log(2)) < 1e-3 * head["bits"]
    # across windows: the first context's targets are scored in the first window; every later
    # target once, in a window that starts context/2 tokens before the unscored ones
    T = lm.cfg.context
    ids = np.array([lm.tokenizer.doc_id] + list(data))
    want, start, done = 0.0, 0, 0
    while done < len(data):
        end = min(start + T, len(data))
        nats = lm.model.forward(ids[None, start:end], ids[None, start + 1:end + 1]).astype(np.float64)
        want += nats[done - start:].sum()
        done, start = end, end - T // 2
    assert abs(r["bits"] - want / np.log(2)) < 1e-3 * r["bits"]


def test_stop_at_document_end(lm, monkeypatch):
    """With the sampler forced to end the document after four bytes, generation stops there when
    asked (--one-document) and otherwise goes on: <doc> itself gives no bytes."""
    import bytemodel.decode.generate as g
    calls = []

    def fake(logits, rng, *a, **k):
        calls.append(1)
        return lm.tokenizer.doc_id if len(calls) == 5 else 65   # 'A' four times, then <doc>
    monkeypatch.setattr(g, "sample_next", fake)
    assert lm.generate(100, stop_at_doc_end=True) == b"AAAA"
    calls.clear()
    assert lm.generate(100, stop_at_doc_end=False) == b"A" * 100


def test_sample_next_is_one_uniform_and_the_cdf():
    """sample_next draws what Generator.choice(V, p=p) draws from the same state: u = rng.random()
    and the first id whose normalised cumulative probability exceeds u (written out in sampling.py;
    choice is the reference): the rule the GPU sampler implements from the same PCG64 state
    (gpu/decode.cu), so both devices share the seed semantics."""
    from bytemodel.sampling import sampling_probs
    r = np.random.default_rng(1)
    a, b, c = np.random.default_rng(7), np.random.default_rng(7), np.random.default_rng(7)
    for kw in [{}, {"top_k": 5}, {"top_p": 0.8, "temperature": 0.7}, {"temperature": 1.3}]:
        for _ in range(100):
            logits = r.standard_normal(257) * 3
            p = sampling_probs(logits, **kw)
            cdf = np.cumsum(p)
            cdf /= cdf[-1]
            got = sample_next(logits, a, **kw)
            assert got == int(b.choice(p.size, p=p))
            assert got == int(np.searchsorted(cdf, c.random(), side="right"))


def test_pcg64_arithmetic_of_the_gpu_sampler():
    """gpu/decode.cu advances each stream's PCG64 state with 64-bit halves (hi, lo); the same
    arithmetic written here in Python gives NumPy's Generator.random() doubles."""
    from bytemodel.sampling import rng_states
    M64 = (1 << 64) - 1
    MH, ML = 2549297995355413924, 4865540595714422341
    for seed in (0, 1, 12345):
        sh, sl, ih, il = (int(v) for v in rng_states(seed, 1)[0])
        want = np.random.default_rng(seed).random(20)
        for w in want:
            lo = (sl * ML) & M64
            hi = ((sl * ML >> 64) + sl * MH + sh * ML) & M64
            lo2 = (lo + il) & M64
            hi = (hi + ih + (lo2 < lo)) & M64
            sh, sl = hi, lo2
            xr, rot = hi ^ lo2, hi >> 58
            out = ((xr >> rot) | (xr << ((64 - rot) & 63))) & M64
            assert (out >> 11) * 2.0 ** -53 == w


def test_samples_batched(lm):
    outs = lm.generate(120, seed=3, samples=4)
    assert isinstance(outs, list) and len(outs) == 4 and all(len(o) == 120 for o in outs)
    assert outs == lm.generate(120, seed=3, samples=4)     # same seed, same batch: same bytes
    assert len(set(outs)) > 1                               # independent streams
    # longer than the context: every sample restarts from its own recent half
    long = lm.generate(2 * lm.cfg.context + 5, prompt=b"AC", seed=1, samples=3)
    assert [len(o) for o in long] == [2 * lm.cfg.context + 5] * 3


def test_samples_greedy_agree_with_one(lm):
    """Greedy draws nothing: every sample of a batch is the single greedy continuation (a batched
    row is the same product as a lone one up to float32 rounding, far below the logit gaps of
    this model)."""
    one = lm.generate(80, prompt=b"ACGT", temperature=0)
    assert lm.generate(80, prompt=b"ACGT", temperature=0, samples=3) == [one] * 3


def test_bad_samples(lm):
    with pytest.raises(ConfigError):
        lm.generate(10, samples=0)
    with pytest.raises(ConfigError):
        lm.generate(10, samples=2, on_bytes=print)


def test_draws_that_give_no_bytes_end_a_sample_instead_of_looping(lm, monkeypatch):
    """A model whose likeliest id is always <doc> (greedy on a barely trained one) gave no bytes
    for ever without stopping at a document's end: generation never returned. Now a sample ends
    after MAX_EMPTY_DRAWS such draws in a row, short, on the plain and the batched path, and the
    CLI says so in one note. The fake sampler raises past 4x the cap, so without it this fails
    instead of hanging."""
    import bytemodel.decode.generate as g
    from conftest import cli
    calls = []

    def stuck(logits, rng, *a, **k):
        calls.append(1)
        if len(calls) > 4 * g.MAX_EMPTY_DRAWS:
            raise AssertionError("generation kept drawing ids that give no bytes")
        return 65 if len(calls) <= 3 else lm.tokenizer.doc_id      # 'A' three times, then <doc> only
    monkeypatch.setattr(g, "sample_next", stuck)
    assert lm.generate(100) == b"AAA" and len(calls) == 3 + g.MAX_EMPTY_DRAWS
    calls.clear()
    a, b = lm.generate(100, samples=2)                                 # the batched path: both stop
    assert (a, b) == (b"AA", b"A") and len(calls) == 3 + 2 * g.MAX_EMPTY_DRAWS   # draws alternate
    calls.clear()
    code, out = cli(["generate", "-c", lm.path, "-n", "100", "--any-byte"])
    assert code == 0 and "stopped short (3 of 100 bytes" in out, out
    # a sparse <doc> now and then resets the count: a long output is still produced in full
    calls.clear()
    monkeypatch.setattr(g, "sample_next", lambda *a, **k: (calls.append(1), 67 if len(calls) % 50 else lm.tokenizer.doc_id)[1])
    assert lm.generate(600) == b"C" * 600
