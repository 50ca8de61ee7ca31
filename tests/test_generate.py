"""Generation and scoring: deterministic, sized right, sampling rules honoured."""
import numpy as np
import pytest

import bytemodel
from bytemodel.errors import ConfigError
from bytemodel.generate import sample_next


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
    import bytemodel.generate as g
    calls = []

    def fake(logits, rng, *a, **k):
        calls.append(1)
        return lm.tokenizer.doc_id if len(calls) == 5 else 65   # 'A' four times, then <doc>
    monkeypatch.setattr(g, "sample_next", fake)
    assert lm.generate(100, stop_at_doc_end=True) == b"AAAA"
    calls.clear()
    assert lm.generate(100, stop_at_doc_end=False) == b"A" * 100
