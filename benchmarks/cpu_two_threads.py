"""A small model's generation on the CPU with the step's products at one BLAS thread against two
when that times faster (decode/cpu_step.BlasThreads, `generate.TWO_BLAS_STEP`), in one process,
alternating (across processes this machine's noise is larger than the difference), the same
bytes both ways checked.

    PYTHONPATH=. python3 benchmarks/cpu_two_threads.py [--preset small] [--tokens 512] [--rounds 8]
"""
from __future__ import annotations

import argparse
import os
import time

from bytemodel.config import preset
from bytemodel.decode import generate as G
from bytemodel.model import Model
from bytemodel.ops import numpy_ops
from bytemodel.tokenizer import Tokenizer

PROMPT = bytes(range(32, 96))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    tok = Tokenizer()
    m = Model(preset(a.preset, vocab_size=tok.vocab_size), numpy_ops)
    m.init_weights(0)
    G.generate(m, tok, 8, PROMPT, seed=0)              # warm up
    res, outs = {False: [], True: []}, {}
    load = os.getloadavg()[0]
    for _ in range(a.rounds):
        for two in (False, True):
            G.TWO_BLAS_STEP = two
            t = time.perf_counter()
            outs[two] = G.generate(m, tok, a.tokens, PROMPT, seed=0)
            res[two].append(a.tokens / (time.perf_counter() - t))
    med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
    up = sum(b > c for b, c in zip(res[True], res[False]))
    print(f"{a.preset}, {a.tokens} tokens, {a.rounds} rounds, load {load:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"same bytes: {outs[False] == outs[True]}")
    print(f"one thread: median {med[False]:.0f} tokens/s ({', '.join(f'{x:.0f}' for x in res[False])})")
    print(f"two when faster: median {med[True]:.0f} tokens/s ({', '.join(f'{x:.0f}' for x in res[True])}); "
          f"{med[True] / med[False]:.3f}x, {up} of {a.rounds} rounds up")


if __name__ == "__main__":
    main()
