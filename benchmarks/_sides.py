"""Run each side of a CPU benchmark in its own process, alternating, and take the median.

Two numerical runtimes in one process interfere: PyTorch's OpenMP pool and NumPy's OpenBLAS
threads contend for the same two cores (measured here: bytemodel's small-preset generation fell
from ~250 to ~60 tokens/s once torch was imported beside it). So every measurement is a fresh
`python SCRIPT --side ours|torch --preset P` that prints one number, and the sides alternate.
"""
from __future__ import annotations

import argparse
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


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--side", choices=["ours", "torch"], help="measure one side in this process")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="PyTorch's intra-op threads (default 0: one per core); 1 is its best on a loaded machine")
    return ap


def main(script: str, args, measure, shape_header: str, shape, extra: list[str]) -> None:
    """With --side: print measure(side, preset) alone (this is the child process). Without: the
    markdown table, each side measured in its own process, alternating, median of the rounds."""
    if args.side:
        if args.side == "torch":
            import torch
            torch.set_num_threads(args.torch_threads or os.cpu_count())
        print(measure(args.side, args.presets))
        return
    import numpy as np
    import torch
    if args.torch_threads:
        extra = extra + ["--torch-threads", str(args.torch_threads)]
    print(f"torch {torch.__version__} ({args.torch_threads or os.cpu_count()} threads), numpy {np.__version__}, "
          f"{os.cpu_count()} cores; median of {args.rounds} alternating rounds, each side in its own process; "
          f"load average {os.getloadavg()[0]:.1f} at the start")
    print(f"| preset | {shape_header} | bytemodel tokens/s | PyTorch eager tokens/s | ratio |")
    print("|---|---|---|---|---|")
    for name in args.presets.split(","):
        ma, mb = compare(script, name, args.rounds, extra)
        print(f"| {name} | {shape(name)} | {ma:,.0f} | {mb:,.0f} | {ma / mb:.2f} |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
