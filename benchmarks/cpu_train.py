"""CPU training throughput: bytemodel (NumPy, hand-written backward) vs the same model in PyTorch.

Both run forward + backward + AdamW on identical shapes, each measurement in its own process
(see _sides.py), in alternating rounds; the median round is reported.

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch==2.13.0 numpy safetensors typer rich
    PYTHONPATH=. /tmp/torchvenv/bin/python benchmarks/cpu_train.py [--presets tiny,small] [--rounds 3]

Threads: both sides use all the machine's cores (bytemodel: one batch slice per core, as
`bytemodel train` does; PyTorch: torch.set_num_threads(cores), its intra-op threads).
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from bytemodel.config import preset  # noqa: E402
from bytemodel.model import Model  # noqa: E402
from bytemodel.ops import numpy_ops  # noqa: E402
from bytemodel.training.optim import AdamW  # noqa: E402
from bytemodel.training.runner import CoreParallel  # noqa: E402

SHAPES = {"tiny": (16, 256), "small": (8, 512)}  # (batch, context) per preset
WARMUP = 3  # untimed steps first: allocator, oneDNN primitive creation, caches


def ours(cfg, B, T, steps, rng):
    from bytemodel.cli.memory import roomy_malloc
    roomy_malloc()      # as the `bytemodel` command sets it (cli/memory.py)
    m = Model(cfg, numpy_ops)
    m.init_weights(0)
    opt = AdamW(m)
    runner = CoreParallel(m)  # as `bytemodel train` runs it: batch slices over the cores
    x = rng.integers(0, 256, (B, T))
    y = rng.integers(0, 256, (B, T))

    def step():
        m.grads[...] = 0
        runner.loss_and_grad(x, y, 1 / x.size)
        opt.step(1e-3, clip=1.0, norm=m.ops.global_norm(m.grads))
    for _ in range(WARMUP):
        step()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    runner.close()
    return B * T * steps / (time.perf_counter() - t)


def theirs(cfg, B, T, steps, rng):
    import torch
    from torch_model import TorchModel
    torch.manual_seed(0)
    m = TorchModel(cfg)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    x = torch.from_numpy(rng.integers(0, 256, (B, T)))
    y = torch.from_numpy(rng.integers(0, 256, (B, T)))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = m(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
    for _ in range(WARMUP):
        step()
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return B * T * steps / (time.perf_counter() - t)


def main():
    from _sides import main as table, parser
    ap = parser()
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()

    def measure(side, name):
        (B, T), rng = SHAPES[name], np.random.default_rng(0)
        return (theirs if side == "torch" else ours)(preset(name), B, T, args.steps, rng)
    table(__file__, args, measure, "batch x context", lambda name: "%d x %d" % SHAPES[name],
          ["--steps", str(args.steps)])


if __name__ == "__main__":
    main()
