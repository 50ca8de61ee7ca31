"""Audio: train on codec2's 8 kHz speech clips as mu-law bytes, generate a playable WAV.

    apt-get install codec2-examples        # /usr/share/codec2/wav/*.wav
    python examples/audio.py               # a few minutes on 2 CPU cores
    python examples/audio.py --steps 20    # smoke test

Reader: audio (mono, 8 kHz, 8-bit mu-law: one byte per sample). Output: generated.wav, 16-bit PCM.
"""
from __future__ import annotations

from _common import fetch, generate, out_dir, parse_args, report, stream_of, train, write

READER = "audio:rate=8000,encoding=mulaw"

args = parse_args(__doc__.splitlines()[0], steps=300)
out = out_dir(args, "audio")
source = fetch("codec2-speech")           # 15 speech clips, ~2.1 M samples at 8 kHz
result, seconds = train(source, READER, args, out)
samples = generate(result, 8000)          # one second
path = write(samples, out / "generated.wav", READER)
report("audio", "codec2-speech", READER, result, seconds, stream_of(source, READER), path, args)
