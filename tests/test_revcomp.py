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
