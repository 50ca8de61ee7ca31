"""Property-based fuzzing of every parser that reads a user's file (issue 23): random and mutated
inputs give a result or one BytemodelError, never another exception, within a stated memory bound.

Each test runs a fixed number of examples, derandomized (the same inputs on every run, so CI is
stable), in a few seconds. Memory: tracemalloc's peak over one parse, for inputs of at most a few
KB, stays under the bound each test states (what the input really holds, plus the parser's fixed
working set; the bombs those bounds refuse are in test_hostile_*.py). The .bmz container's fuzz
test is in test_hostile_bmz.py.
"""
from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import tracemalloc
import wave

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.errors import BytemodelError
from conftest import FAST

FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=list(HealthCheck))

JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
                    | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                    max_leaves=10)


def _mutate(data: st.DataObject, raw: bytes) -> bytes:
    """A few random byte edits of raw: flips, a cut, an insertion, or random bytes."""
    kind = data.draw(st.sampled_from(["flip", "cut", "insert", "random"]))
    if kind == "random":
        return data.draw(st.binary(max_size=2048))
    b = bytearray(raw)
    if kind == "cut":
        return bytes(b[:data.draw(st.integers(0, len(b)))])
    if kind == "insert":
        at = data.draw(st.integers(0, len(b)))
        return bytes(b[:at]) + data.draw(st.binary(min_size=1, max_size=64)) + bytes(b[at:])
    for _ in range(data.draw(st.integers(1, 6))):
        if b:
            i = data.draw(st.integers(0, len(b) - 1))
            b[i] = data.draw(st.integers(0, 255))
    return bytes(b)


def _replace_somewhere(data: st.DataObject, obj):
    """obj (parsed JSON) with one value, at any depth, replaced by random JSON."""
    obj = json.loads(json.dumps(obj))
    node = obj
    for _ in range(data.draw(st.integers(0, 3))):
        keys = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
        keys = [k for k in keys if isinstance(node[k], (dict, list)) and node[k]]
        if not keys:
            break
        node = node[data.draw(st.sampled_from(keys))]
    if isinstance(node, dict) and node:
        node[data.draw(st.sampled_from(sorted(node)))] = data.draw(JSON)
    elif isinstance(node, list) and node:
        node[data.draw(st.integers(0, len(node) - 1))] = data.draw(JSON)
    return obj


