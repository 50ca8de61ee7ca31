"""A model's bits per byte on files, next to general-purpose compressors on the same bytes.

    rows = evaluate(lm, ["a.fa", "b.bin"], reader="")     # -> {"files": [...], "totals": [...]}

Each file is measured twice where the two differ:
- "as-is":  the file's bytes as they are (what `bytemodel compress` codes);
- the run's reader's view: the documents the run's reader decodes from the file (a FASTA file's
  bases without headers and line breaks, an image's pixels), as the model was trained. The model
  scores each document from its start (<doc>); the compressors get the documents joined.
The model's figure is its cross-entropy (bytemodel.decode.score: windows of its context that
overlap by half, batched), the size an ideal coder would reach; `bytemodel compress` comes within a few
bytes of it plus its header (see benchmarks/README.md). The compressors are run in-process at
their strongest usual settings: gzip -9 (zlib, no file name in the header), bzip2 -9, xz -9e
(LZMA2 preset 9 extreme) and zstd -19, each on a thread of its own while the model scores (zlib,
bz2, lzma and zstandard let go of Python's lock while they compress), so `eval` takes about as long
as the slower of the model and xz -9e, not their sum.
"""
from __future__ import annotations

import bz2
import gzip
import lzma
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

COMPRESSORS = ("gzip -9", "bzip2 -9", "xz -9e", "zstd -19")


def _zstd19(data: bytes) -> bytes | None:
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard.ZstdCompressor(level=19).compress(data)


# each compressor: data -> its output (None: not installed); the slowest first, so it starts first
COMPRESS = {"xz -9e": lambda d: lzma.compress(d, preset=9 | lzma.PRESET_EXTREME),
            "zstd -19": _zstd19,
            "bzip2 -9": lambda d: bz2.compress(d, 9),
            "gzip -9": lambda d: gzip.compress(d, compresslevel=9, mtime=0)}


def _size(name: str, data: bytes) -> int | None:
    out = COMPRESS[name](data)
    return None if out is None else len(out)


def compressed_sizes(data: bytes) -> dict:
    """Bytes each compressor needs for data (zstd -19: None where zstandard is not installed)."""
    return {c: _size(c, data) for c in COMPRESSORS}


def _row(name: str, view: str, docs: list[bytes], lm, adapt, pool: ThreadPoolExecutor) -> dict:
    """One row; its "compressed_bytes" are futures on pool (started first: they run while the
    model scores), which evaluate collects."""
    joined = b"".join(docs)
    sizes = {c: pool.submit(_size, c, joined) for c in COMPRESS}
    if adapt is None:
        bits = lm.score_documents(docs)["bits"] if joined else 0.0   # every document in shared batches
    else:                      # as `compress --adapt` codes them: joined, in its streams, learning
        from .driver import compress
        stats: dict = {}
        if joined:
            compress(lm, joined, adapt=adapt, stats=stats)
        bits = stats.get("model_bits", 0.0)
    return {"file": name, "view": view, "bytes": len(joined), "model_bits": float(bits),
            "compressed_bytes": sizes}


def _bpb(bits, n):
    return None if n == 0 or bits is None else bits / n


def evaluate(lm, files, reader: str = "", adapt=None) -> dict:
    """Rows per file (as-is, and the reader's view where it differs) and totals per view.
    adapt (compress/adapt.Adapt): the model's bits as `compress --adapt` codes each view."""
    from ..readers import read_documents
    rows = []
    pool = ThreadPoolExecutor(len(COMPRESS))   # one thread a compressor
    try:
        for f in files:
            p = Path(f)
            raw = p.read_bytes()
            mine = [_row(str(f), "as-is", [raw], lm, adapt, pool)]
            docs = list(read_documents(p, reader or None))
            if b"".join(docs) != raw or len(docs) > 1:
                from ..readers import detect, get_reader
                r = get_reader(reader) if reader else detect(p)
                mine.append(_row(str(f), r.spec, docs, lm, adapt, pool))
            else:
                mine[0]["same_as_reader"] = True
            del raw, docs
            for r in mine:          # this file's sizes before the next file is read: one file held at a time
                r["compressed_bytes"] = {c: r["compressed_bytes"][c].result() for c in COMPRESSORS}
            rows += mine
    finally:                         # an error or Ctrl-C: nothing new starts (one already running finishes)
        pool.shutdown(wait=True, cancel_futures=True)
    totals = []
    for view in ("as-is", "reader"):
        chosen = []
        for f in files:
            mine = [r for r in rows if r["file"] == str(f)]
            chosen.append(mine[0] if view == "as-is" or len(mine) == 1 else mine[1])
        n = sum(r["bytes"] for r in chosen)
        comp = {c: (None if any(r["compressed_bytes"][c] is None for r in chosen)
                    else sum(r["compressed_bytes"][c] for r in chosen)) for c in COMPRESSORS}
        totals.append({"file": "total", "view": view, "bytes": n,
                       "model_bits": sum(r["model_bits"] for r in chosen), "compressed_bytes": comp})
    if all(r.get("same_as_reader") for r in rows if r["view"] == "as-is"):
        totals = totals[:1]
    for r in rows + totals:
        r["bits_per_byte"] = {"model": _bpb(r["model_bits"], r["bytes"]),
                              **{c: _bpb(None if s is None else 8 * s, r["bytes"])
                                 for c, s in r["compressed_bytes"].items()}}
    return {"files": rows, "totals": totals}


def table(result: dict) -> str:
    """The rows as an aligned text table of bits per byte (lower is better)."""
    head = ["file", "view", "bytes", "model"] + list(COMPRESSORS)
    lines = []
    for r in result["files"] + result["totals"]:
        b = r["bits_per_byte"]
        lines.append([r["file"], r["view"], f"{r['bytes']:,}"] +
                     ["-" if b[k] is None else f"{b[k]:.3f}" for k in ["model"] + list(COMPRESSORS)])
    widths = [max(len(head[i]), *(len(l[i]) for l in lines)) for i in range(len(head))]
    fmt = lambda cells: "  ".join(c.ljust(w) if i < 2 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([fmt(head)] + [fmt(l) for l in lines]) + "\n(bits per byte; lower is better)"
