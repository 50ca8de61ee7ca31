"""Byte-level BPE: hand-checked merges, a slow obvious reference, round trips, files, CLI.

Tie-break rule under test: the pair with the highest count of adjacent windows (overlapping ones
counted: a a a holds (a, a) twice) wins; among equal counts the smallest pair (a, then b) wins.
Merging replaces occurrences leftmost first, without overlap.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from bytemodel.errors import TokenizerError
from bytemodel.tokenizer import Tokenizer
from bytemodel.tokenizer.encode import apply_merges, encode_bytes, encode_chunks
from bytemodel.tokenizer.pretok import pre_split_pieces
from bytemodel.tokenizer.train import sample_segments, train_bpe
from conftest import cli, leftovers, refused

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the slow, obvious reference

def merge_once(ids: list[int], pair: tuple[int, int], t: int) -> list[int]:
    out, j = [], 0
    while j < len(ids):
        if j + 1 < len(ids) and (ids[j], ids[j + 1]) == pair:
            out.append(t)
            j += 2
        else:
            out.append(ids[j])
            j += 1
    return out


def naive_train(docs: list[bytes], n: int) -> tuple[list[tuple[int, int]], list[list[int]]]:
    """Recount every pair after every merge; highest count, then smallest pair."""
    seqs = [list(d) for d in docs]
    merges = []
    for i in range(n):
        c = Counter()
        for ids in seqs:
            c.update(zip(ids, ids[1:]))
        if not c:
            break
        pair, cnt = min(c.items(), key=lambda kv: (-kv[1], kv[0]))
        if cnt < 2:
            break
        merges.append(pair)
        seqs = [merge_once(s, pair, 256 + i) for s in seqs]
    return merges, seqs


def naive_encode(data: bytes, merges) -> list[int]:
    ids = list(data)
    for i, pair in enumerate(merges):
        ids = merge_once(ids, tuple(pair), 256 + i)
    return ids


def real_text() -> bytes:
    """Real text without shipping any: this package's own source files."""
    return b"".join(p.read_bytes() for p in sorted((ROOT / "bytemodel").glob("*.py")))


def real_dna() -> bytes:
    p = ROOT / "datasets" / "lambda_virus.fa"
    if p.exists():
        return p.read_bytes()
    rng = np.random.default_rng(7)
    return bytes(np.frombuffer(b"ACGT", np.uint8)[rng.integers(0, 4, 48000)])


@pytest.fixture(scope="module")
def text_tok() -> Tokenizer:
    return Tokenizer(train_bpe(real_text(), 300))


@pytest.fixture(scope="module")
def random_tok() -> Tokenizer:
    rng = np.random.default_rng(1)
    data = bytes(rng.integers(0, 256, 20000).astype(np.uint8)) + bytes(rng.integers(0, 3, 20000).astype(np.uint8))
    return Tokenizer(train_bpe(data, 200))


# ---------------------------------------------------------------- hand-checked corpora

def test_wikipedia_example():
    # aaabdaaabac: (a,a) 4 windows -> Z: ZabdZabac. Then (Z,a)=(256,97) and (a,b)=(97,98) both
    # count 2; the smaller pair (97,98) wins -> Y: ZYdZYac. Then (Z,Y) -> X: XdXac.
    merges = train_bpe(b"aaabdaaabac", 3)
    assert merges == [(97, 97), (97, 98), (256, 257)]
    tok = Tokenizer(merges)
    assert tok.encode(b"aaabdaaabac").tolist() == [258, ord("d"), 258, ord("a"), ord("c")]
    assert tok.decode(tok.encode(b"aaabdaaabac")) == b"aaabdaaabac"


def test_tie_break_smallest_pair_first():
    # cdcdabab: (c,d) and (a,b) both 2; (97,98) < (99,100) so ab goes first, then cd.
    assert train_bpe(b"cdcdabab", 2) == [(97, 98), (99, 100)]


def test_runs_merge_leftmost_without_overlap():
    # aaaaa: (a,a) x4 -> Z Z a; then (Z,Z) 1, (Z,a) 1 -> nothing occurs twice.
    assert train_bpe(b"aaaaa", 1) == [(97, 97)]
    assert apply_merges(np.frombuffer(b"aaaaa", np.uint8), [(97, 97)]).tolist() == [256, 256, 97]
    with pytest.raises(TokenizerError, match="only 1 merges"):
        train_bpe(b"aaaaa", 2)


