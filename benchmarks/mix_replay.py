"""Compare the `--adapt` mixers (compress/mix.py ctx1, compress/mix2.py ctx2) without re-running the network.

The network's predictions under --adapt do not depend on the mixer (it trains on the coded
tokens, which are the file's), so one compression can record them (float32, (steps, S, A): 4 bytes
x tokens x alphabet, 330 MB for 318 KB of bytes) and every mixer replays them in seconds. The
replay's figure is the mix's ideal code length in bytes (sum of -log2 p of the coded tokens);
the range coder's payload was within 0.01% of it in every recorded file.

    PYTHONPATH=. python benchmarks/mix_replay.py record /tmp/rec/jargon100k.npz jargon_100k.txt fresh-tiny adapt
    PYTHONPATH=. python benchmarks/mix_replay.py replay /tmp/rec/jargon100k.npz ctx1 ctx2 ctx2-uniform
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import bytemodel
from bytemodel.compress import driver, mix2
from bytemodel.compress.adapt import Fresh, settings
from bytemodel.readers import detect, get_reader

# the model's coding timed and sized even where it would expand the file (random weights do;
# `compress` would pack such a file's bytes instead: compress/driver.py)
os.environ.setdefault("BYTEMODEL_PACK", "0")


def record(out: str, path: str, mspec: str, mode: str) -> None:
    lm = Fresh(mspec[len("fresh-"):]) if mspec.startswith("fresh-") else bytemodel.load(mspec)
    raw = open(path, "rb").read()
    spec = getattr(lm, "reader", "")
    a = settings(lm, lr=float(mode.split("@")[1]) if "@" in mode else None)
    rec: dict = {}
    real = driver.make_mixer

    class Recorder:                                  # the real mixer, its inputs written down
        def __init__(self, lengths, A):
            rec["net"] = np.zeros((int(lengths[0]), len(lengths), A), dtype=np.float32)
            rec["sym"] = np.zeros((int(lengths[0]), len(lengths)), dtype=np.int32)
            rec["lengths"] = np.asarray(lengths)
            self.m = real(a.mix, lengths, A, fresh=a.start != "checkpoint")

        def predict(self, t, active, net):
            rec["net"][t, :active] = net
            return self.m.predict(t, active, net)

        def update(self, t, active, sym):
            rec["sym"][t, :active] = sym
            self.m.update(t, active, sym)

    driver.make_mixer = lambda name, lengths, A, fresh: Recorder(lengths, A)
    st: dict = {}
    try:
        blob = driver.compress(lm, raw, adapt=a, reader=get_reader(spec) if spec else detect(path), stats=st)
    finally:
        driver.make_mixer = real
    np.savez(out, **rec, fresh=a.start != "checkpoint", payload=st["payload_bits"] / 8, bmz=len(blob))
    print(f"{out}: {a.mix} payload {st['payload_bits'] / 8:,.0f} bytes, .bmz {len(blob):,}")


def replay(path: str, name: str) -> tuple[float, float]:
    """The mix's ideal size in bytes and the CPU seconds it took; name ctx1|ctx2, '-uniform': a uniform network."""
    d = np.load(path)
    net, sym, L = d["net"], d["sym"], d["lengths"]
    A = net.shape[2]
    mixer_name, _, uniform = name.partition("-")
    m = mix2.mixer(mixer_name, L, A, fresh=bool(d["fresh"]))
    bits, c0 = 0.0, time.process_time()
    for t in range(int(L[0])):
        a = int((L > t).sum())
        x = np.full((a, A), -np.log(A)) if uniform else net[t, :a].astype(np.float64)
        z = m.predict(t, a, x)
        z = z - z.max(axis=1, keepdims=True)
        y = sym[t, :a].astype(np.int64)
        bits -= (z[np.arange(a), y] - np.log(np.exp(z).sum(axis=1))).sum() / np.log(2)
        m.update(t, a, y)
    return bits / 8, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("out")
    r.add_argument("file")
    r.add_argument("model", help="a run directory or fresh-PRESET")
    r.add_argument("mode", help="adapt or adapt@LR")
    p = sub.add_parser("replay")
    p.add_argument("recording")
    p.add_argument("mixers", nargs="+", help="ctx1, ctx2, ctx1-uniform, ctx2-uniform")
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.out, args.file, args.model, args.mode)
        return
    for name in args.mixers:
        size, cpu = replay(args.recording, name)
        print(f"{args.recording} {name}: {size:,.0f} bytes ({cpu:.1f} CPU-s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
