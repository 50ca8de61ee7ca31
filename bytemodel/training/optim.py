"""AdamW over the flat parameter buffer, the learning-rate schedule and loss scaling.

The arithmetic of a step (clipping included) is the backend's `adamw_step` op, whose reference is
numpy_ops.adamw_step; AdamW here holds the state (both moments, the step count, the decay mask).
"""
from __future__ import annotations

import math


def lr_at(step: int, max_lr: float, warmup: int, total: int, min_ratio: float = 0.1,
          lr_from: list | tuple | None = None) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to min_ratio * max_lr at `total`.

    lr_from (s0, lr0): the schedule was extended (a resume to another step count, see
    extend_schedule) at step s0, where the rate was lr0; from s0 on the rate decays by cosine
    from lr0 to the same floor at `total`, so it goes on from where it was, without a jump."""
    floor = min_ratio * max_lr
    if lr_from:
        s0, lr0 = int(lr_from[0]), float(lr_from[1])
        if step >= s0:
            t = min(1.0, (step - s0) / max(1, total - s0))
            return floor + (lr0 - floor) * 0.5 * (1 + math.cos(math.pi * t))
    if warmup > 0 and step < warmup:
        return max_lr * (step + 1) / warmup
    if total <= warmup:
        return max_lr
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return max_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def extend_schedule(tc, at: int, old_total: int, new_total: int, lr_from: list | None = None) -> tuple[list, str]:
    """A resume at step `at` changes the run's total from old_total to new_total (tc: the run's
    settings, read only; lr_from: the schedule's extension so far, [] for none): keep the rate
    continuous. Past the warmup, the schedule from `at` on becomes a cosine from the rate step
    `at` had under the old schedule down to the floor at the new total; inside the warmup the
    ramp goes on and the cosine simply spans the new total (an earlier extension is dropped: it
    starts after the warmup, so it never applies there).
    -> (the new lr_from, [] for none; one line saying what the schedule became, "" if nothing changed)."""
    lr_from = list(lr_from or [])
    if new_total == old_total:
        return lr_from, ""
    floor = tc.min_lr_ratio * tc.lr
    if at < tc.warmup:
        return [], (f"schedule: {old_total} -> {new_total} steps; the warmup goes on to lr {tc.lr:.3g} at step "
                    f"{tc.warmup}, then cosine decay to {floor:.3g} at step {new_total}")
    lr0 = lr_at(at, tc.lr, tc.warmup, old_total, tc.min_lr_ratio, lr_from)
    return [at, lr0], (f"schedule: {old_total} -> {new_total} steps; the rate goes on from {lr0:.3g} at step {at} "
                       f"by cosine decay to {floor:.3g} at step {new_total} (no new warmup)")


def fit_warmup(tc) -> str:
    """A warmup as long as the run or longer would ramp the whole run and never decay: scale it
    to a tenth of the run. `tc` is the draft of a fresh run's settings (before they are frozen).
    Returns one line saying so ("" when the warmup fits)."""
    if tc.warmup < tc.steps:
        return ""
    new = max(1, tc.steps // 10)
    line = (f"note: warmup {tc.warmup} is not shorter than the run's {tc.steps} steps; "
            f"scaled to {new} (a tenth of the run)")
    tc.warmup = new
    return line


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