def test_documents_do_not_merge_across():
    # "ab" occurs once in each document plus once across the boundary of a joined string
    assert train_bpe([b"xab", b"y", b"abz"], 1) == [(97, 98)]
    with pytest.raises(TokenizerError):  # joined, "xabyab" would hold (a, b) twice
        train_bpe([b"xa", b"bya", b"b"], 1)


def test_identical_documents_are_weighted():
    assert train_bpe([b"qz"] * 3 + [b"abab"], 1) == [(113, 122)]  # qz 3x beats ab 2x


# ---------------------------------------------------------------- against the reference

@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=0, max_size=200), min_size=1, max_size=4),
       st.integers(min_value=1, max_value=4), st.integers(min_value=1, max_value=25))
def test_train_matches_naive(docs, alphabet, n):
    docs = [bytes(b % alphabet + 97 for b in d) for d in docs]  # small alphabets: many ties, runs
    want, segs = naive_train(docs, n)
    if not any(docs):
        with pytest.raises(TokenizerError):
            train_bpe(docs, n)
        return
    if len(want) < n:
        with pytest.raises(TokenizerError):
            train_bpe(docs, n)
        return
    got = train_bpe(docs, n)
    assert got == want
    for d, s in zip(docs, segs):  # encoding the training data gives the training segmentation
        assert encode_bytes(d, got).tolist() == s


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 2**32 - 1), st.integers(1, 60))
def test_apply_merges_matches_naive_on_random_merges(data, seed, m):
    rng = np.random.default_rng(seed)
    data = bytes(b % 5 for b in data) if seed % 2 else data  # half the time a tiny alphabet
    merges = []
    for i in range(m):  # random valid merge lists, duplicates and (x, x) included
        hi = 256 + i if rng.random() < 0.5 else 0
        pool = list(range(5)) + list(range(256, 256 + i)) if not hi else list(range(256 + i))
        merges.append((int(rng.choice(pool)), int(rng.choice(pool))))
    got = apply_merges(np.frombuffer(data, np.uint8), merges)
    assert got.dtype == np.uint16
    assert got.tolist() == naive_encode(data, merges)


def test_apply_merges_on_real_text_matches_naive(text_tok):
    data = real_text()[:6000]
    assert text_tok.encode(data).tolist() == naive_encode(data, text_tok.merges)


def test_apply_merges_repeated_pair_uses_lowest_rank():
    # (256, 99) at ranks 1 and 3: rank 1 applies before (99, 100) at rank 2 can take the c
    merges = [(97, 98), (256, 99), (99, 100), (256, 99)]
    assert apply_merges(np.frombuffer(b"abcd", np.uint8), merges).tolist() == [257, 100]
    assert naive_encode(b"abcd", merges) == [257, 100]


def test_apply_merges_accepts_merged_ids():
    merges = [(97, 98), (256, 99), (99, 99)]
    ids = np.array([256, 99, 97, 98, 99, 99], dtype=np.uint16)
    # 256 99 (97 98) 99 99 -> 256 99 256 99 99 -> 257 257 99; (99, 99) no longer occurs
    assert apply_merges(ids, merges).tolist() == [257, 257, 99]


# ---------------------------------------------------------------- round trips

@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=2000))
def test_round_trip_random_bytes(text_tok, random_tok, data):
    for tok in (text_tok, random_tok):
        ids = tok.encode(data)
        assert ids.dtype == np.uint16
        assert tok.decode(ids) == data


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=500))
def test_round_trip_invalid_utf8_and_zero(text_tok, data):
    data = b"\x00\xff\xfe" + data + "é".encode()[:1] + b"\x00"
    assert text_tok.decode(text_tok.encode(data)) == data


def test_round_trip_dna():
    dna = real_dna()
    tok = Tokenizer(train_bpe(dna, 256))
    ids = tok.encode(dna)
    assert len(ids) < len(dna) / 2.5
    assert tok.decode(ids) == dna


def test_decode_equals_joining_each_ids_bytes(text_tok):
    ids = np.arange(text_tok.vocab_size, dtype=np.uint16)  # every id, the <doc> special included
    assert text_tok.decode(ids) == b"".join(text_tok.vocab[i] for i in ids)
    assert text_tok.decode(ids[-1:]) == b""                 # <doc> gives no bytes
    with pytest.raises(TokenizerError):
        text_tok.decode(np.array([text_tok.vocab_size]))


