"""Byte-level BPE: bytemodel (NumPy) against HuggingFace `tokenizers` (Rust), in the same run.

Training M merges on N bytes and encoding MB/s, on real text (Debian dict-gcide), DNA (Debian
kleborate-examples, Klebsiella genomes, FASTA) and binaries (ELF files from /usr/bin).

`tokenizers` is NOT a bytemodel dependency: run this in its own environment, e.g.

    python3 -m venv /tmp/bpe-bench && /tmp/bpe-bench/bin/pip install tokenizers numpy
    RAYON_NUM_THREADS=1 PYTHONPATH=/work/main /tmp/bpe-bench/bin/python benchmarks/bpe.py

Both sides get the same documents (the data split at newlines, newline kept, as latin-1 strings
for HuggingFace so that one character is one byte) and the same merge count. HuggingFace runs with
no normalizer and no pre-tokenizer, the 256 byte values as its initial alphabet (in byte order, so
its ids and tie-break match ours) and a vocabulary of 256 + M. It treats each document as one
"word", which is why the documents are lines: on one 10 MB document it does not finish (its
per-word merge is linear in the word length). bytemodel also trains on the whole data as one
document ("whole"), and on text with its own regex pre-split ("pre-split", bytemodel only: the
pattern differs from any HuggingFace pre-tokenizer).

Training is timed once, encoding as the fastest of 3 runs. Times are wall clock and CPU (process
time) on one core: RAYON_NUM_THREADS=1 and
TOKENIZERS_PARALLELISM=false are set before `tokenizers` is imported; NumPy's element-wise work
is single-threaded.
"""
from __future__ import annotations

import argparse
import gzip
import json
import lzma
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bytemodel.tokenizer.encode import MergeTable, apply_merges, encode_bytes  # noqa: E402
from bytemodel.tokenizer.train import train_bpe  # noqa: E402
from bytemodel.tokenizer import Tokenizer  # noqa: E402


def load(kind: str, n: int) -> bytes:
    """The first n bytes of a real data set (see the module docstring)."""
    if kind == "text":
        with gzip.open("/usr/share/dictd/gcide.dict.dz") as f:  # dictzip is gzip-compatible
            return f.read(n)
    if kind == "dna":
        out = b""
        for p in sorted(Path("/usr/share/doc/kleborate/examples/data").glob("*.fna.xz")):
            out += lzma.open(p).read()
            if len(out) >= n:
                break
        return out[:n]
    if kind == "binary":
        out = bytearray()
        for p in sorted(Path("/usr/bin").iterdir()):
            try:
                if p.is_file() and not p.is_symlink() and p.open("rb").read(4) == b"\x7fELF":
                    out += p.read_bytes()
            except OSError:
                continue
            if len(out) >= n:
                break
        return bytes(out[:n])
    raise SystemExit(f"unknown data set {kind}")


class Timer:
    def __enter__(self):
        self.w, self.c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.w, time.process_time() - self.c


REPEAT = 3  # encodings are timed REPEAT times; the fastest (by CPU time) is reported


def best_of(fn):
    """(result, (wall, cpu)) of the fastest of REPEAT calls, by CPU time."""
    best = None
    for _ in range(REPEAT):
        with Timer() as t:
            out = fn()
        if best is None or t.cpu < best[1]:
            best = (t.wall, t.cpu)
    return out, best


def bench_ours(data: bytes, lines: list[bytes], merges: int, whole: bool, text: bool) -> dict:
    r = {}
    with Timer() as t:
        m = train_bpe(lines, merges)
    r["train_lines"] = (t.wall, t.cpu)
    if whole:
        with Timer() as t:
            mw = train_bpe(data, merges)
        r["train_whole"] = (t.wall, t.cpu)
    tok = Tokenizer(m)
    table = MergeTable(m)
    x = np.frombuffer(data, np.uint8)
    seg_ends = np.cumsum([len(s) for s in lines])
    ids_lines, r["encode_lines"] = best_of(lambda: apply_merges(x, table, seg_ends))
    r["bpt_lines"] = len(data) / len(ids_lines)
    with Timer() as t:
        back = tok.decode(ids_lines)
    r["decode"] = (t.wall, t.cpu)
    assert back == data, "round trip failed"
    if whole:
        tw = MergeTable(mw)
        ids_whole, r["encode_whole"] = best_of(lambda: apply_merges(x, tw))
        r["bpt_whole"] = len(data) / len(ids_whole)
        assert Tokenizer(mw).decode(ids_whole) == data
    if text:
        with Timer() as t:
            mt = train_bpe(data, merges, pre_split="text")
        r["train_presplit"] = (t.wall, t.cpu)
        tt = MergeTable(mt)
        ids_t, r["encode_presplit"] = best_of(lambda: encode_bytes(data, tt, "text"))
        r["bpt_presplit"] = len(data) / len(ids_t)
        assert Tokenizer(mt).decode(ids_t) == data
    r["merges"] = m
    return r


