"""Batch-1 CPU generation: the one-token step (decode/cpu_step.py, BLAS held to one thread for
small models) against the general path it replaced (Model.forward_cached each token, BLAS at the
process's count), in one process, alternating, median of the rounds; both must draw the same bytes.

    PYTHONPATH=. python3 benchmarks/cpu_step.py --presets tiny,small --rounds 3 --tokens 256
"""
from __future__ import annotations

import argparse
import os

from _ab import alternate
from bytemodel.decode import cpu_step, generate as gen


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

    def switch(new):
        gen.ONE_TOKEN_STEP = new
        gen.OneBlasThread = real_hold if new else (lambda model, hold=True: real_hold(model, False))
    for name in a.presets.split(","):
        n, x, y, same = alternate(name, a.tokens, a.rounds, switch)
        gen.ONE_TOKEN_STEP, gen.OneBlasThread = True, real_hold
        print(f"| {name} | {n} | {x:,.0f} | {y:,.0f} | {x / y:.2f} | {same} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
