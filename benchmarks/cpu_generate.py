"""CPU generation throughput with a KV cache: bytemodel vs the same model in PyTorch.

Both generate one sequence token by token (prefill a 64-byte prompt, then 1-token steps with a
KV cache, sampling at temperature 1 from the full distribution) with the same weights (bytemodel's
init_weights(0), copied into the PyTorch model), each measurement in its own process (see
_sides.py), in alternating rounds; the median is reported.

    PYTHONPATH=. /tmp/torchvenv/bin/python benchmarks/cpu_generate.py [--preset small] [--tokens 256]
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from bytemodel.config import preset  # noqa: E402
from bytemodel.decode.generate import generate  # noqa: E402
from bytemodel.model import Model  # noqa: E402
from bytemodel.ops import numpy_ops  # noqa: E402
from bytemodel.tokenizer import Tokenizer  # noqa: E402

PROMPT = bytes(range(32, 96))


def _model(cfg):
    m = Model(cfg, numpy_ops)
    m.init_weights(0)
    return m


def ours(cfg, n):
    from bytemodel.cli.memory import roomy_malloc
    roomy_malloc()      # as the `bytemodel` command sets it (cli/memory.py)
    m = _model(cfg)
    tok = Tokenizer()
    generate(m, tok, 8, PROMPT, seed=0)  # warm up
    t = time.perf_counter()
    out = generate(m, tok, n, PROMPT, seed=0)
    assert len(out) == n
    return n / (time.perf_counter() - t)


def theirs(cfg, n):
    import torch
    from torch_model import TorchModel
    m = TorchModel(cfg).eval()
    ref = _model(cfg)
    W, names = ref.weights(), ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gateup", "w_down")
    with torch.no_grad():    # the same weights as ours
        m.wte.copy_(torch.from_numpy(W["wte"]))
        for i in range(cfg.n_layers):
            for j, name in enumerate(names):
                m.layers[6 * i + j].copy_(torch.from_numpy(W[f"layers.{i}.{name}"]))
        m.norm_f.copy_(torch.from_numpy(W["norm_f"]))
        m.lm_head.copy_(torch.from_numpy(ref.head(W)[0]))
    K, D = cfg.n_kv_heads, cfg.head_dim

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
    from _sides import main as table, parser
    ap = parser()
    ap.add_argument("--tokens", type=int, default=256)
    args = ap.parse_args()

    def n_tokens(name):
        return min(args.tokens, preset(name).context - len(PROMPT) - 2)

    def measure(side, name):
        return (theirs if side == "torch" else ours)(preset(name), n_tokens(name))
    table(__file__, args, measure, "tokens", n_tokens, ["--tokens", str(args.tokens)])


if __name__ == "__main__":
    main()
