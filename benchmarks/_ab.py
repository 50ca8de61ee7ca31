"""Two settings of bytemodel's own batch-1 generation in one process, alternating, median of the
rounds (one runtime, so no process per side as in _sides.py): what benchmarks/cpu_step.py and
benchmarks/cpu_pair.py share."""
from __future__ import annotations

import statistics
import time

from bytemodel.config import preset
from bytemodel.decode import generate as gen
from bytemodel.model import Model
from bytemodel.ops import numpy_ops
from bytemodel.tokenizer import Tokenizer

PROMPT = bytes(range(32, 96))   # as benchmarks/cpu_generate.py


def alternate(name: str, tokens: int, rounds: int, switch, warmed=None) -> tuple[int, float, float, bool]:
    """The preset's model (random weights, seed 0) generating after PROMPT, switch(True) and
    switch(False) in turn each round -> (tokens, median tokens/s on, off, the same bytes).
    warmed(): called once after the warm-up generation."""
    cfg = preset(name)
    m = Model(cfg, numpy_ops)
    m.init_weights(0)
    tok, n = Tokenizer(), min(tokens, cfg.context - len(PROMPT) - 2)
    gen.generate(m, tok, 8, PROMPT, seed=0)   # warm
    if warmed is not None:
        warmed()
    rates, outs = {True: [], False: []}, {}
    for _ in range(rounds):
        for on in (True, False):
            switch(on)
            t = time.perf_counter()
            outs[on] = gen.generate(m, tok, n, PROMPT, seed=0)
            rates[on].append(n / (time.perf_counter() - t))
    return n, statistics.median(rates[True]), statistics.median(rates[False]), outs[True] == outs[False]
