"""Chat replies a second: the on-device decoder against the host loop (where chat sampled before).

Random weights of a preset's shape with the chat tokenizer's vocabulary (seed 0), a conversation of
--turns user messages, replies of at most --max-bytes (a random model ends one at a special id now
and then: the figure is reply bytes over wall time, each reply's prompt and prefill included).

    python3 benchmarks/chat_speed.py --device cuda --precision fp16 --preset base --turns 12
    python3 benchmarks/chat_speed.py --device cpu --precision fp32 --preset small --turns 12 --rounds 3

Sides: the on-device decoder (a GPU), the host loop with the conversation's cache kept between
replies (chat's default on the CPU: a reply reads only its new turn), and the host loop reading the
whole conversation every reply (as chat did before the thirty-third session).
"""
from __future__ import annotations

import argparse
import time

import bytemodel.ops as ops_mod
from bytemodel.chat import Chat
from bytemodel.chat_template import chat_tokenizer
from bytemodel.config import preset
from bytemodel.model import Model
from bytemodel.ops import get_backend
from bytemodel.tokenizer import Tokenizer


def run(model, tok, turns, max_bytes, host, keep=True):
    saved = ops_mod.device_decoder
    if host:
        ops_mod.device_decoder = lambda ops: None      # chat._sample then takes the host loop
    try:
        c = Chat(model, tok, b"You are brief.", temperature=1.0, seed=1, max_bytes=max_bytes)
        c.reply(b"warm up")
        c.reset()
        if not keep:
            c.kept = None       # the host loop as before: every reply reads the whole conversation
        n, t = 0, time.perf_counter()
        for i in range(turns):
            n += len(c.reply(b"tell me about item %d" % i))
        return n, time.perf_counter() - t
    finally:
        ops_mod.device_decoder = saved


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--preset", default="base")
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--max-bytes", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    tok = chat_tokenizer(Tokenizer())
    cfg = preset(a.preset, tok.vocab_size)
    m = Model(cfg, get_backend(a.device, a.precision))
    m.init_weights(0)
    sides = [("host loop, the conversation's cache kept", True, True),
             ("host loop, the whole conversation read each reply", True, False)]
    if a.device != "cpu":
        sides.insert(0, ("on-device decoder", False, True))
    for side, host, keep in sides * a.rounds:
        n, dt = run(m, tok, a.turns, a.max_bytes, host, keep)
        print(f"{a.preset} {a.device} {a.precision} {side}: {n} reply bytes in {dt:.2f} s, {n / dt:,.0f} bytes/s", flush=True)


if __name__ == "__main__":
    main()
