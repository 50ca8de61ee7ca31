"""AdamW over the flat parameter buffer, the learning-rate schedule and loss scaling.

The arithmetic of a step (clipping included) is the backend's `adamw_step` op, whose reference is
numpy_ops.adamw_step; AdamW here holds the state (both moments, the step count, the decay mask).
"""
from __future__ import annotations

import math


def lr_at(step: int, max_lr: float, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to min_ratio * max_lr at `total`."""
    if warmup > 0 and step < warmup:
        return max_lr * (step + 1) / warmup
    if total <= warmup:
        return max_lr
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return max_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


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
        """One update (ops.adamw_step): gradients times grad_scale (undoing the loss scale); with
        norm (ops.global_norm of the gradients) also clipped to clip and, if the norm is not
        finite, skipped, all without the host reading the norm."""
        self.t += 1
        self.ops.adamw_step(self.model.params, self.model.grads, self.m, self.v, self.mask, lr=lr,
                            beta1=self.b1, beta2=self.b2, eps=self.eps, weight_decay=self.wd,
                            step=self.t, grad_scale=grad_scale, clip=clip, norm=norm)

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

    FLOOR = 1.0   # the lowest scale: below 1 scaling would only lose fp16's small values

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
                self.scale = max(self.scale / 2, self.FLOOR)
            return False
        self.good += 1
        if self.enabled and self.good % self.interval == 0:
            self.scale = min(self.scale * 2, 2.0 ** 24)
        return True

    def state(self) -> dict:
        return {"scale": self.scale, "good": self.good}

    def load_state(self, d: dict) -> None:
        self.scale, self.good = float(d["scale"]), int(d["good"])
