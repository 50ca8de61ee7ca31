"""fasta:revcomp: IUPAC reverse complement, added to the training documents only."""
import numpy as np
import pytest

import bytemodel
from bytemodel.corpus import open_corpus
from bytemodel.errors import SourceError
from bytemodel.readers import get_reader
from bytemodel.readers.fasta import reverse_complement


def test_reverse_complement_by_hand():
    assert reverse_complement(b"ACGT") == b"ACGT"                 # a palindrome
    assert reverse_complement(b"AACG") == b"CGTT"
    assert reverse_complement(b"acgTN") == b"NAcgt"               # case kept, N stays N
    assert reverse_complement(b"RYKMBVDHSW") == b"WSDHBVKMRY"     # IUPAC pairs; S and W are their own
    assert reverse_complement(b"U-.*") == b"*.-A"                 # U pairs with A; gaps and stops stay
    seq = b"ACGTRYKMBVDHSWNacgtrykmbvdhswn-"
    assert reverse_complement(reverse_complement(seq)) == seq
    with pytest.raises(SourceError, match="'E' is not a nucleotide"):
        reverse_complement(b"MEEP")                              # a protein


def test_reader_option():
    r = get_reader("fasta:revcomp")
    assert r.augments and r.training_copies(b"AAC") == [b"GTT"]
    assert not get_reader("fasta").augments and get_reader("fasta").training_copies(b"AAC") == []


def _docs(ids, doc_id=256):
    """Token ids (plain bytes) split at the document separator, empty pieces dropped."""
    out, cur = [], []
    for t in np.asarray(ids):
        if t == doc_id:
            if cur:
                out.append(bytes(cur))
            cur = []
        else:
            cur.append(int(t))
    if cur:
        out.append(bytes(cur))
    return out


def test_revcomp_reaches_training_only(tmp_path, fast_settings):
    rng = np.random.default_rng(0)
    recs = ["".join(rng.choice(list("ACGT"), n)) for n in (900, 700, 800)]
    fa = tmp_path / "g.fa"
    fa.write_text("".join(f">r{i}\n{s}\n" for i, s in enumerate(recs)))
    s = {**fast_settings, "steps": 1}
    plain = bytemodel.train(fa, tmp_path / "plain", reader="fasta", **s)
    rc = bytemodel.train(fa, tmp_path / "rc", reader="fasta:revcomp", **s)
    a, b = open_corpus(plain.run_dir), open_corpus(rc.run_dir)
    assert np.array_equal(np.asarray(a.val), np.asarray(b.val))          # the same held-out tail
    assert np.array_equal(np.asarray(b.train[:a.split]), np.asarray(a.train))
    # after the training part: one reverse complement per training document; the record that the
    # split cuts (the third) contributes only its training part
    extra = _docs(b.train[a.split:])
    assert extra == [reverse_complement(d) for d in _docs(a.train)] and len(extra) == 3
    assert len(extra[2]) < 800
    # the held-out bases appear in training neither as they are nor reverse-complemented
    train_bytes = b"".join(_docs(b.train))
    probe = _docs(a.val)[0][:40]
    assert probe not in train_bytes and reverse_complement(probe) not in train_bytes
    assert b.n_docs == a.n_docs + 3


# ---------------------------------------------------------------- revcomp auto (training/autoconf.py)

def _genome(tmp_path, name="g.fa", letters="ACGT"):
    rng = np.random.default_rng(1)
    recs = ["".join(rng.choice(list(letters), n)) for n in (900, 700, 800)]
    fa = tmp_path / name
    fa.write_text("".join(f">r{i}\n{s}\n" for i, s in enumerate(recs)))
    return fa


def test_auto_revcomp_rule():
    from bytemodel.training.autoconf import REVCOMP_SMALL_DATA, auto_revcomp
    assert auto_revcomp(1_000_000, "cuda") and auto_revcomp(REVCOMP_SMALL_DATA, "cuda")
    assert not auto_revcomp(REVCOMP_SMALL_DATA + 1, "cuda") and not auto_revcomp(18_000_000, "cuda")
    assert not auto_revcomp(1_000_000, "cpu")


