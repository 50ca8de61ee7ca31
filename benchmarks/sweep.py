"""An lr / batch-size sweep at equal wall time, through the CLI as a user runs it.

    python benchmarks/sweep.py SOURCE OUT_DIR --preset small --device cuda --minutes 0.5 \\
        --grid 5e-4:32,1e-3:32,2e-3:32,4e-3:32,1e-3:64,2e-3:64

Each LR:BATCH point runs `bytemodel train --source SOURCE --preset P --lr LR --batch-size BATCH
--minutes M --patience 0` (everything else at its default: warmup, schedule, validation of the
whole held-out tail) and reads the best validation, its standard error, the steps and the
throughput from the run's metrics.jsonl. Equal time, not equal steps: a larger batch gets fewer
steps, as it would for a user with a time budget. Results: OUT_DIR/sweep.json and a Markdown
table on stdout. --deadline-s stops starting new points when the time is nearly up.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def best_of(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = [(r["val_bpb"], r["step"], r.get("val_se")) for r in rows if r.get("val_bpb") is not None]
    b = min(val)
    last = rows[-1]
    return {"best_val": b[0], "best_step": b[1], "val_se": b[2], "steps": last["step"], "last_val": val[-1][0],
            "epochs": last.get("epoch"), "tokens_per_s": last.get("tokens_per_s")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source")
    ap.add_argument("out", type=Path)
    ap.add_argument("--preset", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--minutes", type=float, default=0.5)
    ap.add_argument("--grid", required=True, help="comma-separated LR:BATCH points")
    ap.add_argument("--warmup", type=int, default=-1, help="(-1: the preset's default)")
    ap.add_argument("--deadline-s", type=float, default=1e9)
    ap.add_argument("--extra", default="", help="more train flags, space-separated")
    a = ap.parse_args()
    t0 = time.time()
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    for point in a.grid.split(","):
        lr, bs = point.split(":")
        if time.time() - t0 + 60 * a.minutes + 20 > a.deadline_s:
            print(f"deadline: {point} and later not run", file=sys.stderr)
            break
        run = a.out / f"{a.preset}_lr{lr}_b{bs}"
        cmd = [sys.executable, "-m", "bytemodel.cli", "train", "--source", a.source, "--device", a.device,
               "--preset", a.preset, "--lr", lr, "--batch-size", bs, "--minutes", str(a.minutes),
               "--patience", "0", "--out", str(run), "--no-baseline", "-q"] + a.extra.split()
        if a.warmup >= 0:
            cmd += ["--warmup", str(a.warmup)]
        t = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True)
        r = {"preset": a.preset, "lr": float(lr), "batch": int(bs), "rc": p.returncode, "wall_s": time.time() - t}
        if p.returncode == 0 and (run / "metrics.jsonl").exists():
            r.update(best_of(run))
        else:
            r["error"] = (p.stdout + p.stderr)[-600:]
        results.append(r)
        print(json.dumps(r), file=sys.stderr, flush=True)
        (a.out / "sweep.json").write_text(json.dumps(results, indent=1))
    print(f"| preset | lr | batch | best validation (± SE) | at step | steps in {a.minutes:g} min | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        if "best_val" in r:
            print(f"| {r['preset']} | {r['lr']:g} | {r['batch']} | {r['best_val']:.4f} ± {r['val_se'] or 0:.4f} | "
                  f"{r['best_step']} | {r['steps']} | {r['tokens_per_s'] or 0:,.0f} |")
        else:
            print(f"| {r['preset']} | {r['lr']:g} | {r['batch']} | failed (rc {r['rc']}) | | | |")


if __name__ == "__main__":
    main()
