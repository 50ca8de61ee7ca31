"""One token of one sequence on the CPU: Model.forward_cached's arithmetic for a (1, 1) batch, bit
for bit, in fewer NumPy calls and no new arrays a token.

    step = OneToken(model, cache, W)     # cache: model.new_cache(1, S) after a prefill (step.cache
                                         # may be set to another); W: model.weights()
    logits = step(token, pos)            # (V,) float32, valid until the next call

Batch-1 generation on the CPU costs a few hundred NumPy calls a token, not the products (tiny's
are 0.9M multiply-adds). This copy of the block makes the same ufunc calls on the same values as
numpy_ops through Model.block, and the same np.matmul calls on operands of the same shapes and
strides (so BLAS takes the same path), and drops only what cannot change the logits:

- the op wrappers, reshapes and the per-op caches for a backward pass;
- attention's log-sum-exp (training only) and its diagonal mask, which for one query adds 0.0 to
  the last score (x + 0.0 is x; a -0.0 turns +0.0, which nothing after can tell apart);
- the copies: RoPE writes the rotated key straight into its cache slot, every activation lands in
  a buffer made once (out=), the residual stream is updated in place.

tests/test_decode_cpu_step.py holds its logits to forward_cached's with np.array_equal, so the
bytes generation draws are those of the general path. A change to numpy_ops or Model.block that
this copy does not follow fails there.

`OneBlasThread(model)`: generate holds BLAS to one thread while one sample steps, when every
product of a token is small (SPLIT_MACS); prefills and re-reads run at the caller's count. A
token's logits do not depend on the BLAS thread count (each output of a product is one thread's
dot product; the test checks that 1 and 2 threads give the same bits).

Shapes: C d_model, H heads, K kv heads, G = H // K, D head dim, F d_ff, V vocabulary, S cache length.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np

# The ModelConfig fields this copy of the block follows, and those that cannot change its logits
# (as model.FOLLOWS; checked by tests/test_engines.py)
FOLLOWS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "context", "rope_theta",
           "norm_eps", "tie_embeddings")
IGNORES = {"init_std": "training only", "mtp": "the next-token logits only: the multi-token heads are not run",
           "mtp_design": "the multi-token heads are not run", "mtp_weight": "training only",
           "dropout": "training steps only (Model.forward with a Dropout)",
           "dropout_attn": "training steps only (Model.forward with a Dropout)"}


SPLIT_MACS = 1 << 20    # multiply-adds: a batch-1 product below this (all of tiny's and small's: at most
                        # 0.8M) runs on one BLAS thread; a second one costs a wake-up per product, and
                        # on the loaded 2-core VM it made small's generation 4x slower (5 vs 22 tokens/s
                        # at load average 13; tiny 71 vs 102). base's (3.1M) keep the default.


def small_products(cfg) -> bool:
    """Every product of a token under SPLIT_MACS multiply-adds (tiny and small: yes; base: no)."""
    C, H, K, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    return max(C * (H + 2 * K) * D, H * D * C, C * 2 * F, F * C, C * cfg.vocab_size) < SPLIT_MACS


class OneBlasThread:
    """Inside `with`: BLAS held to one thread (a model of small products on the CPU; otherwise
    nothing changes), except inside `released()`, where the caller's count is back: a prefill's
    (T, C) products are split over threads differently by thread count and so round differently,
    one token's are not (every output one thread's dot product). Two calls into the BLAS library
    cost ~35 us, so the count changes once a generation and twice a re-read, never a token."""

    def __init__(self, model, hold: bool = True):
        self.libs = []
        if hold and model.ops.cpu_threads and small_products(model.cfg):
            from threadpoolctl import ThreadpoolController   # a core dependency
            self.libs = ThreadpoolController().select(user_api="blas").lib_controllers
        self.saved = None

    def _set(self, counts):
        for lib, n in zip(self.libs, counts):
            lib.set_num_threads(n)

    def __enter__(self):
        self.saved = [lib.get_num_threads() for lib in self.libs]
        self._set([1] * len(self.libs))
        return self

    def __exit__(self, *exc):
        self._set(self.saved)
        self.saved = None

    @contextmanager
    def released(self):
        if not self.saved:
            yield
            return
        self._set(self.saved)
        try:
            yield
        finally:
            self._set([1] * len(self.libs))


class OneToken:
    """The (1, 1) step of Model.forward_cached over a cache of (1, K, S, D) buffers (see the module
    docstring). pos < min(S, context): the caller re-reads a full cache (decode/window.py)."""

    def __init__(self, model, cache, W):
        cfg = model.cfg
        self.cfg, self.cache = cfg, cache
        C, H, K, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
        self.H, self.K, self.G, self.D, self.F = H, K, H // K, D, F
        self.eps, self.C = cfg.norm_eps, np.intp(C)          # np.mean divides by an intp count
        self.scale = np.float32(1.0 / math.sqrt(D))
        self.cos, self.sin = model.rope(cfg.context, 0, model.ops.activation_dtype(model.dtype))  # (context, D/2)
        self.wte, self.norm_f, self.head = W["wte"], W["norm_f"], model.head(W)[0]
        self.layers = [tuple(W[f"layers.{i}.{n}"] for n in ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gateup",
                                                             "w_down")) for i in range(cfg.n_layers)]
        f32 = np.float32
        self.x = np.empty((1, C), f32)                        # the residual stream
        self.sq, self.xh, self.h = np.empty((1, C), f32), np.empty((1, C), f32), np.empty((1, C), f32)
        self.ms = np.empty((1, 1), f32)
        self.qkv = np.empty((1, (H + 2 * K) * D), f32)
        self.q = np.empty((1, H, 1, D), f32)                  # rotated queries, then scaled (qs)
        self.tmp = np.empty((H, D // 2), f32)
        self.y = np.empty((1, C), f32)
        self.u = np.empty((1, 2 * F), f32)
        self.sig, self.s = np.empty((1, F), f32), np.empty((1, F), f32)
        self.logits = np.empty((1, cfg.vocab_size), f32)

    def _norm(self, g):
        """self.h = rmsnorm(self.x) * g, as numpy_ops.rmsnorm_forward (np.mean's reduce, then its
        division by the intp count)."""
        np.square(self.x, out=self.sq)
        ms = np.add.reduce(self.sq, axis=-1, keepdims=True, out=self.ms)
        np.true_divide(ms, self.C, out=ms, casting="unsafe")
        np.add(ms, self.eps, out=ms)
        np.sqrt(ms, out=ms)
        np.divide(1.0, ms, out=ms)
        np.multiply(self.x, ms, out=self.xh)
        np.multiply(self.xh, g, out=self.h)

    def _rotate(self, x, out, cos, sin):
        """out = x rotated (numpy_ops._rotate's passes, in its order); x, out (n, D), cos/sin (D/2,)."""
        h = self.D // 2
        x1, x2, o1, o2 = x[:, :h], x[:, h:], out[:, :h], out[:, h:]
        tmp = self.tmp[:x.shape[0]]
        np.multiply(x2, sin, out=tmp)
        np.multiply(x1, cos, out=o1)
        o1 -= tmp
        np.multiply(x1, sin, out=tmp)
        np.multiply(x2, cos, out=o2)
        o2 += tmp

    def __call__(self, token: int, pos: int) -> np.ndarray:
        H, K, G, D, F = self.H, self.K, self.G, self.D, self.F
        x = self.x
        x[0] = self.wte[token]
        cos, sin = self.cos[pos], self.sin[pos]
        S = pos + 1
        for (an, wqkv, wo, mn, wgu, wd), (kc, vc) in zip(self.layers, self.cache):
            self._norm(an)
            np.matmul(self.h, wqkv, out=self.qkv)
            t = self.qkv.reshape(H + 2 * K, D)
            q = self.q.reshape(H, D)
            self._rotate(t[:H], q, cos, sin)
            self._rotate(t[H:H + K], kc[0, :, pos], cos, sin)          # the key, rotated in its slot
            vc[0, :, pos] = t[H + K:]
            qs = self.q.reshape(1, K, G, 1, D)
            qs *= self.scale
            k, v = kc[:, :, :S], vc[:, :, :S]
            s = np.matmul(qs, k[:, :, None].swapaxes(-1, -2))           # (1, K, G, 1, S)
            m = s.max(axis=-1, keepdims=True)
            s -= m
            np.exp(s, out=s)
            l = s.sum(axis=-1, keepdims=True)
            o = np.matmul(s, v[:, :, None])                             # (1, K, G, 1, D)
            o /= l
            np.matmul(o.reshape(1, H * D), wo, out=self.y)
            x += self.y
            self._norm(mn)
            np.matmul(self.h, wgu, out=self.u)
            g, u = self.u[:, :F], self.u[:, F:]
            sig = self.sig
            np.negative(g, out=sig)
            np.exp(sig, out=sig)
            sig += 1.0
            np.reciprocal(sig, out=sig)
            np.multiply(g, sig, out=self.s)
            self.s *= u
            np.matmul(self.s, wd, out=self.y)
            x += self.y
        self._norm(self.norm_f)
        np.matmul(self.h, self.head, out=self.logits)
        return self.logits[0]
