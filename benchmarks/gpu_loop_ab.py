"""The CLI's training loop on the GPU, with and without running a step ahead (same run).

    PYTHONPATH=. python3 benchmarks/gpu_loop_ab.py --source datasets/klebsiella_hs11286_1m.fa.gz

Trains the base preset for --steps steps twice through bytemodel.train: once as shipped (step s
queued before step s-1 is read on the host), once with the backend's fetch_async hidden (the loop
then reads each step's loss and norm before queuing the next). Prints tokens/s over the steps
between the two validations (from metrics.jsonl) and the final validation bits/byte.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import bytemodel
from bytemodel.ops import cuda_ops


def run(source, steps, batch, ahead):
    out = Path(tempfile.mkdtemp()) / "run"
    saved = cuda_ops.CudaBackend.fetch_async
    if not ahead:
        cuda_ops.CudaBackend.fetch_async = None
    try:
        r = bytemodel.train(source, out, preset="base", steps=steps, batch_size=batch, device="cuda",
                            precision="fp16", eval_every=steps // 2, eval_tokens=8192, lr=6e-4, warmup=20)
    finally:
        cuda_ops.CudaBackend.fetch_async = saved
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    i0 = next(i for i, x in enumerate(recs) if "val_bpb" in x)
    t0, t1 = recs[i0 + 1], recs[-2]          # steps between the two validations (and saves)
    ntok = (t1["step"] - t0["step"]) * batch * 1024
    tps = ntok / (t1["time"] - t0["time"])
    shutil.rmtree(out.parent)
    return tps, r.val_bpb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    a = ap.parse_args()
    for ahead in (False, True, False, True):
        tps, val = run(a.source, a.steps, a.batch, ahead)
        print(f"{'ahead' if ahead else 'sync '}: {tps / 1e3:.1f}k tokens/s (after the first validation), "
              f"final validation {val:.4f} bits/byte", flush=True)


if __name__ == "__main__":
    main()
