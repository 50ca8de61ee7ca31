"""The compressor's window policies by size: the model's cross-entropy on a stream layout when the
window slides (the cpu engine's default) and when it is re-read (generation's policy).

For each WINDOW:REREAD (REREAD 0: slide) it cuts the last --bytes of the data into --streams
contiguous streams (each starting from <doc>, as `compress` does), pushes them through
cpu_lockstep.CpuLockstep and sums -log2 p(next token) in float64: the bits a .bmz payload would
take under that layout (the payload is within 0.03% of it; benchmarks/README.md). No timing.

    # the README's quick-start model, the last 60,000 bases of the sample (FASTA reader)
    PYTHONPATH=. python benchmarks/compress_windows.py --checkpoint runs/klebs --reader fasta \\
        --bytes 60000 --streams 128 --policies 32:0,32:16,64:0,64:32,64:16,128:0,128:64,256:128
    # any file's last bytes, as they are
    PYTHONPATH=. python benchmarks/compress_windows.py --checkpoint RUN --file FILE --bytes 60000
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

import bytemodel
from bytemodel.compress.cpu_engine import CpuLockstep, Folded
from bytemodel.ops import numpy_ops
from bytemodel.resources import datasets_dir

# the model's coding timed and sized even where it would expand the file (random weights do;
# `compress` would pack such a file's bytes instead: compress/driver.py)
os.environ.setdefault("BYTEMODEL_PACK", "0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--file", default="", help="data file (default: the shipped Klebsiella sample)")
    ap.add_argument("--reader", default="", help="decode the data with this reader first (e.g. fasta)")
    ap.add_argument("--bytes", type=int, default=60_000, help="measure the data's last BYTES")
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--policies", default="32:0,64:0,128:0,256:128", help="comma-separated WINDOW:REREAD")
    a = ap.parse_args()
    src = Path(a.file) if a.file else datasets_dir() / "klebsiella_hs11286_1m.fa.gz"
    if a.reader:
        from bytemodel.readers import read_documents
        seq = b"".join(read_documents(src, a.reader))
    else:
        import gzip
        seq = src.read_bytes()
        seq = gzip.decompress(seq) if src.suffix == ".gz" else seq
    seq = seq[-a.bytes:]
    lm = bytemodel.load(a.checkpoint)
    ids = lm.tokenizer.encode(seq).astype(np.int64)
    S = a.streams
    n = len(ids) // S * S
    streams = ids[:n].reshape(S, -1)
    folded = Folded(lm.model)
    rows = np.arange(S)
    print(f"{a.checkpoint}: {n:,} tokens of {src.name}{' (' + a.reader + ')' if a.reader else ''} in {S} streams "
          f"of {n // S}")
    print("| window | policy | bits/token |")
    print("|---|---|---|")
    for pol in a.policies.split(","):
        W, rr = (int(v) for v in pol.split(":"))
        L = CpuLockstep(lm.model, S, W, rr, folded)
        feed = np.full(S, lm.tokenizer.doc_id)
        bits = 0.0
        for i in range(streams.shape[1]):
            logp = numpy_ops.log_softmax(L.push(feed).astype(np.float64))
            feed = streams[:, i]
            bits -= logp[rows, feed].sum() / np.log(2)
        print(f"| {W} | {'slide' if rr == 0 else f're-read {rr}'} | {bits / n:.4f} |", flush=True)


if __name__ == "__main__":
    main()
