"""CPU generation throughput with a KV cache: bytemodel vs the same model in PyTorch.

Both generate one sequence token by token (prefill a 64-byte prompt, then 1-token steps with a
KV cache, sampling at temperature 1 from the full distribution), each measurement in its own
process (see _sides.py), in alternating rounds; the median is reported.

    PYTHONPATH=. /tmp/torchvenv/bin/python benchmarks/cpu_generate.py [--preset small] [--tokens 256]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from bytemodel.config import preset  # noqa: E402
from bytemodel.generate import generate  # noqa: E402
from bytemodel.model import Model  # noqa: E402
from bytemodel.tokenizer import Tokenizer  # noqa: E402

PROMPT = bytes(range(32, 96))


def ours(cfg, n):
    m = Model(cfg)
    m.init_weights(0)
    tok = Tokenizer()
    generate(m, tok, 8, PROMPT, seed=0)  # warm up
    t = time.perf_counter()
    out = generate(m, tok, n, PROMPT, seed=0)
    assert len(out) == n
    return n / (time.perf_counter() - t)


def theirs(cfg, n):
    import torch
    from torch_model import TorchModel
    torch.manual_seed(0)
    m = TorchModel(cfg).eval()
    H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim

    @torch.inference_mode()
    def run(n):
        cache = [(torch.zeros(1, K, cfg.context, D), torch.zeros(1, K, cfg.context, D)) for _ in range(cfg.n_layers)]
        ids = torch.tensor([[256] + list(PROMPT)])
        logits = m(ids, cache=cache, pos=0)[0, -1]
        pos = ids.shape[1]
        g = torch.Generator().manual_seed(0)
        for _ in range(n):
            nxt = torch.multinomial(torch.softmax(logits[:257].double(), -1), 1, generator=g)
            logits = m(nxt.view(1, 1), cache=cache, pos=pos)[0, -1]
            pos += 1
    run(8)
    t = time.perf_counter()
    run(n)
    return n / (time.perf_counter() - t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--side", choices=["ours", "torch"], help="measure one side in this process")
    args = ap.parse_args()
    if args.side:  # one measurement, printed as a bare number
        cfg = preset(args.presets)
        n = min(args.tokens, cfg.context - len(PROMPT) - 2)
        if args.side == "torch":
            import torch
            torch.set_num_threads(os.cpu_count())
            print(theirs(cfg, n))
        else:
            print(ours(cfg, n))
        return
    from _sides import compare
    import torch
    print(f"torch {torch.__version__}, numpy {np.__version__}, {os.cpu_count()} cores; "
          f"median of {args.rounds} alternating rounds, each side in its own process")
    print("| preset | tokens | bytemodel tokens/s | PyTorch eager tokens/s | ratio |")
    print("|---|---|---|---|---|")
    for name in args.presets.split(","):
        cfg = preset(name)
        n = min(args.tokens, cfg.context - len(PROMPT) - 2)
        ma, mb = compare(__file__, name, args.rounds, ["--tokens", str(args.tokens)])
        print(f"| {name} | {n} | {ma:,.0f} | {mb:,.0f} | {ma / mb:.2f} |", flush=True)


if __name__ == "__main__":
    main()
