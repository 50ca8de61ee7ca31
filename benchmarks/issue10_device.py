"""The device run for issue 10, in one call: a short lr/batch sweep (as much as the deadline leaves
beside the main run), then the README's GPU example with default settings and a time budget,
scored on a held-out file with the best and the last weights (each result written as it comes).

    python benchmarks/issue10_device.py KLEB_DATA_DIR OUT_DIR --deadline-s 420

KLEB_DATA_DIR holds the catalogue's four .fna.xz files (`bytemodel data get klebsiella`).
"""
import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESERVE_S = 345   # the default 5-minute run: setup, 300 s of training, final validation, one score


def sh(args, log, timeout):
    t = time.time()
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired as e:
        p = subprocess.CompletedProcess(args, 124, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), "timed out")
    with open(log, "a") as f:
        f.write(f"$ {' '.join(map(str, args))}\n{p.stdout}{p.stderr}\n[{time.time() - t:.1f} s, rc {p.returncode}]\n")
    return p, time.time() - t


def best_of(run: Path):
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    val = [(r["val_bpb"], r["step"], r.get("val_se")) for r in rows if r.get("val_bpb") is not None]
    b = min(val)
    return {"best_val": b[0], "best_step": b[1], "val_se": b[2], "steps": rows[-1]["step"],
            "epochs": rows[-1].get("epoch"), "tokens_per_s": rows[-1].get("tokens_per_s")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--deadline-s", type=float, default=420)
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--sweep-minutes", type=float, default=0.25)
    ap.add_argument("--device", default="cuda", help="(cpu: a dry run of the plumbing)")
    a = ap.parse_args()
    t0 = time.time()
    left = lambda: a.deadline_s - (time.time() - t0)  # noqa: E731
    out, log = a.out, a.out / "log.txt"
    work = Path("/tmp/issue10")
    bm = [sys.executable, "-m", "bytemodel.cli"]
    subprocess.run([sys.executable, str(ROOT / "benchmarks/klebsiella_split.py"), str(a.data), str(work)], check=True)
    results = {}

    def dump():
        (out / "results.json").write_text(json.dumps(results, indent=1))

    # 1. a short lr sweep at equal time (small preset; base's lr comes from issue 10's own runs),
    #    leaving RESERVE_S for the default run
    grid = [("small", 1e-3, 32), ("small", 3e-3, 32), ("small", 5e-4, 32), ("small", 1e-3, 64)]
    for preset, lr, bs in grid:
        if left() - RESERVE_S < 12 + 60 * a.sweep_minutes:
            break
        name = f"sweep_{preset}_lr{lr:g}_b{bs}"
        run = work / name
        p, secs = sh(bm + ["train", "--source", str(work / "train"), "--device", a.device, "--preset", preset,
                           "--lr", str(lr), "--batch-size", str(bs), "--minutes", str(a.sweep_minutes),
                           "--patience", "0", "--out", str(run), "--no-baseline", "-q"], log, left() - RESERVE_S)
        results[name] = {"seconds": secs, "rc": p.returncode, **(best_of(run) if p.returncode == 0 else {})}
        dump()

    # 2. the README's GPU example: default settings, a time budget; scored on the held-out file
    run = work / "default"
    p, secs = sh(bm + ["train", "--source", str(work / "train"), "--device", a.device, "--minutes", str(a.minutes),
                       "--out", str(run), "--no-baseline", "-q"], log, left())
    results["default"] = {"seconds": secs, "rc": p.returncode, "tail": p.stdout[-3000:] + p.stderr[-1500:]}
    if (run / "metrics.jsonl").exists():
        results["default"].update(best_of(run))
        for f in ("loss.png", "metrics.jsonl"):
            if (run / f).exists():
                (out / f"default_{f}").write_bytes((run / f).read_bytes())
    dump()
    for last in (False, True):
        q, s2 = sh(bm + ["score", str(work / "heldout.fa"), "-c", str(run), "--device", a.device]
                   + (["--last"] if last else []), log, left())
        m = re.search(r"([0-9.]+) bits/byte", q.stdout)
        results["default"]["heldout_last" if last else "heldout_best"] = float(m.group(1)) if m else q.stderr[-300:]
        results["default"]["score_seconds_" + ("last" if last else "best")] = s2
        dump()
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "tail"} for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