# ---------------------------------------------------------------- pre-split

@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=300))
def test_text_pieces_join_back(data):
    assert b"".join(pre_split_pieces(data, "text")) == data


def test_pre_split_text():
    text = real_text()
    tok = Tokenizer.train(text, 200, pre_split="text")
    pieces = set(pre_split_pieces(text, "text"))
    for v in tok.vocab[256:256 + tok.n_merges]:  # learned tokens never span two pieces
        assert any(v in p for p in pieces)
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    # the pre-split encoding equals encoding each piece on its own
    sample = text[:3000]
    want = [i for p in pre_split_pieces(sample, "text") for i in naive_encode(p, tok.merges)]
    assert tok.encode(sample).tolist() == want
    with pytest.raises(TokenizerError, match="unknown pre-split"):
        train_bpe(text, 10, pre_split="words")


# ---------------------------------------------------------------- big inputs

def test_encode_chunks_equals_whole_where_safe(text_tok):
    data = real_text()
    whole = text_tok.encode(data)
    parts = list(encode_chunks((data[i:i + 777] for i in range(0, len(data), 777)), text_tok.merges,
                               chunk_bytes=4096, max_chunk=1 << 20))
    assert len(parts) > 3
    assert np.concatenate(parts).tolist() == whole.tolist()


def test_encode_chunks_pre_split_equals_whole():
    text = real_text()
    tok = Tokenizer.train(text[:50000], 150, pre_split="text")
    whole = tok.encode(text)
    parts = list(encode_chunks((text[i:i + 1000] for i in range(0, len(text), 1000)), tok.merges,
                               pre_split="text", chunk_bytes=4096, max_chunk=1 << 20))
    assert len(parts) > 3
    assert np.concatenate(parts).tolist() == whole.tolist()


def test_encode_chunks_without_safe_cut_still_round_trips():
    dna = real_dna()
    tok = Tokenizer(train_bpe(dna, 64))
    parts = list(encode_chunks([dna], tok.merges, chunk_bytes=2048, max_chunk=4096))
    assert len(parts) > 3
    assert tok.decode(np.concatenate(parts)) == dna


def test_sample_is_bounded_and_deterministic():
    rng = np.random.default_rng(3)
    docs = [bytes(rng.integers(0, 256, int(n)).astype(np.uint8)) for n in rng.integers(1, 100_000, 40)]
    a = sample_segments(docs, 4 << 16, seed=0)
    b = sample_segments(iter(docs), 4 << 16, seed=0)
    c = sample_segments(docs, 4 << 16, seed=1)
    assert a == b and a != c
    assert sum(map(len, a)) <= 4 << 16
    assert sample_segments(docs[:2], 1 << 30) == docs[:2]  # everything fits: everything kept
    m1 = train_bpe(docs, 20, max_sample_bytes=4 << 16)
    assert m1 == train_bpe(iter(docs), 20, max_sample_bytes=4 << 16)


# ---------------------------------------------------------------- errors and files

def test_bad_merge_counts():
    with pytest.raises(TokenizerError, match="only"):
        train_bpe(b"abcdefg", 1)  # no pair occurs twice
    with pytest.raises(TokenizerError, match="uint16"):
        train_bpe(b"abab", 70000)
    with pytest.raises(TokenizerError):
        train_bpe(b"abab", -1)
    with pytest.raises(TokenizerError, match="empty"):
        train_bpe([b"", b""], 3)
    assert train_bpe(b"abab", 0) == []


def test_tokenizer_file_round_trip(tmp_path, text_tok):
    p = tmp_path / "tok.json"
    text_tok.save(p)
    tok = Tokenizer.load(p)
    assert tok.merges == text_tok.merges and tok.vocab_size == text_tok.vocab_size
    assert tok.pre_split is None
    d = json.loads(p.read_text())
    assert d["format"] == "bytemodel-tokenizer" and d["version"] == 1 and d["specials"] == ["<doc>"]
    assert not list(tmp_path.glob("*.tmp"))  # the temporary file was renamed away


@pytest.mark.parametrize("damage", ["edit_merge", "drop_merge", "truncate", "not_json", "wrong_format",
                                    "bad_version", "bad_vocab", "missing"])