def bench_hf(lines: list[bytes], merges: int) -> dict | None:
    try:
        import tokenizers
        from tokenizers import Tokenizer as HFTokenizer, models, trainers
    except ImportError:
        return None
    docs = [s.decode("latin-1") for s in lines]
    tok = HFTokenizer(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=256 + merges, initial_alphabet=[chr(i) for i in range(256)],
                                  special_tokens=[], show_progress=False, min_frequency=2)
    r = {"version": tokenizers.__version__}
    with Timer() as t:
        tok.train_from_iterator(docs, trainer)
    r["train_lines"] = (t.wall, t.cpu)
    enc, r["encode_lines"] = best_of(lambda: tok.encode_batch(docs))
    r["bpt_lines"] = sum(map(len, lines)) / sum(len(e.ids) for e in enc)
    model = json.loads(tok.to_str())["model"]
    hm = [tuple(p.split(" ", 1)) if isinstance(p, str) else tuple(p) for p in model["merges"]]
    r["merges_bytes"] = [(a.encode("latin-1"), b.encode("latin-1")) for a, b in hm]
    return r


def same_prefix(ours: list[tuple[int, int]], hf_bytes: list[tuple[bytes, bytes]]) -> int:
    """How many leading merges are the same byte strings on both sides."""
    vocab = Tokenizer(ours).vocab
    k = 0
    for (a, b), (ha, hb) in zip(ours, hf_bytes):
        if (vocab[a], vocab[b]) != (ha, hb):
            break
        k += 1
    return k


def main() -> None:
    global REPEAT
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="text,dna,binary", help="comma list of text, dna, binary")
    ap.add_argument("--bytes", type=int, default=10_000_000)
    ap.add_argument("--merges", type=int, default=4096)
    ap.add_argument("--no-hf", action="store_true", help="skip HuggingFace tokenizers")
    ap.add_argument("--no-whole", action="store_true", help="skip training on the data as one document")
    ap.add_argument("--repeat", type=int, default=3, help="encoding runs; the fastest is reported")
    args = ap.parse_args()
    REPEAT = args.repeat
    print(f"python {platform.python_version()}, numpy {np.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}; {args.bytes:,} bytes, {args.merges} merges")
    mb = args.bytes / 1e6
    for kind in args.data.split(","):
        data = load(kind, args.bytes)
        lines = data.splitlines(keepends=True)
        print(f"\n== {kind}: {len(data):,} bytes, {len(lines):,} lines (documents)")
        ours = bench_ours(data, lines, args.merges, not args.no_whole, kind == "text")
        hf = None if args.no_hf else bench_hf(lines, args.merges)

        def row(name, o, h=None):
            s = f"  {name:<22} bytemodel {o[0]:7.2f} s wall {o[1]:7.2f} s cpu"
            if h:
                s += f" | tokenizers {h[0]:7.2f} s wall {h[1]:7.2f} s cpu | ratio (cpu) {o[1] / h[1]:.2f}x"
            print(s)
        row("train, lines", ours["train_lines"], hf and hf["train_lines"])
        if "train_whole" in ours:
            row("train, whole", ours["train_whole"])
        row("encode, lines", ours["encode_lines"], hf and hf["encode_lines"])
        if "encode_whole" in ours:
            row("encode, whole", ours["encode_whole"])
        if "train_presplit" in ours:
            row("train, pre-split text", ours["train_presplit"])
            row("encode, pre-split text", ours["encode_presplit"])
        row("decode", ours["decode"])
        s = f"  encode MB/s (cpu)      bytemodel lines {mb / ours['encode_lines'][1]:.1f}"
        if "encode_whole" in ours:
            s += f", whole {mb / ours['encode_whole'][1]:.1f}"
        if "encode_presplit" in ours:
            s += f", pre-split {mb / ours['encode_presplit'][1]:.1f}"
        if hf:
            s += f" | tokenizers lines {mb / hf['encode_lines'][1]:.1f}"
        print(s)
        s = f"  bytes/token            bytemodel lines {ours['bpt_lines']:.3f}"
        if "bpt_whole" in ours:
            s += f", whole {ours['bpt_whole']:.3f}"
        if "bpt_presplit" in ours:
            s += f", pre-split {ours['bpt_presplit']:.3f}"
        if hf:
            s += f" | tokenizers lines {hf['bpt_lines']:.3f}"
            k = same_prefix(ours["merges"], hf["merges_bytes"])
            s += f"\n  same merges as tokenizers: first {k} of {args.merges} (tokenizers {hf['version']})"
        print(s)


if __name__ == "__main__":
    main()
