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

from _ab import alternate
from bytemodel.decode import cpu_pair, generate as gen


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
    import bytemodel.decode.cpu_step as cs

    def switch(on):
        gen.pair_for = (lambda c: real_pair_for(c)) if on else (lambda c: False)
    for name in a.presets.split(","):
        n, x, y, same = alternate(name, a.tokens, a.rounds, switch, warmed=lambda: setattr(cs, "Faster", counted))
        gen.pair_for, cs.Faster = real_pair_for, real_faster
        two = sum(f.steps[1] for f in made) / max(1, sum(sum(f.steps) for f in made))
        made.clear()
        print(f"| {name} | {n} | {x:,.0f} | {y:,.0f} | {x / y:.2f} | {two:.0%} | {same} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
