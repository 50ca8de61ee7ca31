"""Data parallel on GPUs: check the MPI + NCCL path and measure it against plain single-GPU training.

One process, no launcher (what a machine with one GPU allows):
    PYTHONPATH=. python3 benchmarks/distributed_gpu.py --out result.json
trains the same run three times in this process: plain (distributed off), through MPI + NCCL with
one rank, and with one rank and --shard-optimizer (reduce-scatter / all-gather with NCCL); prints
how far the weights are from the plain run's and the tokens/s ratio against it.

Several GPUs (scaling: tokens/s per GPU against one GPU, the same per-GPU batch):
    PYTHONPATH=. python3 benchmarks/distributed_gpu.py --ranks-run 1 --out one.json
    mpiexec -n 8 python3 benchmarks/distributed_gpu.py --ranks-run 8 --out eight.json
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import bytemodel
from bytemodel import checkpoint as ck


def synthetic(path: Path, n: int = 4_000_000):
    """Learnable bytes: words drawn from a small vocabulary (fast to make, no files needed)."""
    rng = np.random.default_rng(0)
    words = [bytes(rng.integers(97, 123, rng.integers(2, 9))) for _ in range(3000)]
    idx = rng.zipf(1.3, n // 4) % len(words)
    path.write_bytes(b" ".join(words[i] for i in idx)[:n])


def tokens_per_s(history, skip=3):
    rec = [h["tokens_per_s"] for h in history[skip:] if "val_bpb" not in h]
    return float(np.median(rec)) if rec else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32, help="windows per GPU")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script")
    ap.add_argument("--ranks-run", type=int, default=0, help="scaling mode: one run on this many ranks")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    data = tmp / "words.txt"
    synthetic(data)
    common = dict(preset=a.preset, context=a.context, steps=a.steps, eval_every=a.steps,
                  eval_tokens=8 * a.context, warmup=5, device=a.device, precision=a.precision)
    result = {"argv": sys.argv[1:]}
    if a.ranks_run:
        from bytemodel.training import distributed
        world = distributed.connect("mpi")
        t = time.perf_counter()
        r = bytemodel.train(data, tmp / "run", batch_size=a.batch * world.size, distributed="mpi", **common)
        result.update(ranks=world.size, tokens_per_s=tokens_per_s(r.history),
                      tokens_per_s_per_gpu=tokens_per_s(r.history) / world.size, wall_s=time.perf_counter() - t)
        if not world.main:
            return
    else:
        runs = {}
        for name, extra in [("plain", dict(distributed="off")), ("nccl_1rank", dict(distributed="mpi")),
                            ("nccl_1rank_sharded", dict(distributed="mpi", shard_optimizer=True)),
                            ("plain_again", dict(distributed="off"))]:
            t = time.perf_counter()
            r = bytemodel.train(data, tmp / name, batch_size=a.batch, **common, **extra)
            runs[name] = r
            result[name] = {"tokens_per_s": tokens_per_s(r.history), "wall_s": time.perf_counter() - t,
                            "final_loss": r.history[-1]["loss"], "val_bpb": r.val_bpb}
            print(name, result[name], flush=True)
        ref = ck.load(runs["plain"].checkpoint)
        for name in ("nccl_1rank", "nccl_1rank_sharded", "plain_again"):
            c = ck.load(runs[name].checkpoint)
            result[name].update(bit_identical=bool(np.array_equal(c.params, ref.params)),
                                max_abs_diff=float(np.abs(c.params - ref.params).max()),
                                m_max_abs_diff=float(np.abs(c.m - ref.m).max()),
                                ratio_tokens_per_s=result[name]["tokens_per_s"] / result["plain"]["tokens_per_s"])
        try:
            from mpi4py import MPI
            result["mpi_library"] = MPI.Get_library_version().splitlines()[0]
        except Exception as e:  # noqa: BLE001 (report what failed)
            result["mpi_library"] = repr(e)
        if a.device == "cuda":
            from cupy.cuda import nccl
            result["nccl_version"] = nccl.get_version()
    print(json.dumps(result, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
