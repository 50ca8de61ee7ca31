"""A few lines from Nsight Compute's CSV (`ncu --csv --page details ...`, one kernel or more):
per kernel its duration, throughputs, registers, occupancy, tensor pipe (and the other pipes' issue
shares: xu is the special functions' pipe, exp2 among them, where asked), and the largest warp
stall reasons (from `--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio`,
where asked), so that benchmarks/device_check.sh ncu prints what a call found.

    python3 benchmarks/kernels/ncu_summary.py ncu_bwd_shipped.csv [more.csv ...]

Lines that are not the CSV (ncu's ==PROF== notes, the profiled program's own output) are skipped.
"""
from __future__ import annotations

import csv
import sys

WANT = ("Duration", "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput", "Registers Per Thread",
        "Achieved Occupancy", "Warp Cycles Per Issued Instruction", "Issue Slots Busy", "Dynamic Shared Memory Per Block")
STALL = "smsp__average_warps_issue_stalled_"


def number(text):
    """ncu's value as a float (thousands separators allowed), or None."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def rows(path):
    with open(path, errors="replace") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    head = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    return [] if head is None else list(csv.DictReader(lines[head:]))


def summary(path) -> list[str]:
    out, kernels = [], {}
    for r in rows(path):
        kernels.setdefault((r.get("ID"), r.get("Kernel Name", "?")), []).append(r)
    if not kernels:
        return [f"{path}: no ncu rows (see ncu.err beside it: ncu may not read counters on this machine)"]
    for (kid, name), rs in kernels.items():
        got = {r.get("Metric Name", ""): (r.get("Metric Value", ""), r.get("Metric Unit", "")) for r in rs}
        main = [f"{m} {got[m][0]} {got[m][1]}".strip() for m in WANT if m in got]
        tensor = [f"{m} {v}" for m, (v, u) in got.items() if "pipe_tensor" in m or "inst_executed_pipe_" in m]
        stalls = sorted(((number(v), m[len(STALL):].split("_per_issue")[0]) for m, (v, u) in got.items()
                         if m.startswith(STALL) and number(v) is not None), reverse=True)
        out.append(f"{path}: kernel {kid} {name.split('(')[0]}")
        out.append("   " + "; ".join(main))
        if tensor:
            out.append("   " + "; ".join(tensor))
        if stalls:
            out.append("   stalls (warps per issue): " + ", ".join(f"{n} {x:.2f}" for x, n in stalls[:8]))
    return out


def main():
    if len(sys.argv) < 2:
        raise SystemExit("usage: ncu_summary.py FILE.csv [FILE.csv ...]")
    for p in sys.argv[1:]:
        try:
            print("\n".join(summary(p)))
        except OSError as e:
            print(f"error: {p}: {e.strerror}")


if __name__ == "__main__":
    main()
