"""Multi-token prediction (MTP) heads: extra heads that predict tokens t+2 .. t+K from the trunk.

The trunk's last residual stream x (N, C) (before the final RMSNorm) feeds K-1 heads. Head k
(k = 2..K) is a residual SwiGLU block and its own final RMSNorm, then the shared LM head:

    independent:  y_k = x       + SwiGLU_k(RMSNorm_k(x))
    sequential:   y_k = y_{k-1} + SwiGLU_k(RMSNorm_k(y_{k-1})),  y_1 = x
    logits_k      = RMSNorm_f,k(y_k) @ lm_head                     (N, V)

Head k at position t is trained on the token at t+k, i.e. targets[t + k - 1] of the batch's
next-token targets; the last k-1 positions of each row have no such target and weigh 0.
The auxiliary objective is mtp_weight * mean over heads of each head's mean loss, added to the
main head's mean loss.

Every step is an op of the backend (rmsnorm, matmul, swiglu, cross-entropy), so the same code
runs on NumPy and on the CUDA backend; the whole-model gradient check covers every head tensor
and the trunk's gradient through them.

Shapes: B batch, T time, C d_model, F d_ff, V vocab, N = B*T.
"""
from __future__ import annotations

import numpy as np


def mtp_shapes(cfg) -> list[tuple[str, tuple[int, ...]]]:
    """The heads' parameter tensors, appended to the model's layout."""
    C, F = cfg.d_model, cfg.d_ff
    out = []
    for k in range(2, cfg.mtp + 1):
        p = f"mtp.{k}."
        out += [(p + "norm", (C,)),           # RMSNorm gain on the head's input
                (p + "w_gateup", (C, 2 * F)),  # SwiGLU gate and up, (in, out)
                (p + "w_down", (F, C)),        # SwiGLU down
                (p + "norm_f", (C,))]          # the head's own final RMSNorm gain
    return out


def shifted_targets(targets, k: int, xp):
    """targets (B, T) next-token ids -> (ids (N,), weights (N,)) for head k (predicts t+k).

    Position t's target is targets[:, t + k - 1]; the last k-1 positions get id 0 and weight 0.
    """
    B, T = targets.shape
    ids = xp.zeros((B, T), dtype=targets.dtype)
    w = xp.zeros((B, T), dtype=np.float32)
    s = k - 1
    if s < T:
        ids[:, :T - s] = targets[:, s:]
        w[:, :T - s] = 1.0
    return ids.reshape(-1), w.reshape(-1)


def heads_forward(o, cfg, W, wh, x):
    """x (N, C) trunk residual -> per-head (hidden y_k (N, C), final-norm out (N, C), caches)."""
    outs = []
    prev = x
    for k in range(2, cfg.mtp + 1):
        p = f"mtp.{k}."
        inp = prev if cfg.mtp_design == "sequential" else x
        h, n1 = o.rmsnorm_forward(inp, W[p + "norm"], cfg.norm_eps)       # (N, C)
        u = o.matmul_forward(h, W[p + "w_gateup"])                          # (N, 2F)
        s, sw = o.swiglu_forward(u)                                         # (N, F)
        y = o.add(inp, o.matmul_forward(s, W[p + "w_down"]))                # (N, C) residual
        hf, nf = o.rmsnorm_forward(y, W[p + "norm_f"], cfg.norm_eps)       # (N, C)
        outs.append((h, n1, sw, s, hf, nf))
        prev = y
    return outs


def mtp_forward(o, cfg, W, wh, x, targets):
    """Training forward of every head. x (N, C), targets (B, T).

    Returns (mean loss per head (list of 0-d arrays on the backend, nats), cache for mtp_backward).
    """
    xp = o.xp
    heads = heads_forward(o, cfg, W, wh, x)
    per_head, caches = [], []
    for k, (h, n1, sw, s, hf, nf) in zip(range(2, cfg.mtp + 1), heads):
        ids, w = shifted_targets(targets, k, xp)
        logits = o.matmul_forward(hf, wh)                                   # (N, V)
        losses, ce = o.cross_entropy_forward(logits, ids)                   # (N,)
        B, T = targets.shape
        n_valid = B * max(T - (k - 1), 0)                                   # host-side count
        lw = w.astype(losses.dtype)
        per_head.append((losses * lw).sum() / max(n_valid, 1))             # device scalar
        caches.append((k, h, n1, sw, s, hf, nf, ce, lw, n_valid))
    return per_head, caches


def mtp_backward(o, cfg, W, G, wh, dwh, caches, weight: float):
    """Accumulates the heads' gradients; returns d(objective)/dx (N, C) for the trunk.

    weight: the objective's factor on the mean over heads of each head's mean loss
    (mtp_weight times the caller's loss weight).
    """
    n_heads = len(caches)
    dx = None       # gradient reaching x directly (independent) or through y_1 = x (sequential)
    dnext = None    # sequential: gradient reaching y_k from head k+1
    for k, h, n1, sw, s, hf, nf, ce, lw, n_valid in reversed(caches):
        p = f"mtp.{k}."
        scale = weight / n_heads / n_valid if n_valid else 0.0
        dlosses = lw * lw.dtype.type(scale)                                 # (N,)
        dlogits = o.cross_entropy_backward(dlosses, ce)                     # (N, V)
        dhf = o.matmul_backward(dlogits, hf, wh, dwh)                       # (N, C)
        dy = o.rmsnorm_backward(dhf, nf, G[p + "norm_f"], residual=dnext)  # (N, C)
        ds = o.matmul_backward(dy, s, W[p + "w_down"], G[p + "w_down"])    # (N, F)
        du = o.swiglu_backward(ds, sw)                                      # (N, 2F)
        dh = o.matmul_backward(du, h, W[p + "w_gateup"], G[p + "w_gateup"])
        dinp = o.rmsnorm_backward(dh, n1, G[p + "norm"], residual=dy)      # + the residual
        if cfg.mtp_design == "sequential":
            dnext = dinp            # flows into y_{k-1}; y_1 is x
        else:
            dx = dinp if dx is None else o.add(dx, dinp)
    return dnext if cfg.mtp_design == "sequential" else dx


def draft_logits(o, cfg, W, wh, x_last):
    """x_last (R, C) trunk residual rows -> (K-1, R, V) logits of heads 2..K (inference)."""
    heads = heads_forward(o, cfg, W, wh, x_last)
    return [o.matmul_forward(hf, wh) for (_, _, _, _, hf, _) in heads]
