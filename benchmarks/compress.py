"""`bytemodel compress` / `decompress`: throughput each way, and size against xz -9e and zstd -19.

The data is the raw bytes of the shipped Klebsiella FASTA sample (datasets/, decompressed: header
line, 80-column lines of bases). The model is a preset either trained here for --train-steps on
the bytes before the measured slice (so the slice is unseen), or left at its random
initialisation (--train-steps 0: for speed only; its sizes are near 8 bits/byte). Each
configuration compresses the slice, decompresses it (checked byte for byte) and reports KB/s
each way (1 KB = 1000 bytes, wall clock, the median of --rounds), the .bmz size (header
included) against xz -9e and zstd -19 on the same slice, and the model's own cross-entropy on the
stream layout (the bar the coder must meet: within 1% plus the header).

    CPU, the README's quick-start model (tiny, 300 steps on the sample; its held-out tail):
         bytemodel train --source datasets/klebsiella_hs11286_1m.fa.gz --steps 300 --out runs/klebs
         PYTHONPATH=. python benchmarks/compress.py --checkpoint runs/klebs --reader fasta --bytes 50000
    CPU, trained here on raw bytes: PYTHONPATH=. python benchmarks/compress.py --preset tiny --train-steps 300
    GPU: PYTHONPATH=. python benchmarks/compress.py --preset base --device cuda --train-steps 0 \\
             --bytes 1000000 --configs 1024:1024,128:4096
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import lzma
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import bytemodel
from bytemodel.resources import datasets_dir

# the model's coding timed and sized even where it would expand the file (random weights do;
# `compress` would pack such a file's bytes instead: compress/driver.py)
os.environ.setdefault("BYTEMODEL_PACK", "0")


SAMPLE = datasets_dir() / "klebsiella_hs11286_1m.fa.gz"


def load_data(n_train: int, n: int, reader: str, file: str = "") -> tuple[bytes, bytes]:
    """(training head, measured slice). With a reader: the last n bytes of what it decodes (the
    held-out tail of a run trained on the sample, e.g. the README's quick start). With a file:
    its first n bytes (as the reader decodes it, if one is given), and no training head."""
    if file:
        from bytemodel.readers import read_documents
        seq = b"".join(read_documents(file, reader)) if reader else Path(file).read_bytes()
        return b"", seq[:n]
    if reader:
        from bytemodel.readers import read_documents
        seq = b"".join(read_documents(SAMPLE, reader))
        return seq[:len(seq) - n][:n_train], seq[len(seq) - n:]
    raw = gzip.decompress(SAMPLE.read_bytes())
    if n_train + n > len(raw):
        raise SystemExit(f"the sample has {len(raw):,} bytes; asked for {n_train:,} + {n:,}")
    return raw[:n_train], raw[n_train:n_train + n]


def model(args, head: bytes, work: Path):
    if args.checkpoint:
        return bytemodel.load(args.checkpoint, device=args.device, precision=args.precision)
    src = work / "head.fa.txt"
    src.write_bytes(head)
    run = work / "run"
    if args.train_steps > 0:
        t = time.perf_counter()
        bytemodel.train(str(src), str(run), preset=args.preset, steps=args.train_steps, reader="raw",
                        device=args.device, precision=args.precision if args.device != "cpu" else "fp32",
                        batch_size=args.batch_size)
        print(f"trained {args.preset} for {args.train_steps} steps in {time.perf_counter() - t:.0f} s",
              file=sys.stderr)
    else:
        from bytemodel import checkpoint
        from bytemodel.config import preset
        from bytemodel.model import Model
        from bytemodel.ops import numpy_ops
        from bytemodel.tokenizer import Tokenizer
        cfg = preset(args.preset)
        m = Model(cfg, numpy_ops)
        m.init_weights(0)
        checkpoint.save(run / checkpoint.CKPT_NAME, cfg, Tokenizer(), m.params)
    return bytemodel.load(run, device=args.device, precision=args.precision)


def measure(lm, data: bytes, window, streams, rounds: int, reread=None, engine=None, quick: bool = False) -> dict:
    enc, dec, cpu_enc, cpu_dec, blob = [], [], [], [], b""
    for _ in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        blob = lm.compress(data, window=window, streams=streams, reread=reread, engine=engine)   # timed without stats (their float64 host pass)
        enc.append(time.perf_counter() - t)
        cpu_enc.append(time.process_time() - c)
        print(f"compressed {len(data):,} bytes in {enc[-1]:.2f} s: {len(data) / enc[-1] / 1e3:.1f} KB/s", file=sys.stderr, flush=True)
        t, c = time.perf_counter(), time.process_time()
        back = lm.decompress(blob)
        dec.append(time.perf_counter() - t)
        cpu_dec.append(time.process_time() - c)
        print(f"decompressed in {dec[-1]:.2f} s: {len(data) / dec[-1] / 1e3:.1f} KB/s", file=sys.stderr, flush=True)
        assert back == data, "round trip failed"
    stats = {}
    if not quick:   # (quick: no float64 stats pass nor a third pass; --graph both compares the bytes)
        assert lm.compress(data, window=window, streams=streams, reread=reread, engine=engine, stats=stats) == blob, "compress is not deterministic"
    from bytemodel.compress.driver import GPU_GRAPH, read
    header, _ = read(blob)
    n = len(data)
    if quick:
        return {"window": header["layout"]["window"], "streams": header["layout"]["streams"],
                "engine": header["layout"].get("engine", "lockstep"), "reread": header["layout"]["reread"],
                "lane": header["layout"]["lane"], "bytes": n, "graph": GPU_GRAPH,
                "compress_KBps": n / statistics.median(enc) / 1e3, "decompress_KBps": n / statistics.median(dec) / 1e3,
                "compress_KB_per_cpu_s": n / statistics.median(cpu_enc) / 1e3,
                "decompress_KB_per_cpu_s": n / statistics.median(cpu_dec) / 1e3,
                "bmz_bytes": len(blob), "bmz_bpb": 8 * len(blob) / n, "sha256": hashlib.sha256(blob).hexdigest()}
    return {"graph": GPU_GRAPH, "sha256": hashlib.sha256(blob).hexdigest(),"window": header["layout"]["window"], "streams": header["layout"]["streams"],
            "engine": header["layout"].get("engine", "lockstep"), "reread": header["layout"]["reread"],
            "lane": header["layout"]["lane"], "bytes": n,
            "compress_KBps": n / statistics.median(enc) / 1e3, "decompress_KBps": n / statistics.median(dec) / 1e3,
            # KB per CPU-second (all threads): what the work costs, whatever else shares the machine
            "compress_KB_per_cpu_s": n / statistics.median(cpu_enc) / 1e3,
            "decompress_KB_per_cpu_s": n / statistics.median(cpu_dec) / 1e3,
            "bmz_bytes": len(blob), "bmz_bpb": 8 * len(blob) / n, "model_bpb": stats["model_bits"] / n,
            "payload_over_model": stats["payload_bits"] / stats["model_bits"] - 1,
            "header_bytes": len(blob) - stats["payload_bits"] // 8}


def _config(text: str) -> tuple:
    """'WINDOW:STREAMS[:REREAD[:ENGINE]]' -> (window, streams, reread, engine), None for 0 / absent."""
    parts = text.split(":") + ["0", "0", "0"]
    w, s, rr = (int(v) or None for v in parts[:3])
    return w, s, rr, (parts[3] if parts[3] != "0" else None)


def baselines(data: bytes) -> dict:
    import zstandard
    out = {}
    for name, fn in (("xz -9e", lambda d: lzma.compress(d, preset=9 | lzma.PRESET_EXTREME)),
                     ("zstd -19", lambda d: zstandard.ZstdCompressor(level=19).compress(d))):
        t = time.perf_counter()
        size = len(fn(data))
        out[name] = {"bytes": size, "bpb": 8 * size / len(data), "compress_KBps": len(data) / (time.perf_counter() - t) / 1e3}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--checkpoint", default="", help="use this run instead of training one")
    ap.add_argument("--reader", default="", help="measure the last --bytes of the sample as this reader "
                    "decodes it (fasta: the bases), instead of raw bytes after the training head")
    ap.add_argument("--file", default="", help="measure the first --bytes of this file (e.g. a held-out file of "
                    "the --checkpoint run; with --reader as it decodes it) instead of the sample")
    ap.add_argument("--train-steps", type=int, default=300, help="0: random initial weights (speed only)")
    ap.add_argument("--train-bytes", type=int, default=800_000)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--bytes", type=int, default=100_000, help="size of the measured slice")
    ap.add_argument("--configs", default="", help="comma-separated WINDOW:STREAMS[:REREAD[:ENGINE]] (0 or absent: "
                    "the default; on the CPU REREAD 0 slides the window, K re-reads K tokens; ENGINE cpu or "
                    "lockstep), "
                    "e.g. 1024:1024,128:4096 (default: one, both chosen by bytemodel)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--graph", choices=("default", "off", "on", "both"), default="default",
                    help="the GPU's captured lockstep step (compress.driver.GPU_GRAPH): as bytemodel has it, off "
                    "(the step launched from Python), on, or both in turn (the same .bmz bytes checked)")
    ap.add_argument("--quick", action="store_true", help="skip the stats pass and xz / zstd (speed and size only)")
    ap.add_argument("--json", default="", help="also write the results here")
    args = ap.parse_args()
    head, data = load_data(args.train_bytes, args.bytes, args.reader, args.file)
    with tempfile.TemporaryDirectory() as tmp:
        lm = model(args, head, Path(tmp))
        configs = [_config(c) for c in args.configs.split(",") if c] or [(None, None, None, None)]
        base = baselines(data) if not args.quick else None
        rows = []
        from bytemodel.compress import driver
        graphs = {"default": [driver.GPU_GRAPH], "off": [False], "on": [True], "both": [False, True]}[args.graph]
        for w, s, rr, eng in configs:
            for g in graphs:
                driver.GPU_GRAPH = g
                ws = 64 if args.quick else s      # quick: a warm-up of 64 steps, not ~1,000 (kernels built, pools filled)
                lm.decompress(lm.compress(data[:4096], window=w, streams=ws, reread=rr, engine=eng))   # warm-up
                r = measure(lm, data, w, s, args.rounds, rr, eng, args.quick)
                rows.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
            if len(graphs) > 1:
                assert rows[-1]["sha256"] == rows[-2]["sha256"], "the captured step's file differs from the launched one's"
                print("the same .bmz bytes with the step captured and launched", file=sys.stderr, flush=True)
    from bytemodel.compress.driver import backend_info
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.checkpoint or args.preset} on {backend_info(lm.model)['device']}, {len(data):,} bytes, load average {load:.1f}")
    if args.quick:
        print("| engine | graph | window | streams | lane | compress KB/s | decompress KB/s | KB per CPU-s (c / d) | .bmz bits/byte |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['engine']} | {'on' if r['graph'] else 'off'} | {r['window']} | {r['streams']} | {r['lane']} | "
                  f"{r['compress_KBps']:.1f} | {r['decompress_KBps']:.1f} | "
                  f"{r['compress_KB_per_cpu_s']:.1f} / {r['decompress_KB_per_cpu_s']:.1f} | {r['bmz_bpb']:.3f} |")
        if args.json:
            Path(args.json).write_text(json.dumps({"rows": rows, "load": load, "preset": args.preset,
                                                   "device": args.device}, indent=1))
        return
    print("| engine | window | re-read | streams | lane | compress KB/s | decompress KB/s | KB per CPU-s (c / d) | .bmz bits/byte | "
          "model cross-entropy | xz -9e | zstd -19 | .bmz / xz | .bmz / zstd |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['engine']} | {r['window']} | {r['reread'] or 'slide'} | {r['streams']} | {r['lane']} | {r['compress_KBps']:.1f} | {r['decompress_KBps']:.1f} | "
              f"{r['compress_KB_per_cpu_s']:.1f} / {r['decompress_KB_per_cpu_s']:.1f} | "
              f"{r['bmz_bpb']:.3f} | {r['model_bpb']:.3f} | {base['xz -9e']['bpb']:.3f} | "
              f"{base['zstd -19']['bpb']:.3f} | {r['bmz_bytes'] / base['xz -9e']['bytes']:.3f} | "
              f"{r['bmz_bytes'] / base['zstd -19']['bytes']:.3f} |")
    print(f"xz -9e compresses at {base['xz -9e']['compress_KBps']:.0f} KB/s, zstd -19 at "
          f"{base['zstd -19']['compress_KBps']:.0f} KB/s here")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "baselines": base, "load": load,
                                               "preset": args.preset, "device": args.device}, indent=1))


if __name__ == "__main__":
    main()