def _bounded(fn, limit: int):
    """fn() under tracemalloc: its result, or None for a BytemodelError; fails past `limit` bytes."""
    tracemalloc.start()
    try:
        try:
            return fn()
        except BytemodelError as e:
            assert str(e) and "\n" not in str(e).strip(), repr(e)     # one line
            return None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < limit, f"peak {peak:,} bytes"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    (d / "toy.txt").write_bytes(b"ACGTTGCAACGGTTCA" * 200)
    bytemodel.train(str(d / "toy.txt"), str(d / "R"), steps=2,
                    **{**FAST, "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 16}})
    return d


# ------------------------------------------------------------------------------ checkpoint

@FUZZ
@given(data=st.data())
def test_fuzz_checkpoint(run, tmp_path_factory, data):
    """Checkpoint files: byte mutations (header length, JSON, tensors) and re-signed metadata with
    any value replaced. Bound: 16 MiB (the file is ~20 KB; the loader holds it a few times)."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save as st_save
    src = run / "R" / ck.CKPT_NAME
    raw = src.read_bytes()
    p = tmp_path_factory.mktemp("ck") / "c.safetensors"
    if data.draw(st.booleans()):
        p.write_bytes(_mutate(data, raw))
    else:
        with safe_open(str(src), "numpy") as f:
            meta = json.loads(f.metadata()["bytemodel"])
        meta = _replace_somewhere(data, meta)
        tensors = load_file(str(src))
        if isinstance(meta, dict):
            meta["sha256"] = ck.digest(meta, tensors)
        p.write_bytes(st_save(tensors, metadata={"bytemodel": json.dumps(meta)}))
    _bounded(lambda: ck.load(p), 16 << 20)


# ------------------------------------------------------------------------------ tok.json

@FUZZ
@given(data=st.data())
def test_fuzz_tok_json(tmp_path_factory, data):
    """tok.json: mutated bytes, or any value replaced (the checksum recomputed half the time).
    Bound: 8 MiB (merges of at most 2 KB of text)."""
    from bytemodel.tokenizer import merges_sha256
    tok = bytemodel.Tokenizer([(65, 67), (256, 71), (84, 84)])
    d = tok.to_dict()
    p = tmp_path_factory.mktemp("tok") / "tok.json"
    if data.draw(st.booleans()):
        p.write_bytes(_mutate(data, json.dumps(d).encode()))
    else:
        d = _replace_somewhere(data, d)
        if isinstance(d, dict) and data.draw(st.booleans()):
            try:
                d["merges_sha256"] = merges_sha256([tuple(m) for m in d.get("merges", [])])
            except (TypeError, ValueError):
                pass
        p.write_text(json.dumps(d))
    t = _bounded(lambda: bytemodel.Tokenizer.load(p), 8 << 20)
    if t is not None:
        assert t.decode(t.encode(b"ACGTTT")) == b"ACGTTT"


# ------------------------------------------------------------------------------ corpus.json

@FUZZ
@given(data=st.data())
def test_fuzz_corpus_json(run, tmp_path_factory, data):
    """corpus.json beside a real token file: any value replaced, or mutated bytes.
    Bound: 4 MiB (the token file is memory-mapped, 6 KB)."""
    import shutil
    from bytemodel.corpus import open_corpus
    d = tmp_path_factory.mktemp("corpus")
    shutil.copy(run / "R" / "tokens.u16", d / "tokens.u16")
    info = json.loads((run / "R" / "corpus.json").read_text())
    if data.draw(st.booleans()):
        (d / "corpus.json").write_bytes(_mutate(data, json.dumps(info).encode()))
    else:
        (d / "corpus.json").write_text(json.dumps(_replace_somewhere(data, info)))
    c = _bounded(lambda: open_corpus(d), 4 << 20)
    if c is not None:
        assert 0 < c.split < len(c.tokens) and c.n_bytes > 0


# ------------------------------------------------------------------------------ HF directory

@pytest.fixture(scope="module")
def hf_dir(run, tmp_path_factory):
    from bytemodel.hf.export import export_hf
    d = tmp_path_factory.mktemp("hf") / "hf"
    export_hf(run / "R", d)
    return d


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_hf_directory(hf_dir, tmp_path_factory, data):
    """import-hf on a directory with config.json, tokenizer.json or the weights' header mutated
    (or any config value replaced). Bound: 32 MiB (the weights are ~40 KB)."""
    import shutil
    from bytemodel.hf.importer import import_hf
    d = tmp_path_factory.mktemp("hfz") / "m"
    shutil.copytree(hf_dir, d)
    which = data.draw(st.sampled_from(["config.json", "tokenizer.json", "model.safetensors", "config-value"]))
    if which == "config-value":
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(_replace_somewhere(data, cfg)))
    elif (d / which).exists():
        raw = (d / which).read_bytes()
        if which == "model.safetensors":    # the header and the first tensors
            n = min(len(raw), 8 + int.from_bytes(raw[:8], "little") + 64)
            raw = _mutate(data, raw[:n]) + raw[n:]
        else:
            raw = _mutate(data, raw)
        (d / which).write_bytes(raw)
    _bounded(lambda: import_hf(d, d.parent / "out", force=True), 32 << 20)


# ------------------------------------------------------------------------------ finetune JSONL

@FUZZ
@given(data=st.data(), kind=st.sampled_from(["pairs", "chat"]))
def test_fuzz_finetune_jsonl(tmp_path_factory, data, kind):
    """Example files: lines of random JSON, mutated good lines, random bytes. Bound: 4 MiB."""
    from bytemodel.pairs import read_examples
    good = {"pairs": {"prompt": "a =", "completion": {"b64": "QUJD"}},
            "chat": {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}}[kind]
    lines = []
    for _ in range(data.draw(st.integers(1, 4))):
        how = data.draw(st.sampled_from(["good", "value", "json", "bytes"]))
        if how == "good":
            lines.append(json.dumps(good).encode())
        elif how == "value":
            lines.append(json.dumps(_replace_somewhere(data, good)).encode())
        elif how == "json":
            lines.append(json.dumps(data.draw(JSON)).encode())
        else:
            lines.append(_mutate(data, json.dumps(good).encode()))
    p = tmp_path_factory.mktemp("jsonl") / "x.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    out = _bounded(lambda: read_examples(p, kind), 4 << 20)
    if out is not None:
        assert out and all(isinstance(x, (tuple, list)) for x in out)


# ------------------------------------------------------------------------------ every reader

def _samples() -> dict[str, bytes]:
    """A small valid file for each reader (made here), keyed by the file's extension."""
    out = {"txt": b"Hello, world.\nA second line.\n" * 4, "fa": b">seq1 a\nACGTACGTNN\nACGT\n>seq2\nGGCC\n",
           "bin": bytes(range(256))}
    try:
        import zstandard
        out["zst"] = zstandard.ZstdCompressor(level=3).compress(b"ACGT" * 100)
    except ImportError:
        pass
    out["txt.gz"] = gzip.compress(b"gzip text " * 20)
    out["txt.bz2"] = bz2.compress(b"bzip2 text " * 20)
    out["txt.xz"] = lzma.compress(b"xz text " * 20)
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype(np.uint8), "L").save(buf, "PNG")
    out["png"] = buf.getvalue()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(8000)
        w.writeframes((1000 * np.sin(np.arange(400) * 0.1)).astype("<i2").tobytes())
    out["wav"] = buf.getvalue()
    return out


SAMPLES = _samples()
READERS = ["raw", "text", "fasta", "zstd", "image", "audio", None]   # None: detected from the file


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_every_reader(tmp_path_factory, data):
    """Every built-in reader (and detection) on mutated samples of every kind. Bound: 64 MiB for
    inputs of at most ~2 KB (an image header may ask for up to 2^25 pixels only if the file holds
    them; a WAV header's rate may not upsample past 32x)."""
    from bytemodel.readers import read_documents
    ext = data.draw(st.sampled_from(sorted(SAMPLES)))
    reader = data.draw(st.sampled_from(READERS))
    raw = SAMPLES[ext] if data.draw(st.integers(0, 4)) == 0 else _mutate(data, SAMPLES[ext])
    p = tmp_path_factory.mktemp("rd") / f"f.{ext}"
    p.write_bytes(raw)
    docs = _bounded(lambda: [bytes(d) for d in read_documents(p, reader)], 64 << 20)
    if docs is not None:
        assert all(isinstance(d, bytes) for d in docs)
