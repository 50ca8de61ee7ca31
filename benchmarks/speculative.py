"""Self-speculative decoding with MTP heads: bytes/s with and without speculation, batch 1.

For each run directory: the main head's bits/byte on a held-out file (decoded by the run's
reader, as `bytemodel score` does), then plain and speculative generation of --bytes bytes
after the same prompt through the Python API (`lm.generate(..., speculative=True)`), timed in
alternating rounds (median), with the drafts' acceptance rate and tokens per forward pass.

    PYTHONPATH=. python benchmarks/speculative.py RUN [RUN...] --heldout FILE [--device cuda]
        [--precision fp32|fp16|bf16] [--bytes 1024] [--temperature 1.0] [--rounds 3] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import bytemodel
from bytemodel.readers import read_documents
from bytemodel.decode.speculative import SpecStats


def bench(run, heldout, device, n, temperature, rounds, prompt, precision="fp32"):
    lm = bytemodel.load(run, device=device, precision=precision)
    reader = lm.reader or None                   # the reader the run recorded (runinfo.py)
    data = b"".join(read_documents(heldout, reader))
    bpb = lm.score(data)["bits_per_byte"] if heldout else float("nan")
    lm.generate(16, prompt, temperature, seed=0)                      # warm up (and compile)
    plain, spec, stats = [], [], SpecStats()
    for r in range(rounds):
        t = time.perf_counter()
        out = lm.generate(n, prompt, temperature, seed=r)
        plain.append(len(out) / (time.perf_counter() - t))
        if lm.cfg.mtp > 1:
            t = time.perf_counter()
            out = lm.generate(n, prompt, temperature, seed=r, speculative=True, stats=stats)
            spec.append(len(out) / (time.perf_counter() - t))
    row = dict(run=str(run), device=device, precision=precision, mtp=lm.cfg.mtp, design=lm.cfg.mtp_design,
               params=int(lm.model.size), heldout_bpb=bpb, temperature=temperature,
               plain_bytes_per_s=statistics.median(plain))
    if spec:
        row.update(spec_bytes_per_s=statistics.median(spec), speedup=statistics.median(spec) / row["plain_bytes_per_s"],
                   acceptance=stats.acceptance, tokens_per_pass=stats.tokens_per_step)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32", help="fp32 (the CLI's default), fp16 or bf16 (on cuda)")
    ap.add_argument("--bytes", type=int, default=1024)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    rows = []
    print("| run | device | K | design | held-out bpb | plain B/s | speculative B/s | speed-up | acceptance | tokens/pass |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    for run in a.runs:
        r = bench(run, a.heldout, a.device, a.bytes, a.temperature, a.rounds, a.prompt.encode(), a.precision)
        rows.append(r)
        print(f"| {run} | {a.device} | {r['mtp']} | {r['design'] if r['mtp'] > 1 else '-'} | {r['heldout_bpb']:.4f} "
              f"| {r['plain_bytes_per_s']:,.0f} | {r.get('spec_bytes_per_s', float('nan')):,.0f} "
              f"| {r.get('speedup', float('nan')):.2f} | {r.get('acceptance', float('nan')):.1%} "
              f"| {r.get('tokens_per_pass', float('nan')):.2f} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
