"""Scoring speed: `score` (batched windows, log-softmax on the device, only sums back) against
the path it replaced (one window at a time, logits to the host, float64 log-softmax there) and,
on a GPU, against Hugging Face transformers' forward on the same weights and the same windows.

The model has the preset's shape and random weights (seed 0): speed does not depend on the
weights. The data: --mb megabytes of text (this repository's docs and sources, repeated), scored
as one document. Every side scores the same windows (context T, overlapping by T/2); each target
once. Figures are scored bytes per second, warm (a first call on a small slice compiles and
fills the memory pools); the sides alternate in each of --rounds rounds and the median is given.
glibc's malloc is set as the `bytemodel` command sets it (cli/memory.roomy_malloc) for both sides,
unless --plain-malloc.

    python3 benchmarks/score.py --device cpu --preset tiny --mb 0.2 --rounds 3
    python3 benchmarks/score.py --device cuda --preset base --mb 8 --hf --rounds 2
    python3 benchmarks/score.py --device cuda --preset base --mb 8 --reference-mb 0.05 --whole-forward --rounds 3

HF peer: LlamaForCausalLM (weights copied as in benchmarks/generate.py, the copy checked there),
fp16, SDPA attention, batches of the same windows, logits -> float32 log_softmax -> gather ->
float64 sum on the GPU (the same work as ours).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]

from bytemodel.config import preset  # noqa: E402
from bytemodel.decode.score import doc_windows, reference_score, score  # noqa: E402
from bytemodel.model import Model  # noqa: E402
from bytemodel.tokenizer import Tokenizer  # noqa: E402


def text(n: int) -> bytes:
    src = b"".join(p.read_bytes() for p in sorted(ROOT.glob("docs/*.md")) + sorted(ROOT.glob("bytemodel/**/*.py")))
    return (src * (n // len(src) + 1))[:n]


def sync(device):
    if device == "cuda":
        import cupy as cp
        cp.cuda.Device().synchronize()


def hf_scorer(name, data: bytes, batch: int):
    import torch
    from generate import hf_model
    hm, err = hf_model(name, "cuda", torch.float16)
    T = preset(name).context
    ids = np.concatenate([[256], np.frombuffer(data, np.uint8)]).astype(np.int64)
    wins = list(doc_windows([ids], T))

    def run():
        total = torch.zeros((), dtype=torch.float64, device="cuda")
        with torch.inference_mode():
            for i in range(0, len(wins), batch):
                g = wins[i:i + batch]
                L = max(len(x) for x, _, _ in g)
                X = torch.zeros((len(g), L), dtype=torch.long)
                Y = torch.zeros((len(g), L), dtype=torch.long)
                M = torch.zeros((len(g), L), dtype=torch.bool)
                for j, (x, y, k) in enumerate(g):
                    X[j, :len(x)] = torch.from_numpy(x)
                    Y[j, :len(y)] = torch.from_numpy(y)
                    M[j, k:len(y)] = True
                X, Y, M = X.cuda(), Y.cuda(), M.cuda()
                lp = torch.log_softmax(hm(X).logits[..., :257].float(), -1)
                nll = -lp.gather(-1, Y[..., None])[..., 0]
                total += (nll * M).double().sum()
        return float(total) / np.log(2)
    return run, err


def train_forward(m, data: bytes, B: int):
    """-> (run, bytes): a training step's forward pass (Model.forward: activations kept, per-token
    losses) over `data` cut into windows of T, the preset's training batch at a time, split over
    the trainer's CPU workers with BLAS held as training holds it (training/runner.CoreParallel);
    B: the preset's training batch; run() returns the summed loss in bits (over every position: a window's first bytes have less
    context than score gives them)."""
    from bytemodel.training.runner import CoreParallel
    T = m.cfg.context
    ids = np.frombuffer(data, np.uint8).astype(np.int64)
    n = (len(ids) - 1) // T
    x, y = ids[:n * T].reshape(n, T), ids[1:n * T + 1].reshape(n, T)
    cp_ = CoreParallel(m)
    o = m.ops

    def fwd(r, xs, ys):
        return float(o.to_numpy(r.forward(o.asarray(xs), o.asarray(ys))).astype(np.float64).sum())

    def run():
        total = 0.0
        for i in range(0, n, B):
            xb, yb = x[i:i + B], y[i:i + B]
            if cp_.pool is None or len(xb) == 1:
                total += fwd(m, xb, yb)
                continue
            parts = cp_._slices(len(xb))
            total += sum(cp_._run(lambda: [f.result() for f in [cp_.pool.submit(fwd, r, xb[s], yb[s])
                                                                 for r, s in zip(cp_.replicas, parts)]]))
        return total / np.log(2)
    return run, n * T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--mb", type=float, default=0.2)
    ap.add_argument("--reference-mb", type=float, default=0.0, help="bytes for the old path (default: --mb)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hf", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--plain-malloc", action="store_true", help="glibc's defaults, not the CLI's roomy_malloc")
    ap.add_argument("--train-forward", action="store_true",
                    help="also time a training step's forward pass over the same bytes (issue 24: score at "
                         "least as fast per byte): windows of T side by side, each byte once, the preset's "
                         "training batch split over the trainer's workers as training splits it")
    ap.add_argument("--whole-forward", action="store_true",
                    help="also time score with every layer at every position (ops/scorer.TAIL off: the last "
                         "layer and the head over the whole window, as the GPU ran before the thirty-fourth session)")
    a = ap.parse_args()
    from bytemodel.cli.memory import roomy_malloc
    from bytemodel.ops import get_backend
    roomy = not a.plain_malloc and roomy_malloc()     # as `bytemodel` sets it for every command
    precision = a.precision or ("fp16" if a.device == "cuda" else "fp32")
    cfg = preset(a.preset)
    m = Model(cfg, get_backend(a.device, precision))
    m.init_weights(0)
    tok = Tokenizer()
    data = text(int(a.mb * 1e6))
    ref_data = data[:int((a.reference_mb or a.mb) * 1e6)]
    sides = {"ours (score)": lambda: score(m, tok, data)["bits"],
             "before (one window at a time, host float64)": lambda: reference_score(m, tok, ref_data)["bits"]}
    sizes = {"ours (score)": len(data), "before (one window at a time, host float64)": len(ref_data)}
    if a.whole_forward:
        from bytemodel.ops import scorer

        def whole():
            scorer.TAIL = False
            try:
                return score(m, tok, data)["bits"]
            finally:
                scorer.TAIL = True
        sides["ours, whole forward (TAIL off)"] = whole
        sizes["ours, whole forward (TAIL off)"] = len(data)
    if a.hf:
        from bytemodel.ops.scorer import Scorer
        run, err = hf_scorer(a.preset, data, Scorer(m).batch)
        sides["transformers forward (same windows)"] = run
        sizes["transformers forward (same windows)"] = len(data)
    if a.train_forward:
        from bytemodel.training.autoconf import PRESET_TRAIN
        run, n = train_forward(m, data, PRESET_TRAIN[a.preset]["batch_size"])
        sides["training forward (the trainer's batch and workers, each byte once)"] = run
        sizes["training forward (the trainer's batch and workers, each byte once)"] = n
    score(m, tok, data[:20000])         # compile, warm up
    reference_score(m, tok, data[:2000])
    rates = {k: [] for k in sides}
    bits = {}
    for _ in range(a.rounds):
        for k, f in sides.items():
            sync(a.device)
            t = time.perf_counter()
            bits[k] = f()
            sync(a.device)
            rates[k].append(sizes[k] / (time.perf_counter() - t))
    res = {k: statistics.median(v) for k, v in rates.items()}
    # tokens through the model a second: score and the old path read every window whole (half of
    # each overlaps the last), the training forward each byte once
    T = cfg.context
    per_byte = {k: 1.0 for k in sides}
    for k, d in (("ours (score)", data), ("ours, whole forward (TAIL off)", data), ("before (one window at a time, host float64)", ref_data)):
        ids = np.concatenate([[tok.doc_id], np.frombuffer(d, np.uint8)]).astype(np.int64)
        per_byte[k] = sum(len(x) for x, _, _ in doc_windows([ids], T)) / len(d)
    print(f"{a.device} {precision} {a.preset}: {len(data):,} bytes; malloc {'roomy (as the CLI)' if roomy else 'plain'}")
    print("| side | bytes | bits/byte | bytes/s | ratio to ours | tokens through the model a second |")
    print("|---|---:|---:|---:|---:|---:|")
    ours = res["ours (score)"]
    for k, v in res.items():
        print(f"| {k} | {sizes[k]:,} | {bits[k] / sizes[k]:.4f} | {v:,.0f} | {v / ours:.3f} | {v * per_byte[k]:,.0f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"rates": res, "bits": bits, "sizes": sizes}))


if __name__ == "__main__":
    main()
