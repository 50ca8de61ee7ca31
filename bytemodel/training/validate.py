"""Validation of a plain corpus: bits per byte on non-overlapping windows of the held-out tail,
with the standard error of that figure (the windows taken as the sample)."""
from __future__ import annotations

import math

import numpy as np

from ..corpus import eval_windows
from ..tokenizer import Tokenizer

LN2 = math.log(2)


def evaluate(runner, tokens: np.ndarray, tokenizer: Tokenizer, context: int, max_tokens: int,
             batch: int = 16, with_se: bool = False):
    """Validation (bits per byte, nats per token) on non-overlapping windows of `tokens`
    (max_tokens 0: all of them). with_se: also the standard error of the bits per byte, taking the
    windows as the sample (a ratio estimate: sum of bits / sum of bytes over windows)."""
    ops = runner.model.ops
    win_nll, win_tok, win_bytes = [], [], []
    full_x, full_y = [], []

    def run(xs, ys):
        x, y = np.concatenate(xs), np.concatenate(ys)
        losses = ops.to_numpy(runner.forward(ops.asarray(x), ops.asarray(y))).astype(np.float64)
        losses = losses.reshape(y.shape)
        win_nll.extend(losses.sum(axis=1))
        win_tok.extend([y.shape[1]] * y.shape[0])
        win_bytes.extend(tokenizer.token_lengths[y].sum(axis=1))

    for x, y in eval_windows(tokens, context, max_tokens or len(tokens) + context):   # 0: every window
        if x.shape[1] == context:
            full_x.append(x)
            full_y.append(y)
            if len(full_x) == batch:
                run(full_x, full_y)
                full_x, full_y = [], []
        else:
            run([x], [y])
    if full_x:
        run(full_x, full_y)
    nll, b = np.array(win_nll), np.array(win_bytes, dtype=np.float64)
    bpb = nll.sum() / LN2 / max(b.sum(), 1)
    out = (float(bpb), float(nll.sum() / max(sum(win_tok), 1)))
    if not with_se:
        return out
    n = len(nll)
    se = float("nan")
    if n > 1 and b.sum() > 0:   # delta-method variance of a ratio of means
        resid = nll / LN2 - bpb * b
        se = float(np.sqrt((resid ** 2).sum() / (n * (n - 1))) / b.mean())
    return out + (se,)
