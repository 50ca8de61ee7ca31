"""Where a compressor step's time goes: the model's lockstep step, the quantisation (with the copy
to the host), and the range coder, for several (streams, window) layouts.

    PYTHONPATH=. python benchmarks/lockstep_profile.py --device cuda --precision fp16 --preset base \\
        --layouts 1024:1024,4096:128,8192:64

For each STREAMS:WINDOW it fills a Lockstep of random initial weights (the speed does not depend
on the weights) and times --steps more pushes (default window/2: with the re-read policy, the
cache goes from half full to full and one re-read, whose cost is thus amortised as in a real
run; with the sliding policy, the cache stays full). Per step: the push (synchronised), quantise + copy of the frequencies to the host, and
constriction's encode of one symbol per stream. tokens/s = streams / (sum of the three).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bytemodel.compress.driver import quantise
from bytemodel.config import preset
from bytemodel.decode.lockstep import Lockstep
from bytemodel.model import Model
from bytemodel.ops import get_backend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--layouts", default="64:64,256:64")
    ap.add_argument("--steps", type=int, default=0, help="timed steps (default: window/2, one re-read period)")
    ap.add_argument("--attention", default="decode", help="cuda: decode (attention_decode's kernel), flash "
                    "(FlashAttention for the one-token step, as before), or both (each layout twice)")
    ap.add_argument("--policy", default="reread", help="reread (window/2 when full), slide (a ring), or both")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    cfg = preset(a.preset)
    ops = get_backend(a.device, a.precision)
    m = Model(cfg, ops=ops)
    m.init_weights(0)
    xp = m.xp
    sync = (lambda: xp.cuda.Stream.null.synchronize()) if a.device == "cuda" else (lambda: None)
    try:
        import constriction
        family = constriction.stream.model.Categorical(perfect=False)
    except ImportError:
        constriction = family = None
    rows = []
    paths = ["decode", "flash"] if a.attention == "both" else [a.attention]
    policies = ["slide", "reread"] if a.policy == "both" else [a.policy]
    for lay, path, policy in [(lay, path, pol) for lay in a.layouts.split(",") for path in paths for pol in policies]:
        S, W = (int(v) for v in lay.split(":"))
        if a.device == "cuda":
            ops.decode_attention = path == "decode"
        L = Lockstep(m, S, W, slide=policy == "slide")
        rng = np.random.default_rng(0)
        for _ in range(W // 2 if policy == "reread" else W):   # re-read: the steps below see W/2..W keys
            lg = L.push(rng.integers(0, 256, S))
        ops.to_numpy(quantise(lg, 256, xp).astype(xp.float32))   # its kernels compiled before timing
        sync()
        n = a.steps or W // 2                        # re-read: exactly one re-read in these steps, its amortised cost
        t_push = t_q = t_c = 0.0
        enc = constriction.stream.queue.RangeEncoder() if constriction else None
        for _ in range(n):
            ids = rng.integers(0, 256, S)
            t = time.perf_counter()
            lg = L.push(ids)
            sync()
            t_push += time.perf_counter() - t
            t = time.perf_counter()
            f = ops.to_numpy(quantise(lg, 256, xp).astype(xp.float32))
            t_q += time.perf_counter() - t
            if enc is not None:
                t = time.perf_counter()
                enc.encode(ids.astype(np.int32), family, f)
                t_c += time.perf_counter() - t
        step = (t_push + t_q + t_c) / n
        r = {"streams": S, "window": W, "attention": path if a.device == "cuda" else "numpy", "policy": policy, "steps": n, "push_ms": 1e3 * t_push / n, "quantise_ms": 1e3 * t_q / n,
             "coder_ms": 1e3 * t_c / n, "tokens_per_s": S / step, "model_only_tokens_per_s": S * n / t_push}
        rows.append(r)
        print(json.dumps(r), flush=True)
        del L
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"preset": a.preset, "device": a.device, "precision": a.precision, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
