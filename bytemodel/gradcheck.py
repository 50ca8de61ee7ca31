"""Whole-model gradient check: analytic gradients against centered finite differences, float64.

For every parameter tensor, a random subset of entries is perturbed by +-eps and the loss's
change compared with the analytic gradient. The error per tensor is

    max over checked entries of |analytic - numeric| / max(|analytic| + |numeric|, floor)

Why these numbers: in float64 the centered difference has truncation error ~eps^2 (relative to
the curvature) and round-off ~1e-16 * |loss| / eps. Measured on the check model: eps = 1e-6 gives
errors up to 2e-4 and eps = 1e-5 up to 2e-5 on entries with small gradients (round-off
dominates), eps = 1e-4 about 1e-6 at worst; so EPS = 1e-4 and BOUND = 1e-4 (two orders of
margin), while a real bug (a missing term, a wrong transpose, a gain off by 1%) shows as 1e-2 or
worse. FLOOR keeps entries whose true gradient is ~0 from dividing noise by noise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import ModelConfig
from .errors import ConfigError
from .model import Model, layout
from .ops import numpy_ops

BOUND = 1e-4
EPS = 1e-4
FLOOR = 1e-8


@dataclass
class TensorCheck:
    name: str
    checked: int
    max_rel_error: float

    @property
    def ok(self) -> bool:
        return self.max_rel_error <= BOUND


def tiny_config(**overrides) -> ModelConfig:
    """A model small enough to finite-difference every tensor in seconds, odd sizes included."""
    d = dict(vocab_size=19, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=24, context=9,
             mtp=3)  # two multi-token heads (t+2, t+3), so their tensors and the trunk's path
                     # through them are checked too
    d.update(overrides)
    return ModelConfig(**d)


def check_model(cfg: ModelConfig | None = None, per_tensor: int = 12, seed: int = 0,
                B: int = 2, T: int | None = None, drop=None) -> list[TensorCheck]:
    """drop: a model.Dropout (with cfg.dropout > 0): every loss uses the same fixed masks."""
    cfg = cfg or tiny_config()
    T = T or cfg.context
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng(seed)
    m = Model(cfg, numpy_ops, dtype=np.float64)
    m.init_weights(seed)
    # larger random weights than the init so every path carries signal; gains away from 1
    m.params[:] = rng.standard_normal(m.size) * 0.3
    idx = rng.integers(0, cfg.vocab_size, size=(B, T))
    tgt = rng.integers(0, cfg.vocab_size, size=(B, T))

    def loss() -> float:   # the training objective: main loss + the MTP heads' weighted loss
        return m.objective(m.forward(idx, tgt, heads=True, drop=drop))

    m.grads[:] = 0
    m.loss_and_grad(idx, tgt, 1 / idx.size, drop=drop)   # the mean
    return check_tensors(m, loss, m.grads.copy(), rng, per_tensor)


def check_tensors(m: Model, loss, analytic: np.ndarray, rng: np.random.Generator,
                  per_tensor: int) -> list[TensorCheck]:
    """Per parameter tensor of m (float64): `per_tensor` random entries of `analytic` (the flat
    gradient of loss()) against centered finite differences of loss(), the error as above."""
    out = []
    for name, shape, off in layout(m.cfg):
        n = math.prod(shape)
        picks = rng.choice(n, size=min(per_tensor, n), replace=False)
        worst = 0.0
        for j in picks:
            i = off + int(j)
            old = m.params[i]
            m.params[i] = old + EPS
            lp = loss()
            m.params[i] = old - EPS
            lm = loss()
            m.params[i] = old
            num = (lp - lm) / (2 * EPS)
            ana = analytic[i]
            worst = max(worst, abs(ana - num) / max(abs(ana) + abs(num), FLOOR))
        out.append(TensorCheck(name, len(picks), worst))
    return out
