"""Byte views of 16-bit speech, compared through the CLI before any becomes a reader encoding
(issue 27, speech under FLAC -8): the catalogue's codec2 clips (`bytemodel data get codec2-speech`)
written as raw byte files, one per clip, in four views of the same samples:

    le   signed 16-bit little-endian (the audio reader's pcm16)
    msb  offset binary, high byte first (the reader's pcm16msb)
    d1   the first difference x[n] - x[n-1] (x[-1] = 0), modulo 2^16, offset binary, high byte first
    d2   the second difference x[n] - 2 x[n-1] + x[n-2], the same way

Each view is exact (a running sum modulo 2^16 gives the samples back). Held out as in
benchmarks/little_data.py: mmt1 and vk5qi; all.wav (five clips back to back, vk5qi among them) and
the one 16 kHz clip are left out.

    python benchmarks/audio_views.py OUT
    bytemodel train --source OUT/V/train --reader raw --device cpu --steps 500 --no-baseline -q --workers 1 --out OUT/run_V
    bytemodel score OUT/V/held/mmt1.bin -c OUT/run_V --raw     # and vk5qi.bin
"""
from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import numpy as np

HELD = {"mmt1.wav", "vk5qi.wav"}
LEFT_OUT = {"all.wav", "wia_16kHz.wav"}
VIEWS = ("le", "msb", "d1", "d2")


READER = {"le": "pcm16", "msb": "pcm16msb"}   # the views the audio reader has (its encode / decode)


def _reader(kind: str):
    from bytemodel.readers import get_reader
    return get_reader(f"audio:encoding={READER[kind]},rate=8000")


def view(x: np.ndarray, kind: str) -> bytes:
    """int16 samples (N,) -> the bytes of one view."""
    if kind in READER:
        return _reader(kind).encode(x)
    x = x.astype(np.int64)
    p1 = np.concatenate([[0], x[:-1]])
    r = x - p1 if kind == "d1" else x - 2 * p1 + np.concatenate([[0, 0], x[:-2]])
    return ((r + 32768) % 65536).astype(">u2").tobytes()


def samples(kind: str, data: bytes) -> np.ndarray:
    """The inverse of view: bytes -> int16 samples."""
    if kind in READER:
        return _reader(kind).decode(data)
    v = np.frombuffer(data, ">u2").astype(np.int64) - 32768
    x = np.cumsum(v) if kind == "d1" else np.cumsum(np.cumsum(v))
    return ((x + 32768) % 65536 - 32768).astype(np.int16)


def main():
    import soundfile as sf
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    a = ap.parse_args()
    src = Path(subprocess.run(["bytemodel", "data", "get", "codec2-speech"], capture_output=True, text=True,
                              check=True).stdout.strip().splitlines()[-1])
    out = Path(a.out)
    for f in sorted(src.glob("*.wav")):
        if f.name in LEFT_OUT:
            continue
        x, rate = sf.read(str(f), dtype="int16")
        x = x[:, 0] if x.ndim > 1 else x
        assert rate == 8000, (f.name, rate)
        part = "held" if f.name in HELD else "train"
        for kind in VIEWS:
            b = view(x, kind)
            assert np.array_equal(samples(kind, b), x), (f.name, kind)   # exact
            d = out / kind / part
            d.mkdir(parents=True, exist_ok=True)
            (d / (f.stem + ".bin")).write_bytes(b)
    print(f"{out}/{{{','.join(VIEWS)}}}/{{train,held}}")


if __name__ == "__main__":
    main()
