"""Where the time of `compress --adapt` goes, part by part, on the compressor's own path.

    PYTHONPATH=. python benchmarks/adapt_profile.py FILE --device cuda --preset small \\
        --precision fp16 --streams 488,1024,4096 --json out.json

For each stream count it runs driver.compress(lm, FILE's bytes, adapt=settings(lm), streams=S),
as `bytemodel compress FILE --adapt --preset P` does, with a timer around each part: the model's
lockstep push (Lockstep.push, or LockstepGraph.push where the step is a CUDA graph; --graph), the network's log-softmax, the mixer's
prepare / predict / update, the quantiser with its copy to the host, the range coder (decide),
and the optimizer step of each segment (Adapter.update). On a GPU every timed call is
synchronised before and after, so a part's time is its own (the whole is then a little slower
than the untimed run, whose wall time is printed beside it). --bytes: the file's first N bytes.
--lines N: also the N costliest source lines of the mixer (compress/mix*.py, ops/*scatter*.py),
each timed from its start to the next line of its function (callees included), synchronised.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

import numpy as np

from bytemodel.compress import adapt as adapt_mod
from bytemodel.compress import driver, mix3d, mix3f
from bytemodel.compress.adapt import Fresh, settings
from bytemodel.decode import lockstep

# the model's coding timed and sized even where it would expand the file (random weights do;
# `compress` would pack such a file's bytes instead: compress/driver.py)
os.environ.setdefault("BYTEMODEL_PACK", "0")


MIX = [None]     # --mix


def _timed(table, name, fn, sync):
    def wrapper(*args, **kw):
        sync()
        t = time.perf_counter()
        out = fn(*args, **kw)
        sync()
        table[name] += time.perf_counter() - t
        return out
    return wrapper


def _line_tracer(table, sync, wanted=("mix", "scatter")):
    """A sys.settrace function timing each line of the files whose names hold one of `wanted`:
    from the line's start to its function's next line (or return), the device synchronised at each."""
    last = {}

    def local(frame, event, arg):
        if event in ("line", "return"):
            sync()
            now = time.perf_counter()
            k = id(frame)
            if k in last:
                where, t = last[k]
                table[where] += now - t
            if event == "line":
                last[k] = (f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}", now)
            else:
                last.pop(k, None)
        return local

    def tracer(frame, event, arg):
        name = frame.f_code.co_filename
        return local if event == "call" and any(w in name.rsplit("/", 1)[-1] for w in wanted) else None
    return tracer


def lines(lm, raw: bytes, S: int, top: int) -> dict:
    """The costliest `top` lines of the mixer in one compression (graph on)."""
    xp = lm.model.xp
    sync = (lambda: xp.cuda.Device().synchronize()) if xp is not np else (lambda: None)
    table = defaultdict(float)
    sys.settrace(_line_tracer(table, sync))
    try:
        driver.compress(lm, raw, adapt=settings(lm), streams=S)
    finally:
        sys.settrace(None)
    best = sorted(table.items(), key=lambda kv: -kv[1])[:top]
    return {"streams": S, "lines_s": {k: round(v, 4) for k, v in best}, "all_lines_s": round(sum(table.values()), 3)}


def profile(lm, raw: bytes, S: int, graph: bool = True) -> dict:
    xp = lm.model.xp
    sync = (lambda: xp.cuda.Device().synchronize()) if xp is not np else (lambda: None)
    a = settings(lm, mix=MIX[0])
    driver.GPU_GRAPH = graph
    t0 = time.perf_counter()
    driver.compress(lm, raw, adapt=a, streams=S)
    sync()
    wall = time.perf_counter() - t0
    table = defaultdict(float)
    saved = []

    def patch(owner, name, label):
        fn = getattr(owner, name)
        saved.append((owner, name, fn))
        setattr(owner, name, _timed(table, label, fn, sync))

    patch(lockstep.Lockstep, "push", "network push")
    patch(adapt_mod.Adapter, "update", "optimizer step (a segment's)")
    patch(mix3d.ContextMix3D, "prepare", "mixer prepare")
    patch(mix3d.ContextMix3D, "predict", "mixer predict")
    patch(mix3d.ContextMix3D, "update", "mixer update")
    patch(mix3f.ContextMix3F, "prepare", "mixer prepare")          # (ctx3f's own, not ctx3d's: no double count)
    patch(mix3f.ContextMix3F, "predict", "mixer predict")
    patch(mix3f.ContextMix3F, "update", "mixer update")
    patch(mix3f.ContextMix3F, "frequencies", "quantise + copy")
    patch(driver, "_log_softmax64", "network log-softmax")
    patch(driver, "quantise", "quantise + copy")
    from bytemodel.ops import device_decoder
    dec = device_decoder(lm.model.ops)
    if dec is not None:
        patch(dec.LockstepGraph, "push", "network push")
    real = driver._drive

    def drive(lm_, lengths, window, lane, decide, *args, **kw):     # the range coder: decide's time
        return real(lm_, lengths, window, lane, _timed(table, "range coder", decide, sync), *args, **kw)
    driver._drive = drive
    try:
        t0 = time.perf_counter()
        driver.compress(lm, raw, adapt=a, streams=S)
        sync()
        timed = time.perf_counter() - t0
    finally:
        driver._drive = real
        for owner, name, fn in saved:
            setattr(owner, name, fn)
    steps = -(-len(raw) // S)
    parts = {k: round(v, 3) for k, v in sorted(table.items(), key=lambda kv: -kv[1])}
    driver.GPU_GRAPH = True
    return {"streams": S, "graph": graph, "bytes": len(raw), "steps": steps, "wall_s": round(wall, 2),
            "KB_per_s": round(len(raw) / wall / 1e3, 1), "timed_s": round(timed, 2), "parts_s": parts,
            "ms_per_step": {k: round(1e3 * v / steps, 3) for k, v in parts.items()},
            "other_s": round(timed - sum(table.values()), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--precision", default=None)
    ap.add_argument("--streams", default="1024")
    ap.add_argument("--bytes", type=int, default=0)
    ap.add_argument("--graph", default="on", help="on (the default path: the step as a CUDA graph where the "
                    "backend takes it), off (Lockstep launched from Python), or both")
    ap.add_argument("--lines", type=int, default=0, help="also the N costliest lines of the mixer (one more run)")
    ap.add_argument("--mix", default=None, help="the mixer (default: settings' default, ctx3f on a GPU)")
    ap.add_argument("--json", default="")
    o = ap.parse_args()
    MIX[0] = o.mix
    raw = open(o.file, "rb").read()
    raw = raw[:o.bytes] if o.bytes else raw
    lm = Fresh(o.preset, o.device, precision=o.precision)
    rows = []
    graphs = {"on": [True], "off": [False], "both": [True, False]}[o.graph]
    for S, g in [(int(s), g) for s in o.streams.split(",") for g in graphs]:
        r = profile(lm, raw, S, g)
        r.update(mix=o.mix or "default", preset=o.preset, precision=getattr(lm.model.ops, "precision", "fp32"), device=o.device)
        rows.append(r)
        print(json.dumps(r), flush=True)
    for S in [int(s) for s in o.streams.split(",")] if o.lines else ():
        r = lines(lm, raw, S, o.lines)
        rows.append(r)
        print(json.dumps(r), flush=True)
    if o.json:
        with open(o.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