def test_auto_revcomp_decision_for_a_gpu_run(tmp_path, fast_settings):
    """The rule as prepare applies it, for a run on a GPU (the corpus built here on the CPU)."""
    from bytemodel.config import TrainConfig
    from bytemodel.tokenizer import Tokenizer
    from bytemodel.training.prepare import _augmenting_reader
    fa = _genome(tmp_path)
    run = bytemodel.train(fa, tmp_path / "plain", **{**fast_settings, "steps": 1})
    corpus, tok = open_corpus(run.run_dir), Tokenizer()
    reader, auto = _augmenting_reader(TrainConfig(source=str(fa), device="cuda"), corpus, tok)
    assert auto and reader.augments                                       # detected FASTA, small, GPU
    reader, auto = _augmenting_reader(TrainConfig(source=str(fa), device="cuda", reader="fasta:case=upper"), corpus, tok)
    assert auto and reader.augments and reader.options["case"] == "upper"  # the given options kept
    for given in ("fasta:revcomp=no", "text", "raw"):                      # turned off, or not FASTA
        assert _augmenting_reader(TrainConfig(source=str(fa), device="cuda", reader=given), corpus, tok) == (None, False)
    assert _augmenting_reader(TrainConfig(source=str(fa), device="cpu"), corpus, tok) == (None, False)
    reader, auto = _augmenting_reader(TrainConfig(source=str(fa), device="cpu", reader="fasta:revcomp"), corpus, tok)
    assert reader.augments and not auto                                    # asked for: on any device
    prot = _genome(tmp_path, "p.fa", "ACDEFGHIKLMNPQRSTVWY")               # a protein FASTA: no strand
    run = bytemodel.train(prot, tmp_path / "prot", **{**fast_settings, "steps": 1})
    assert _augmenting_reader(TrainConfig(source=str(prot), device="cuda"), open_corpus(run.run_dir), tok) == (None, False)
    (tmp_path / "mixed").mkdir()                                           # FASTA beside a text file
    (tmp_path / "mixed" / "g.fa").write_text(fa.read_text())
    (tmp_path / "mixed" / "notes.txt").write_text("ACGT " * 100)
    assert _augmenting_reader(TrainConfig(source=str(tmp_path / "mixed"), device="cuda"), corpus, tok) == (None, False)


def test_auto_revcomp_in_a_run(tmp_path, fast_settings, monkeypatch):
    """Where the rule says yes, a run with the reader detected trains on the same corpus as
    fasta:revcomp, says so in one note line, and records the reader as plain fasta; on the CPU
    (the rule as it is) nothing is added."""
    from bytemodel.training import prepare
    fa = _genome(tmp_path)
    s = {**fast_settings, "steps": 1}
    cpu = bytemodel.train(fa, tmp_path / "cpu", **s)
    given = bytemodel.train(fa, tmp_path / "given", reader="fasta:revcomp", **s)
    monkeypatch.setattr(prepare, "auto_revcomp", lambda n, device: True)
    lines = []
    auto = bytemodel.train(fa, tmp_path / "auto", log=lines.append, **s)
    assert sum("reverse strand: each training record's reverse complement added" in x for x in lines) == 1
    a, g, c = open_corpus(auto.run_dir), open_corpus(given.run_dir), open_corpus(cpu.run_dir)
    assert np.array_equal(np.asarray(a.tokens), np.asarray(g.tokens)) and a.n_docs == c.n_docs + 3
    assert len(c.train) < len(a.train) and np.array_equal(np.asarray(c.val), np.asarray(a.val))
    off = bytemodel.train(fa, tmp_path / "off", reader="fasta:revcomp=no", **s)
    assert np.array_equal(np.asarray(open_corpus(off.run_dir).tokens), np.asarray(c.tokens))
