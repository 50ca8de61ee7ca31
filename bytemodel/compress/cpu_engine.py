"""The compressor's lockstep step on the CPU: B streams, one token each, specialised for (B, 1).

    L = CpuLockstep(model, B, window, keep)   # as lockstep.Lockstep, with the re-read size `keep`
    logits = L.push(ids)                      # ids (B,) -> logits (B, V), valid until the next push

The same arithmetic as Model.forward_cached on a (B, 1) batch, arranged for a CPU whose cost per
token is a few NumPy calls' overhead, the matrix products and the reads of the cache:

- The weights are rearranged once (`Folded`, shared by every lane): each RMSNorm gain is folded
  into the product that follows it (so a norm is x * rstd, one pass), the attention scale
  1/sqrt(D) into the query columns, and the q/k columns kept apart from the v columns.
- RoPE is folded into the q/k projection: every stream of a lane is at the same position p, so
  q and k come out rotated from h @ (Wqk R_p), where R_p is the (D, D) block rotation of position
  p (one small product per layer and step instead of six element-wise passes).
- Attention of the single query is a batched matrix-vector product over each stream's cache
  (B, K, S, D), keys and values contiguous per head, and the softmax runs over (B, K, S, G).
- Every activation has a buffer made once per lane; NumPy writes into it (out=).

Window policy (`keep`): the cache holds at most `window` tokens; when a push finds it full, the
newest `keep` tokens of every stream (the pushed one last) are re-read from position 0 by the
reference forward pass (Model.forward_cached, (B, keep) tokens at once), as generation does with
keep = window/2. A smaller keep re-reads less often and fewer tokens (the cost is a shorter
shortest context). keep = window/2 predicts from the same contexts as lockstep.Lockstep.

Determinism: what a push returns depends only on the pushed tokens, the weights, (B, window,
keep) and the machine's NumPy/BLAS, never on other lanes, threads or timing. It is NOT
bit-identical to lockstep.Lockstep (the products are grouped differently): a compressed file
records which of the two computed its probabilities.

Memory (`steps`): a lane told it takes at most `steps` pushes, fewer than the window, makes its
cache and buffers `steps` slots long (a stream of 4 tokens holds 4 tokens' keys, not a window's).
The slots change no bit: neither policy reaches the window's end within `steps` pushes (no slide
wraps, no re-read), every read is of slots 0..S-1 with the same strides whatever the length, and
the projection writes each row in the same place of its row (tests/test_memory_bounds.py). A
push past `steps` is refused.

Shapes: B streams, W window, C d_model, H heads, K kv heads, G = H // K, D head dim, F d_ff,
V vocabulary, S keys in the cache.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError
from ..ops.host import rope_tables
from ..decode.lockstep import check_window


def check_reread(reread: int, window: int) -> None:
    if not 1 <= reread < window:
        raise ConfigError(f"the re-read must keep 1..{window - 1} tokens (window {window}), got {reread}")


class _Layer:
    __slots__ = ("wqk", "wv", "wo", "wg", "wu", "wdown")


class Folded:
    """A model's weights arranged for the (B, 1) step (float32, contiguous), made once and shared
    read-only by every lane. The folds are computed in float64, then rounded once:
    wqk = diag(attn_norm) [Wq / sqrt(D) | Wk], wv = diag(attn_norm) Wv,
    wg = diag(mlp_norm) W_gate / 2, wu = diag(mlp_norm) W_up, head = diag(norm_f) W_head."""

    def __init__(self, model, weights=None):
        cfg = model.cfg
        W = model.weights() if weights is None else weights
        H, K, D, F = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
        f32 = np.float32

        def c32(a):
            return np.ascontiguousarray(a, dtype=f32)

        self.cfg = cfg
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"layers.{i}."
            g1 = np.asarray(W[p + "attn_norm"], dtype=np.float64)[:, None]
            g2 = np.asarray(W[p + "mlp_norm"], dtype=np.float64)[:, None]
            wqkv = np.asarray(W[p + "wqkv"], dtype=np.float64) * g1                  # (C, (H+2K)D)
            wqk = wqkv[:, :(H + K) * D].copy()
            wqk[:, :H * D] /= math.sqrt(D)                                           # q pre-scaled
            wgu = np.asarray(W[p + "w_gateup"], dtype=np.float64) * g2               # (C, 2F)
            L = _Layer()
            L.wqk, L.wv = c32(wqk), c32(wqkv[:, (H + K) * D:])                       # (C, (H+K)D), (C, KD)
            L.wo = c32(W[p + "wo"])                                                  # (HD, C)
            L.wg, L.wu = c32(wgu[:, :F] * 0.5), c32(wgu[:, F:])                      # (C, F) each
            L.wdown = c32(W[p + "w_down"])                                           # (F, C)
            self.layers.append(L)
        gf = np.asarray(W["norm_f"], dtype=np.float64)[:, None]
        wh = W["wte"].T if cfg.tie_embeddings else W["lm_head"]
        self.head = c32(np.asarray(wh, dtype=np.float64) * gf)                      # (C, V)
        self.wte = c32(W["wte"])                                                     # (V, C)

    def rotation(self, pos: int) -> np.ndarray:
        """R (D, D) float32 with x @ R = RoPE of the row x at position pos (rotate-half, as
        numpy_ops._rotate): [x1 c - x2 s, x2 c + x1 s], the angles of ops/host.py (float64)."""
        D = self.cfg.head_dim
        h = D // 2
        c, s = (t[0] for t in rope_tables([pos], D, self.cfg.rope_theta, np.float64))
        R = np.zeros((D, D), dtype=np.float64)
        i = np.arange(h)
        R[i, i] = c
        R[i + h, i + h] = c
        R[i + h, i] = -s
        R[i, i + h] = s
        return R.astype(np.float32)


# a row whose softmax terms, shifted by the lane's largest score, sum below this is recomputed
# with its own maximum (never in practice: it takes a row 40 nats below every other)
_TINY = np.float32(2.0 ** -60)

# The ModelConfig fields this copy of the block follows, and those that cannot change its logits
# (as model.FOLLOWS; checked by tests/test_engines.py)
FOLLOWS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "context", "rope_theta",
           "norm_eps", "tie_embeddings")
IGNORES = {"init_std": "training only", "mtp": "the next-token logits only: the multi-token heads are not run",
           "mtp_design": "the multi-token heads are not run", "mtp_weight": "training only",
           "dropout": "training steps only (Model.forward with a Dropout)",
           "dropout_attn": "training steps only (Model.forward with a Dropout)"}


class CpuLockstep:
    """B streams in lockstep over one (B, W, K, D) key and value cache per layer, on the CPU.

    reread: 0 slides the window (the cache is a ring of the last `window` tokens; positions keep
    counting, and RoPE depends only on distances), k > 0 re-reads the newest k tokens from
    position 0 when the cache is full (k = window/2 is generation's policy)."""

    def __init__(self, model, batch: int, window: int | None = None, reread: int = 0,
                 folded: Folded | None = None, weights=None, steps: int | None = None):
        cfg = model.cfg
        W = cfg.context if window is None else int(window)
        check_window(W, cfg.context)
        reread = int(reread)
        if reread:
            check_reread(reread, W)
        if batch < 1:
            raise ConfigError(f"need at least one stream, got {batch}")
        if model.xp is not np:
            raise ConfigError("CpuLockstep computes with NumPy: load the model on the CPU")
        self.model, self.B, self.W, self.reread = model, int(batch), W, reread
        self.weights = model.weights() if weights is None else weights
        self.f = Folded(model, self.weights) if folded is None else folded
        B, C, H, K, D, F = self.B, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
        G = H // K
        self.H, self.K, self.D, self.G = H, K, D, G
        f32 = np.float32
        # the cache's slots: the window, or `steps` where the lane takes fewer pushes (see Memory)
        self.slots = S = W if steps is None else min(W, max(1, int(steps)))
        self.cache = [(np.zeros((B, S, K, D), f32), np.zeros((B, S, K, D), f32)) for _ in range(cfg.n_layers)]
        self.recent = np.zeros((B, S), dtype=np.int64) if reread else None   # re-read: the tokens by position
        self.pos = 0          # the next token's position (its slot is pos % W when sliding)
        self.steps = 0        # tokens pushed
        # buffers, written in place every step
        self.x = np.empty((B, C), f32)
        self.h = np.empty((B, C), f32)
        self.tmp = np.empty((B, C), f32)
        self.rstd = np.empty(B, f32)
        self.q = np.empty((B, H * D), f32)
        self._scores = np.empty(B * H * S, f32)
        self.ones = np.ones(S, f32)
        self.norm = np.empty(B * H, f32)
        self.att = np.empty((B, K, G, D), f32)
        self.g = np.empty((B, F), f32)
        self.up = np.empty((B, F), f32)
        self.logits = np.empty((B, cfg.vocab_size), f32)
        self.wqk = np.empty((C * (H + K), D), f32)      # this step's Wqk R_p
        self._eps = f32(cfg.norm_eps)
        self._inv_c = f32(1.0 / C)
        self.fallbacks = 0    # attention rows recomputed with their own maximum (see _TINY)

    def refold(self, folded: Folded, weights) -> None:
        """Compute the next tokens with new weights (adaptation); the cached keys and values stay
        as the old weights computed them."""
        self.f, self.weights = folded, weights

    def push(self, ids):
        """ids (B,) ints -> logits (B, V) float32 (this object's buffer: read it before the next push)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(self.B)
        if self.pos >= self.slots < self.W:
            raise RuntimeError(f"a lane made for {self.slots} steps was pushed more")
        self.steps += 1
        if not self.reread:
            self._step(ids, self.pos, min(self.pos + 1, self.W), self.pos % self.W)
            self.pos += 1
            return self.logits
        if self.pos == self.W:                       # full: re-read the newest `reread` tokens from 0
            k, W = self.reread, self.W
            self.recent[:, :k - 1] = self.recent[:, W - k + 1:]
            self.recent[:, k - 1] = ids
            x = np.ascontiguousarray(self.recent[:, :k])
            views = [(kc.transpose(0, 2, 1, 3), vc.transpose(0, 2, 1, 3)) for kc, vc in self.cache]
            logits = self.model.forward_cached(x, views, 0, self.weights)      # (B, k, V), the reference pass
            self.logits[...] = logits[:, -1]
            self.pos = k
            return self.logits
        self.recent[:, self.pos] = ids
        self._step(ids, self.pos, self.pos + 1, self.pos)
        self.pos += 1
        return self.logits

    def _rmsnorm(self, x, out):
        """out = x / sqrt(mean(x^2) + eps) (the gain is folded into the next product)."""
        r = self.rstd
        np.einsum("bc,bc->b", x, x, out=r)
        r *= self._inv_c
        r += self._eps
        np.sqrt(r, out=r)
        np.divide(x, r[:, None], out=out)

    def _attend(self, q, kc, vc, S: int):
        """q (B, K, G, D), the cache's first S slots -> self.att (B, K, G, D)."""
        B, K, G = self.B, self.K, self.G
        sc = self._scores[:B * K * G * S].reshape(B, K, G, S)
        keys = kc[:, :S].transpose(0, 2, 3, 1)                             # (B, K, D, S)
        vals = vc[:, :S].transpose(0, 2, 1, 3)                             # (B, K, S, D)
        np.matmul(q, keys, out=sc)
        sc -= sc.max()                                                     # one shift for the lane
        np.exp(sc, out=sc)
        rows = sc.reshape(-1, S)
        norm = self.norm[:B * K * G]
        np.matmul(rows, self.ones[:S], out=norm)                           # row sums (B*K*G,)
        if norm.min() < _TINY:                                             # a row underflowed: shift each row by its own max
            self.fallbacks += 1
            np.matmul(q, keys, out=sc)
            sc -= sc.max(axis=-1, keepdims=True)
            np.exp(sc, out=sc)
            np.matmul(rows, self.ones[:S], out=norm)
        np.matmul(sc, vals, out=self.att)
        self.att /= norm.reshape(B, K, G, 1)

    def _step(self, ids, p: int, S: int, slot: int) -> None:
        """One token per stream at position p, written to cache slot `slot`; attend to slots 0..S-1."""
        f, B, H, K, D, G = self.f, self.B, self.H, self.K, self.D, self.G
        R = f.rotation(p)
        x, h, tmp, wqk = self.x, self.h, self.tmp, self.wqk
        np.take(f.wte, ids, axis=0, out=x)
        for L, (kc, vc) in zip(f.layers, self.cache):
            np.matmul(L.wqk.reshape(-1, D), R, out=wqk)                   # Wqk R_p: q, k come out rotated
            w2 = wqk.reshape(-1, (H + K) * D)
            self._rmsnorm(x, h)
            np.matmul(h, w2[:, :H * D], out=self.q)
            np.matmul(h, w2[:, H * D:], out=kc[:, slot].reshape(B, K * D))  # straight into the cache
            np.matmul(h, L.wv, out=vc[:, slot].reshape(B, K * D))
            self._attend(self.q.reshape(B, K, G, D), kc, vc, S)
            np.matmul(self.att.reshape(B, H * D), L.wo, out=tmp)
            x += tmp
            self._rmsnorm(x, h)
            g, s = self.g, self.up
            np.matmul(h, L.wg, out=g)                                     # gate / 2
            np.matmul(h, L.wu, out=s)                                     # up
            s *= g                                                        # silu(2g) up = g (1 + tanh g) up
            np.tanh(g, out=g)
            g += 1.0
            s *= g
            np.matmul(s, L.wdown, out=tmp)
            x += tmp
        self._rmsnorm(x, h)
        np.matmul(h, f.head, out=self.logits)


# ---------------------------------------------------------------------------------------------
# the compressor's integer frequencies and log-probabilities from a lane's logits, in float32

class Quantiser:
    """logits (B, >= A) float32 -> frequencies (B, A): integers (held in float32, exact below
    2^24), each >= 1, each row summing to exactly `total` (2^24 for the coder).

    Per row: the likeliest symbol t (first on ties) and its logit m; e = exp(z - m) in float32
    (so e_t = 1); c = (total - A) / sum(e) (the sum a float32 product with ones, the quotient in
    float64, rounded to float32); f = floor(e * c) + 1; the remainder total - sum(f) (summed
    exactly, in float64) goes to t. The remainder is the floors' rounding, at most A counts, or
    a little below zero when float32 rounding over-counts (bounded by A * 2^-16 * total, far less
    than f_t >= (total - A) / A): f_t stays >= 1. Deterministic: fixed shapes, one thread."""

    def __init__(self, B: int, A: int, total: int):
        self.A, self.total = A, total
        self.e = np.empty((B, A), np.float32)
        self.ones = np.ones(A, np.float32)
        self.rows = np.arange(B)

    def __call__(self, logits, out) -> None:
        B, A = out.shape
        z = logits[:, :A]
        e = self.e[:B]
        rows = self.rows[:B]
        top = z.argmax(axis=1)
        np.subtract(z, z[rows, top][:, None], out=e)
        np.exp(e, out=e)
        c = ((self.total - A) / (e @ self.ones).astype(np.float64)).astype(np.float32)
        np.multiply(e, c[:, None], out=out)
        np.floor(out, out=out)
        out += 1.0
        rest = self.total - out.sum(axis=1, dtype=np.float64)
        out[rows, top] += rest.astype(np.float32)


def log_softmax_into(logits, out) -> None:
    """logits (B, V) float32 -> out (B, V) float64 log-probabilities (computed in float32: the
    compressor's statistics, not its frequencies)."""
    m = logits.max(axis=1, keepdims=True)
    z = logits - m
    lse = np.log(np.exp(z).sum(axis=1, keepdims=True))
    np.subtract(z, lse, out=out)
