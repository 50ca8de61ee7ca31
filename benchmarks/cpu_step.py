"""Batch-1 CPU generation: the one-token step (decode/cpu_step.py, BLAS held to one thread for
small models) against the general path it replaced (Model.forward_cached each token, BLAS at the
process's count), in one process, alternating, median of the rounds; both must draw the same bytes.

    PYTHONPATH=. python3 benchmarks/cpu_step.py --presets tiny,small --rounds 3 --tokens 256
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from bytemodel.config import preset
from bytemodel.decode import cpu_step, generate as gen
from bytemodel.model import Model
from bytemodel.ops import numpy_ops
from bytemodel.tokenizer import Tokenizer

PROMPT = bytes(range(32, 96))   # as benchmarks/cpu_generate.py


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} at the start")
    print("| preset | tokens | one-token step tokens/s | general path tokens/s | ratio | same bytes |")
    print("|---|---|---|---|---|---|")
    real_hold = cpu_step.OneBlasThread
    for name in a.presets.split(","):
        cfg = preset(name)
        m = Model(cfg, numpy_ops)
        m.init_weights(0)
        tok, n = Tokenizer(), min(a.tokens, cfg.context - len(PROMPT) - 2)
        gen.generate(m, tok, 8, PROMPT, seed=0)   # warm
        rates, outs = {True: [], False: []}, {}
        for _ in range(a.rounds):
            for new in (True, False):
                gen.ONE_TOKEN_STEP = new
                gen.OneBlasThread = real_hold if new else (lambda model, hold=True: real_hold(model, False))
                t = time.perf_counter()
                outs[new] = gen.generate(m, tok, n, PROMPT, seed=0)
                rates[new].append(n / (time.perf_counter() - t))
        gen.ONE_TOKEN_STEP, gen.OneBlasThread = True, real_hold
        x, y = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"| {name} | {n} | {x:,.0f} | {y:,.0f} | {x / y:.2f} | {outs[True] == outs[False]} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
