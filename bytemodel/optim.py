"""AdamW over the flat parameter buffer, the learning-rate schedule, clipping and loss scaling.

Everything is written with the backend's array module `xp`, so it runs unchanged on NumPy and
CuPy; a backend may offer a fused `adamw_step` / `global_norm`, which are then used instead.
"""
from __future__ import annotations

import math

import numpy as np


def lr_at(step: int, max_lr: float, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to min_ratio * max_lr at `total`."""
    if warmup > 0 and step < warmup:
        return max_lr * (step + 1) / warmup
    if total <= warmup:
        return max_lr
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return max_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def global_norm(ops, grads) -> float:
    """sqrt(sum g^2) over the whole flat gradient buffer, as a Python float (inf/nan pass through)."""
    fused = getattr(ops, "global_norm", None)
    if fused is not None:
        return float(fused(grads))
    g = grads.astype(np.float64, copy=False) if grads.dtype != np.float64 else grads
    return float(ops.xp.sqrt(ops.xp.dot(g, g)))


class AdamW:
    """Decoupled weight decay (Loshchilov & Hutter): p -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * p).

    Weight decay applies where `decay_mask` is 1 (the matrices), not to the RMSNorm gains.
    """

    def __init__(self, model, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        xp = model.xp
        self.model, self.ops, self.xp = model, model.ops, xp
        self.b1, self.b2 = betas
        self.eps, self.wd = eps, weight_decay
        self.m = xp.zeros_like(model.params)   # first moments, same layout as the parameters
        self.v = xp.zeros_like(model.params)   # second moments
        self.mask = model.decay_mask().astype(model.params.dtype)
        self.t = 0                             # number of steps taken (for bias correction)

    def step(self, lr: float, grad_scale: float = 1.0, clip: float = 0.0, norm=None) -> None:
        """One update with gradients multiplied by grad_scale first (unscaling and clipping).

        clip, norm: only with a backend's fused adamw_step, which then clips by the device-side
        norm (a 0-d array from ops.global_norm) and skips the update if it is not finite, with no
        wait for the host. Without the hook the caller clips through grad_scale.
        """
        self.t += 1
        p, g = self.model.params, self.model.grads
        fused = getattr(self.ops, "adamw_step", None)
        if fused is not None:
            fused(p, g, self.m, self.v, self.mask, lr=lr, beta1=self.b1, beta2=self.b2,
                  eps=self.eps, weight_decay=self.wd, step=self.t, grad_scale=grad_scale,
                  clip=clip, norm=norm)
            return
        if norm is not None:
            raise ValueError("device-side clipping needs a backend with adamw_step")
        xp = self.xp
        if grad_scale != 1.0:
            g = g * p.dtype.type(grad_scale)
        b1, b2 = self.b1, self.b2
        self.m *= b1
        self.m += (1 - b1) * g
        self.v *= b2
        self.v += (1 - b2) * (g * g)
        c1 = 1 - b1 ** self.t
        c2 = 1 - b2 ** self.t
        upd = (self.m / c1) / (xp.sqrt(self.v / c2) + self.eps)
        upd += self.wd * self.mask * p
        p -= p.dtype.type(lr) * upd

    def state(self) -> dict:
        return {"t": self.t}

    def load_state(self, d: dict, m, v) -> None:
        self.t = int(d["t"])
        self.m[...] = self.ops.asarray(m.astype(self.m.dtype, copy=False))
        self.v[...] = self.ops.asarray(v.astype(self.v.dtype, copy=False))


class LossScaler:
    """Dynamic loss scaling for fp16: multiply the loss by `scale`; on an inf/nan gradient skip the
    step and halve the scale; after `interval` good steps in a row, double it. Disabled (scale 1,
    never skips unless the gradient is truly non-finite) for fp32/bf16."""

    def __init__(self, enabled: bool, init: float = 2.0 ** 15, interval: int = 500):
        self.enabled = enabled
        self.scale = init if enabled else 1.0
        self.interval = interval
        self.good = 0

    def update(self, finite: bool) -> bool:
        """Record a step's outcome; return True if the step should be applied."""
        if not finite:
            self.good = 0
            if self.enabled:
                self.scale = max(self.scale / 2, 1.0)
            return False
        self.good += 1
        if self.enabled and self.good % self.interval == 0:
            self.scale = min(self.scale * 2, 2.0 ** 24)
        return True

    def state(self) -> dict:
        return {"scale": self.scale, "good": self.good}

    def load_state(self, d: dict) -> None:
        self.scale, self.good = float(d["scale"]), int(d["good"])
