"""Run each side of a CPU benchmark in its own process, alternating, and take the median.

Two numerical runtimes in one process interfere: PyTorch's OpenMP pool and NumPy's OpenBLAS
threads contend for the same two cores (measured here: bytemodel's small-preset generation fell
from ~250 to ~60 tokens/s once torch was imported beside it). So every measurement is a fresh
`python SCRIPT --side ours|torch --preset P` that prints one number, and the sides alternate.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys


def measure(script: str, side: str, preset: str, extra: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, script, "--side", side, "--presets", preset] + extra,
                         capture_output=True, text=True, env=env, check=True).stdout
    return float(out.strip().splitlines()[-1])


def compare(script: str, preset: str, rounds: int, extra: list[str]) -> tuple[float, float]:
    a, b = [], []
    for _ in range(rounds):
        a.append(measure(script, "ours", preset, extra))
        b.append(measure(script, "torch", preset, extra))
    return statistics.median(a), statistics.median(b)
