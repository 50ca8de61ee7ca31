"""audio:invert: each training clip again with its polarity inverted, in every encoding, training only."""
import numpy as np
import pytest

import bytemodel
from bytemodel.corpus import open_corpus
from bytemodel.readers import get_reader
from bytemodel.readers.audio import inverted

pytest.importorskip("soundfile")


def test_inverted_by_hand():
    x = np.array([0, 1, -1, 1000, -32768, 32767], dtype=np.int16)
    assert inverted(x).tolist() == [0, -1, 1, -1000, 32767, -32767]


@pytest.mark.parametrize("encoding", ["pcm16", "pcm16msb", "mulaw"])
def test_training_copy_is_the_negated_samples(encoding):
    r = get_reader(f"audio:encoding={encoding},invert=yes")
    assert r.augments and not get_reader(f"audio:encoding={encoding}").augments
    x = np.random.default_rng(1).integers(-32768, 32768, 500).astype(np.int16)
    doc = r.encode(x)
    (copy,) = r.training_copies(doc)
    assert len(copy) == len(doc)
    want = inverted(r.decode(doc))
    assert np.array_equal(r.decode(copy), want)
    if encoding == "mulaw":          # mu-law is symmetric: the copy is the sign bit flipped
        assert copy == bytes(b ^ 0x80 for b in doc)
    assert get_reader(f"audio:encoding={encoding}").training_copies(doc) == []


def _clips(tmp_path):
    sf = pytest.importorskip("soundfile")
    rng = np.random.default_rng(0)
    src = tmp_path / "clips"
    src.mkdir()
    for i, n in enumerate((900, 700, 800)):
        t = np.arange(n)
        wave = (3000 * np.sin(t / (3 + i)) + rng.normal(0, 200, n)).astype(np.int16)
        sf.write(str(src / f"c{i}.wav"), wave, 8000, subtype="PCM_16")
    return src


def test_invert_reaches_training_only(tmp_path, fast_settings):
    src = _clips(tmp_path)
    s = {**fast_settings, "steps": 1}
    plain = bytemodel.train(src, tmp_path / "plain", reader="audio:encoding=pcm16", **s)
    inv = bytemodel.train(src, tmp_path / "inv", reader="audio:encoding=pcm16,invert=yes", **s)
    a, b = open_corpus(plain.run_dir), open_corpus(inv.run_dir)
    assert np.array_equal(np.asarray(a.val), np.asarray(b.val))          # the same held-out tail
    assert np.array_equal(np.asarray(b.train[:a.split]), np.asarray(a.train))
    r = get_reader("audio:encoding=pcm16")
    pieces, copies = _documents(a.train), _documents(b.train[a.split:])
    assert len(copies) == len(pieces) == 3         # the third clip is cut by the split: its training part
    for p, c in zip(pieces, copies):
        assert np.array_equal(r.decode(c), inverted(r.decode(p)))


def _documents(ids, doc_id=256) -> list[bytes]:
    """Token ids (plain bytes) -> the documents between separators, as bytes."""
    ids = np.asarray(ids)
    cuts = np.flatnonzero(ids == doc_id)
    return [bytes(ids[s:e].astype(np.uint8)) for s, e in zip(np.r_[0, cuts + 1], np.r_[cuts, len(ids)]) if e > s]


def test_auto_invert_rule():
    from bytemodel.training.autoconf import INVERT_SMALL_DATA, auto_invert
    assert auto_invert(3_000_000, "cuda") and auto_invert(INVERT_SMALL_DATA, "cuda")
    assert not auto_invert(INVERT_SMALL_DATA + 1, "cuda") and not auto_invert(1_000_000, "cpu")


def test_auto_invert_decision_and_run(tmp_path, fast_settings, monkeypatch):
    """prepare's rule for a GPU run on audio (the corpus built here on the CPU): the detected or
    given audio reader gains invert, its options kept; invert=no, another reader or the CPU, none.
    Where it says yes a run trains on the same tokens as audio:invert=yes, with one note line."""
    from bytemodel.config import TrainConfig
    from bytemodel.tokenizer import Tokenizer
    from bytemodel.training import prepare
    from bytemodel.training.prepare import _augmenting_reader
    src = _clips(tmp_path)
    s = {**fast_settings, "steps": 1}
    cpu = bytemodel.train(src, tmp_path / "cpu", reader="audio:encoding=pcm16", **s)
    corpus, tok = open_corpus(cpu.run_dir), Tokenizer()
    reader, auto = _augmenting_reader(TrainConfig(source=str(src), device="cuda"), corpus, tok)
    assert auto and reader.augments and reader.name == "audio"            # detected audio, small, GPU
    reader, auto = _augmenting_reader(TrainConfig(source=str(src), device="cuda", reader="audio:encoding=pcm16"),
                                      corpus, tok)
    assert auto and reader.augments and reader.options["encoding"] == "pcm16"
    for given in ("audio:invert=no", "raw"):
        assert _augmenting_reader(TrainConfig(source=str(src), device="cuda", reader=given), corpus, tok) == (None, False)
    assert _augmenting_reader(TrainConfig(source=str(src), device="cpu"), corpus, tok) == (None, False)
    given = bytemodel.train(src, tmp_path / "given", reader="audio:encoding=pcm16,invert=yes", **s)
    monkeypatch.setattr(prepare, "auto_invert", lambda n, device: True)
    lines = []
    auto = bytemodel.train(src, tmp_path / "auto", reader="audio:encoding=pcm16", log=lines.append, **s)
    assert sum("inverted polarity: each training clip added again" in x for x in lines) == 1
    a, g, c = open_corpus(auto.run_dir), open_corpus(given.run_dir), open_corpus(cpu.run_dir)
    assert np.array_equal(np.asarray(a.tokens), np.asarray(g.tokens)) and a.n_docs == c.n_docs + 3