def test_corrupt_tokenizer_file_is_refused(tmp_path, text_tok, damage):
    p = tmp_path / "tok.json"
    text_tok.save(p)
    d = json.loads(p.read_text())
    if damage == "edit_merge":
        d["merges"][5][1] += 1
    elif damage == "drop_merge":
        d["merges"].pop()
    elif damage == "wrong_format":
        d["format"] = "huggingface"
    elif damage == "bad_version":
        d["version"] = 99
    elif damage == "bad_vocab":
        d["vocab_size"] += 1
    p.write_text(json.dumps(d))
    if damage == "truncate":
        p.write_bytes(p.read_bytes()[:50])
    elif damage == "not_json":
        p.write_bytes(b"\x00\xff garbage")
    elif damage == "missing":
        p.unlink()
    with pytest.raises(TokenizerError):
        Tokenizer.load(p)


# ---------------------------------------------------------------- CLI

def cli_app() -> typer.Typer:
    from bytemodel.cli.tokenizer import register
    app = typer.Typer()

    @app.command()
    def version():  # a second command so that "tokenizer" stays a sub-command group
        pass
    register(app)
    return app


def test_cli_train_stats_encode_decode(tmp_path):
    runner = CliRunner()
    app = cli_app()
    src = tmp_path / "src.bin"  # .bin: the raw reader (the text reader refuses invalid UTF-8)
    src.write_bytes(real_text()[:60000] + b"\x00\xff\xfe")
    tokf = tmp_path / "tok.json"
    r = runner.invoke(app, ["tokenizer", "train", "--source", str(src), "--merges", "100", "--out", str(tokf)])
    assert r.exit_code == 0, r.output
    assert Tokenizer.load(tokf).n_merges == 100
    r = runner.invoke(app, ["tokenizer", "stats", "--tokenizer", str(tokf), str(src)])
    assert r.exit_code == 0, r.output
    assert "bytes/token" in r.output and "vocabulary 357" in r.output
    ids = tmp_path / "ids.bin"
    r = runner.invoke(app, ["tokenizer", "encode", "--tokenizer", str(tokf), str(src), "--out", str(ids)])
    assert r.exit_code == 0, r.output
    arr = np.fromfile(ids, dtype="<u2")
    assert arr.tolist() == Tokenizer.load(tokf).encode(src.read_bytes()).tolist()
    back = tmp_path / "back.bin"
    r = runner.invoke(app, ["tokenizer", "decode", "--tokenizer", str(tokf), str(ids), "--out", str(back)])
    assert r.exit_code == 0, r.output
    assert back.read_bytes() == src.read_bytes()


def test_cli_user_errors_are_one_line(tmp_path):
    runner = CliRunner()
    app = cli_app()
    src = tmp_path / "src.bin"
    src.write_bytes(b"abcdefgh")
    r = runner.invoke(app, ["tokenizer", "train", "--source", str(src), "--merges", "5",
                            "--out", str(tmp_path / "t.json")])
    assert r.exit_code == 2 and "error:" in r.output and "Traceback" not in r.output
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    r = runner.invoke(app, ["tokenizer", "stats", "--tokenizer", str(bad), str(src)])
    assert r.exit_code == 2 and "not a bytemodel tokenizer" in r.output


# ================================================================================================
# out-of-vocabulary ids (fault injection)
# ================================================================================================
def test_out_of_vocabulary_ids_in_the_api_and_decode(tmp_path):
    from bytemodel.errors import TokenizerError
    from bytemodel.tokenizer import Tokenizer
    with pytest.raises(TokenizerError, match="300"):
        Tokenizer().decode([65, 300])
    tok = tmp_path / "tok.json"
    src = tmp_path / "s.txt"
    src.write_bytes(b"abab abab " * 30)
    assert cli(["tokenizer", "train", "--source", src, "--merges", "2", "-o", tok])[0] == 0
    ids = tmp_path / "ids.u16"
    ids.write_bytes(np.array([97, 9000], dtype="<u2").tobytes())
    assert refused(*cli(["tokenizer", "decode", "-t", tok, ids, "-o", tmp_path / "d.bin"]), "9000")
    assert not (tmp_path / "d.bin").exists() and leftovers(tmp_path) == []   # item 7: no OUT.tmp

