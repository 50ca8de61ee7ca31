"""Batch-1 CPU generation with the step's second thread (decode/cpu_pair.py: the large products
in column parts on two threads, one thread or two chosen by their measured times) against the
step on one thread, in one process, alternating, median of the rounds; both must draw the same
bytes. The pair is off by default (decode/generate.PAIR_STEP: it never won on the 2-core VM); it
could only help while a second core is free: the load average is printed, and the share of the
tokens the chooser ran on two threads.

    PYTHONPATH=. python3 benchmarks/cpu_pair.py --presets small --rounds 5 --tokens 256
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from bytemodel.config import preset
from bytemodel.decode import cpu_pair, generate as gen
from bytemodel.model import Model
from bytemodel.ops import numpy_ops
from bytemodel.tokenizer import Tokenizer

PROMPT = bytes(range(32, 96))   # as benchmarks/cpu_generate.py


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="small")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=256)
    a = ap.parse_args()
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the start")
    print("| preset | tokens | pair tokens/s | one thread tokens/s | ratio | tokens on two threads | same bytes |")
    print("|---|---|---|---|---|---|---|")
    real_pair_for, real_faster = gen.pair_for, cpu_pair.Faster
    gen.PAIR_STEP = True        # off by default: this benchmark is what would turn it on
    made = []

    def counted():
        made.append(real_faster())
        return made[-1]
    for name in a.presets.split(","):
        cfg = preset(name)
        m = Model(cfg, numpy_ops)
        m.init_weights(0)
        tok, n = Tokenizer(), min(a.tokens, cfg.context - len(PROMPT) - 2)
        gen.generate(m, tok, 8, PROMPT, seed=0)   # warm
        rates, outs = {True: [], False: []}, {}
        import bytemodel.decode.cpu_step as cs
        cs.Faster = counted
        for _ in range(a.rounds):
            for on in (True, False):
                gen.pair_for = (lambda c: real_pair_for(c)) if on else (lambda c: False)
                t = time.perf_counter()
                outs[on] = gen.generate(m, tok, n, PROMPT, seed=0)
                rates[on].append(n / (time.perf_counter() - t))
        gen.pair_for, cs.Faster = real_pair_for, real_faster
        two = sum(f.steps[1] for f in made) / max(1, sum(sum(f.steps) for f in made))
        made.clear()
        x, y = statistics.median(rates[True]), statistics.median(rates[False])
        print(f"| {name} | {n} | {x:,.0f} | {y:,.0f} | {x / y:.2f} | {two:.0%} | {outs[True] == outs[False]} |",
              flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
