"""`bytemodel compress` with the reader's view and with --adapt, against gzip -9, bzip2 -9, xz -9e
and zstd -19 on the same files, with KB/s each way (issue 26).

Each row compresses one file with one model in one mode, decompresses it (checked byte for
byte) and reports: the .bmz size (header included), the model's bits on what it coded plus the
layout blob (the bar the coder must meet), the four compressors' sizes on the whole file, and
KB/s each way (1 KB = 1000 bytes, wall clock; the peers are timed in the same run, in-process).
Rows are NAME=FILE:MODEL:MODE, MODEL a run directory or fresh-PRESET (no checkpoint), MODE
static, adapt (the defaults of compress/adapt.settings) or adapt@LR, each with /STREAMS optionally. The reader is the run's, else the
file's detected one, as the CLI does.

    PYTHONPATH=. python benchmarks/compress_adapt.py --json out.json \\
        lambda=datasets/lambda_virus.fa:runs/klebs:static lambda=datasets/lambda_virus.fa:runs/klebs:adapt \\
        jargon=jargon_1m.txt:fresh-tiny:adapt
"""
from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import os
import sys
import time

import bytemodel
from bytemodel.compress import driver
from bytemodel.compress.adapt import Fresh, settings
from bytemodel.readers import detect, get_reader

# the model's coding timed and sized even where it would expand the file (random weights do;
# `compress` would pack such a file's bytes instead: compress/driver.py)
os.environ.setdefault("BYTEMODEL_PACK", "0")


def peers(data: bytes) -> dict:
    """name -> (bytes, compress KB/s, decompress KB/s), each timed once, in-process."""
    import zstandard
    codecs = {"gzip -9": (lambda d: gzip.compress(d, 9, mtime=0), gzip.decompress),
              "bzip2 -9": (lambda d: bz2.compress(d, 9), bz2.decompress),
              "xz -9e": (lambda d: lzma.compress(d, preset=9 | lzma.PRESET_EXTREME), lzma.decompress),
              "zstd -19": (zstandard.ZstdCompressor(level=19).compress, zstandard.ZstdDecompressor().decompress)}
    out = {}
    for name, (c, d) in codecs.items():
        t = time.perf_counter()
        blob = c(data)
        tc = time.perf_counter() - t
        t = time.perf_counter()
        assert d(blob) == data
        td = time.perf_counter() - t
        out[name] = (len(blob), len(data) / tc / 1000, len(data) / td / 1000)
    return out


def model(spec: str, device: str = "cpu", precision: str = "fp32"):
    """A fresh model (fp32 on any device) or a run loaded onto the device."""
    if spec.startswith("fresh-"):
        return Fresh(spec[len("fresh-"):], device)
    return bytemodel.load(spec, device=device, precision=precision)


def row(name: str, path: str, mspec: str, mode: str, workers: int | None, decompress: bool = True,
        device: str = "cpu", precision: str = "fp32") -> dict:
    lm = model(mspec, device, precision)
    raw = open(path, "rb").read()
    spec = getattr(lm, "reader", "")             # the run's recorded reader, as compress takes it; fresh: none
    reader = get_reader(spec) if spec else detect(path)
    mode, _, streams = mode.partition("/")
    a = settings(lm, lr=float(mode.split("@")[1]) if "@" in mode else None) if mode.startswith("adapt") else None
    st: dict = {}
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    c0 = time.process_time()
    blob = driver.compress(lm, raw, adapt=a, reader=reader, stats=st, workers=workers, streams=int(streams) if streams else None)
    tc, cc = time.perf_counter() - t, time.process_time() - c0
    td = None
    if decompress:
        t = time.perf_counter()
        back = driver.decompress(lm, blob, workers=workers)
        td = time.perf_counter() - t
        assert back == raw, "round trip failed"
    p = peers(raw)
    bar = (st["model_bits"] + st["layout_bits"]) / 8
    return {"name": name, "file": path, "model": mspec, "mode": mode + (f"/{streams}" if streams else ""), "bytes": len(raw), "bmz": len(blob),
            "coded_bytes": st["coded_bytes"], "view": st["view"].describe(), "streams": st["streams"],
            "model_plus_layout": bar, "payload_plus_layout": (st["payload_bits"] + st["layout_bits"]) / 8,
            "adapt": None if a is None else a.header(), "compress_kbs": len(raw) / tc / 1000,
            "compress_kb_per_cpu_s": len(raw) / cc / 1000, "decompress_kbs": None if td is None else len(raw) / td / 1000,
            "load_average": [load0, os.getloadavg()[0]], "peers": p}


def markdown(rows: list[dict]) -> str:
    head = ("| file | bytes | model | mode | .bmz | bits/byte | model + layout | gzip -9 | bzip2 -9 | xz -9e | zstd -19 "
            "| .bmz / xz | compress KB/s | decompress KB/s |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        p = r["peers"]
        lines.append(f"| {r['name']} | {r['bytes']:,} | {r['model']} | {r['mode']} | {r['bmz']:,} | "
                     f"{8 * r['bmz'] / r['bytes']:.3f} | {r['model_plus_layout']:,.0f} | "
                     + " | ".join(f"{p[k][0]:,}" for k in ("gzip -9", "bzip2 -9", "xz -9e", "zstd -19"))
                     + f" | {r['bmz'] / p['xz -9e'][0]:.3f} | {r['compress_kbs']:.2f} | "
                     + ("-" if r["decompress_kbs"] is None else f"{r['decompress_kbs']:.2f}") + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rows", nargs="+", help="NAME=FILE:MODEL:MODE")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--json", default="")
    ap.add_argument("--no-decompress", action="store_true", help="Compress only (sizes and compress KB/s).")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (a fresh model computes in fp32 there)")
    ap.add_argument("--precision", default="fp32", help="a run's precision on the device: fp32, fp16, bf16")
    args = ap.parse_args()
    rows = []
    for spec in args.rows:
        name, rest = spec.split("=", 1)
        path, mspec, mode = rest.rsplit(":", 2)
        r = row(name, path, mspec, mode, args.workers or None, not args.no_decompress, args.device, args.precision)
        rows.append(r)
        print(json.dumps(r), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    print(markdown(rows))
    for r in rows:
        print(f"{r['name']} peers KB/s (c/d): " + ", ".join(f"{k} {v[1]:.0f}/{v[2]:.0f}" for k, v in r["peers"].items()))


if __name__ == "__main__":
    sys.exit(main())
