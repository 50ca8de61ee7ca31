"""One token of one sequence on the CPU: Model.forward_cached's arithmetic for a (1, 1) batch, bit
for bit, in fewer NumPy calls and no new arrays a token.

    step = OneToken(model, cache, W)     # cache: model.new_cache(1, S) after a prefill (step.cache
                                         # may be set to another); W: model.weights()
    logits = step(token, pos)            # (V,) float32, valid until the next call

At the tiny preset a token's cost is NumPy calls rather than products (0.9M multiply-adds; the
general path makes ~50 calls a layer, each a few microseconds). This copy of the block
computes every value as numpy_ops does through Model.block, rounding for rounding, in 33 calls a
layer into buffers made once (out=), with the same np.matmul calls on operands of the same shapes
and strides (so BLAS takes the same path), and drops only what cannot change the logits:

- the op wrappers, reshapes and the per-op caches for a backward pass;
- attention's log-sum-exp (training only) and its diagonal mask, which for one query adds 0.0 to
  the last score (x + 0.0 is x; a -0.0 turns +0.0, which nothing after can tell apart);
- the copies: the rotated key lands in its cache slot, the residual stream is updated in place.

and writes two steps another way that rounds the same: RoPE on q and k together as three passes,
x * [cos, cos] + [x2, x1] * [-sin, sin] (x1 cos - x2 sin is x1 cos + x2 (-sin) in IEEE arithmetic,
signed zeros included), and the RMSNorm's per-row scalars (np.mean's division in float64 by the
count, rounded to float32; + eps, sqrt, 1/x in float32) on NumPy float32 scalars.

tests/test_decode_cpu_step.py holds its logits to forward_cached's with np.array_equal, so the
bytes generation draws are those of the general path. A change to numpy_ops or Model.block that
this copy does not follow fails there.

At two BLAS threads (BlasThreads, when that times faster) OpenBLAS splits a (1, C) x (C, N) product
over its columns only from C x N = SPLIT_ELEMS; small's qkv (384 x 1152) and down (1024 x 384)
fall just short, so that way reads copies of them with zero columns up to that size (padded_cols),
whose real columns give the same bits (each half a multiple of ALIGN; splits_alike checks each
padded shape once and keeps the plain product where they would not).

`OneBlasThread(model)`: generate holds BLAS to one thread while one sample is generated, when
every product of a token is small (SPLIT_MACS), its prefills and re-reads included (so the bytes
do not depend on the caller's BLAS thread count). A token's logits do not depend on the count
anyway (each output of a product is one thread's dot product; the test checks 1 and 2 threads).

Shapes: C d_model, H heads, K kv heads, G = H // K, D head dim, F d_ff, V vocabulary, S cache length.
"""
from __future__ import annotations

import math
import os
import time
from functools import partial

import numpy as np

from .cpu_pair import ALIGN, Faster, product_chunks

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

SPLIT_ELEMS = 460_800  # C x N: from this size OpenBLAS runs a (1, C) x (C, N) product on two threads, below it on
                       # one whatever the count (OpenBLAS 0.3.31, NumPy 2.4's wheel, measured: (384, 1184) one thread,
                       # (384, 1200) two; small's qkv 384 x 1152 and down 1024 x 384 fall just short)
PAD_MAX = 1.25         # at two BLAS threads, such a product's weights get zero columns up to SPLIT_ELEMS when that
                       # adds at most a quarter (small: qkv 1152 -> 1216, down 384 -> 480; from memory, at two threads
                       # 86 -> 45 us and 82 -> 58 us on the 2-core VM); the real columns' bits do not change

PAD = os.environ.get("BYTEMODEL_CPU_PAD", "1") != "0"   # 0: no padding (benchmarks/README.md's "as it was" rows)

PAIR_MACS = 1 << 17     # multiply-adds: with a cpu_pair.Pair, a product at least this large runs in column
                        # parts on two threads (small's all but the head; none of tiny's: at most 98k)


def padded_cols(C: int, N: int) -> int:
    """The columns a (C, N) product's weights take at two BLAS threads: N, or N plus zero columns
    up to SPLIT_ELEMS when that is at most PAD_MAX x N, a multiple of 2 x cpu_pair.ALIGN. OpenBLAS
    gives each thread half the columns, and a half that is not a multiple of ALIGN rounds its
    tail otherwise (measured: 384 x 1200 and 1024 x 464 change bits at two threads, 1216 and 480
    do not); OneToken checks each padded shape once all the same (splits_alike)."""
    if C * N >= SPLIT_ELEMS or N % ALIGN:   # N % ALIGN: its tail columns would join a block and round otherwise
        return N
    unit = 2 * ALIGN
    n = -(-SPLIT_ELEMS // C)            # the fewest columns that reach SPLIT_ELEMS, rounded up to a unit
    n = -(-n // unit) * unit
    return n if n <= PAD_MAX * N else N


_ALIKE: dict = {}


def splits_alike(w, wp, threads) -> bool:
    """Whether x @ wp at two BLAS threads gives x @ w's bits at one in its first columns, on one
    random row x (the split and the kernel's blocks depend on the shape only, so a rounding that
    differs shows on almost any row); remembered by shape."""
    key = (w.shape, wp.shape, w.dtype.str)
    if key not in _ALIKE:
        x = np.random.default_rng(0).standard_normal((1, w.shape[0])).astype(w.dtype)
        was = threads.n
        threads.set(1)
        a = x @ w
        threads.set(2)
        b = (x @ wp)[:, :w.shape[1]]
        threads.set(was)
        _ALIKE[key] = bool(np.array_equal(a, b))
    return _ALIKE[key]


def small_products(cfg) -> bool:
    """Every product of a token under SPLIT_MACS multiply-adds (tiny and small: yes; base: no)."""
    C, H, K, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    return max(C * (H + 2 * K) * D, H * D * C, C * 2 * F, F * C, C * cfg.vocab_size) < SPLIT_MACS


def pair_for(cfg) -> bool:
    """A second thread for the step's products (cpu_pair.Pair): two cores or more and a product
    of PAIR_MACS or more (small: yes; tiny: no, its products are too short to share)."""
    from ..ops.scorer import _cores
    C, H, K, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    return _cores() >= 2 and max(C * (H + 2 * K) * D, H * D * C, C * 2 * F, F * C) >= PAIR_MACS


class OneBlasThread:
    """Inside `with`: BLAS held to one thread, for a model of small products on the CPU (otherwise
    nothing changes), prefills and re-reads included. A token's products give the same bits at
    any thread count (every output one thread's dot product); a prefill's (T, C) products do not
    (OpenBLAS splits them by thread count), so held, a generation's bytes no longer depend on the
    caller's BLAS threads. On a loaded machine a second BLAS thread made a 64-token prefill at the
    tiny preset 0.3 s, more than its 190 tokens. Two calls into the BLAS library cost ~35 us: the
    count changes once a generation."""

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


class BlasThreads:
    """The BLAS thread count for a step's products, 1 or 2 (OneToken's two ways with a Faster),
    set only when it changes (two calls into the library, ~35 us). A token's products give the
    same bits at either count; a prefill's do not, so the caller sets 1 before each (`one()`).
    On an idle 2-core VM two threads made small's generation 3-14% faster in four runs of five
    (benchmarks/cpu_two_threads.py, benchmarks/README.md); on a loaded one a second BLAS thread
    made it up to 4x slower (SPLIT_MACS): hence chosen by timing, as the pair is."""

    def __init__(self, libs):
        self.libs, self.n = list(libs), 1

    def set(self, n: int) -> None:
        if n != self.n:
            for lib in self.libs:
                lib.set_num_threads(n)
            self.n = n

    def one(self) -> None:
        self.set(1)


class OneToken:
    """The (1, 1) step of Model.forward_cached over a cache of (1, K, S, D) buffers (see the module
    docstring). pos < min(S, context): the caller re-reads a full cache (decode/window.py)."""

    def __init__(self, model, cache, W, pair=None, threads: BlasThreads | None = None):
        cfg = model.cfg
        self.cfg = cfg
        C, H, K, D, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
        self.H, self.K, self.G, self.D, self.F = H, K, H // K, D, F
        self.eps, self.C = cfg.norm_eps, C
        self.scale = np.float32(1.0 / math.sqrt(D))
        cos, sin = model.rope(cfg.context, 0, model.ops.activation_dtype(model.dtype))   # (context, D/2)
        # one rotation as three passes over q and k together: x * [cos, cos] + swap(x) * [-sin, sin],
        # swap(x) = [x2, x1]; x1 cos - x2 sin is x1 cos + x2 (-sin) exactly, as _rotate's two halves
        self.cc = np.concatenate([cos, cos], axis=1).reshape(cfg.context, 2, D // 2)
        self.ss = np.concatenate([-sin, sin], axis=1).reshape(cfg.context, 2, D // 2)
        self.wte, self.norm_f, self.head = W["wte"], W["norm_f"], model.head(W)[0]
        self.layers = [tuple(W[f"layers.{i}.{n}"] for n in ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gateup",
                                                             "w_down")) for i in range(cfg.n_layers)]
        f32 = np.float32
        self.x = np.empty((1, C), f32)                        # the residual stream
        self.sq, self.xh, self.h = np.empty(C, f32), np.empty((1, C), f32), np.empty((1, C), f32)
        # the outputs of qkv and down as the front of rows wide enough for their padded weights (padded_cols)
        self.pad_qkv, self.pad_down = padded_cols(C, (H + 2 * K) * D), padded_cols(F, C)
        self.qkv_wide = np.empty((1, self.pad_qkv), f32)
        self.qkv = self.qkv_wide[:, :(H + 2 * K) * D]
        self.r, self.rb = np.empty((H + K, 2, D // 2), f32), np.empty((H + K, 2, D // 2), f32)
        self.q = np.empty((1, K, self.G, 1, D), f32)          # rotated and scaled queries
        self.sbuf = np.empty(H * cfg.context, f32)            # scores, (1, K, G, 1, S) at the front
        self.mx, self.l = np.empty((1, K, self.G, 1, 1), f32), np.empty((1, K, self.G, 1, 1), f32)
        self.o = np.empty((1, K, self.G, 1, D), f32)
        self.y_wide = np.empty((1, max(C, self.pad_down)), f32)
        self.y = self.y_wide[:, :C]
        self.u = np.empty((1, 2 * F), f32)
        self.sig, self.s = np.empty((1, F), f32), np.empty((1, F), f32)
        self.logits = np.empty((1, cfg.vocab_size), f32)
        self.cache = cache
        # views made once: q and k of the projection (and q, k swapped halves), the rotated key and
        # queries, the values, the attention output as one row, the SwiGLU's gate and up halves
        t = self.qkv.reshape(H + 2 * K, 2, D // 2)
        self.qk, self.swap, self.tv = t[:H + K], t[:H + K, ::-1], t[H + K:].reshape(K, D)
        self.rk, self.rq = self.r[H:].reshape(K, D), self.r[:H].reshape(self.q.shape)
        self.of = self.o.reshape(1, H * D)
        self.g, self.up = self.u[:, :F], self.u[:, F:]
        # the products as callables, one way per entry: [0] each one np.matmul; [1] with a Pair, the
        # large ones in column parts over two threads (the same bits); way[1] is a step's products
        # or with `threads` (no pair): the same products at one BLAS thread (way 0) and at two (way 1)
        self.threads = threads if pair is None else None
        self.pair, self.faster = pair, (Faster() if pair is not None or self.threads is not None else None)
        one = self._products(None)
        two = self._products(None, padded=PAD) if self.threads is not None else None
        self.ways = [one] + ([self._products(pair)] if pair is not None else [two] if two is not None else [])

    def _products(self, pair, padded=False):
        """Per layer (qkv, wo, gate-up, down) callables, then the head's: each writes x @ w into
        its buffer, (1, C) x (C, N) -> (1, N). padded: qkv's and down's weights with zero columns
        (padded_cols; copies made here), written into the wide rows, for two BLAS threads."""
        def one(x, w, out):
            if pair is None or w.shape[0] * w.shape[1] < PAIR_MACS:
                return partial(np.matmul, x, w, out=out)
            return partial(pair.run, product_chunks(x, w, out, pair.parts))

        def wide(x, w, out, cols):
            if not padded or cols == w.shape[1]:
                return one(x, w, out[:, :w.shape[1]])
            wp = np.zeros((w.shape[0], cols), w.dtype)
            wp[:, :w.shape[1]] = w
            if not splits_alike(w, wp, self.threads):
                return one(x, w, out[:, :w.shape[1]])
            return partial(np.matmul, x, wp, out=out[:, :cols])
        layers = [(wide(self.h, wqkv, self.qkv_wide, self.pad_qkv), one(self.of, wo, self.y), one(self.h, wgu, self.u),
                   wide(self.s, wd, self.y_wide, self.pad_down)) for _, wqkv, wo, _, wgu, wd in self.layers]
        return layers, one(self.h, self.head, self.logits)

    def close(self) -> None:
        """Ends the pair's helper thread, if any (the step still runs, on one thread)."""
        if self.pair is not None:
            self.pair.close()
            self.pair, self.faster, self.ways = None, None, self.ways[:1]
        if self.threads is not None:
            self.threads.one()

    def _norm(self, g):
        """self.h = rmsnorm(self.x) * g, as numpy_ops.rmsnorm_forward: np.mean's float32 sum, its
        division in float64 by the count rounded to float32, then float32 scalars (NumPy's own
        rounding, the (N, 1) column's), one scale and one gain pass."""
        np.square(self.x[0], out=self.sq)
        ms = np.float32(float(np.add.reduce(self.sq)) / self.C)
        r = 1.0 / np.sqrt(ms + self.eps)
        np.multiply(self.x, r, out=self.xh)
        np.multiply(self.xh, g, out=self.h)

    @property
    def cache(self):
        return self._cache

    @cache.setter
    def cache(self, cache):
        """Per layer: the cache's key rows as (1, K, 1, D, S) (the scores' operand, transposed)
        and its values as (1, K, 1, S, D), sliced to the keys seen each token."""
        self._cache = cache
        self.kv = None if cache is None else [(kc, vc, kc[:, :, None].swapaxes(-1, -2), vc[:, :, None])
                                              for kc, vc in cache]

    def __call__(self, token: int, pos: int) -> np.ndarray:
        if self.faster is None:
            return self._step(self.ways[0], token, pos)
        way = self.faster.pick()
        if self.threads is not None:
            self.threads.set(1 + way)
        t = time.perf_counter()
        out = self._step(self.ways[way], token, pos)
        self.faster.took(way, time.perf_counter() - t)
        return out

    def _step(self, products, token, pos):
        H, K, G = self.H, self.K, self.G
        layer_products, head_product = products
        x, r, rb, qk, swap, q, o, mx, l = self.x, self.r, self.rb, self.qk, self.swap, self.q, self.o, self.mx, self.l
        y, sig, sw, g, u = self.y, self.sig, self.s, self.g, self.up
        rk, tv, rq = self.rk, self.tv, self.rq
        x[0] = self.wte[token]
        cc, ss = self.cc[pos], self.ss[pos]
        S = pos + 1
        s = self.sbuf[:H * S].reshape(1, K, G, 1, S)
        for (an, _, _, mn, _, _), (pqkv, pwo, pgu, pd), (kc, vc, kt, vv) in zip(self.layers, layer_products, self.kv):
            self._norm(an)
            pqkv()
            np.multiply(qk, cc, out=r)
            np.multiply(swap, ss, out=rb)
            r += rb
            kc[0, :, pos] = rk                                          # the key, rotated, in its slot
            vc[0, :, pos] = tv
            np.multiply(rq, self.scale, out=q)
            np.matmul(q, kt[..., :S], out=s)                            # (1, K, G, 1, S)
            np.maximum.reduce(s, axis=-1, keepdims=True, out=mx)
            s -= mx
            np.exp(s, out=s)
            np.add.reduce(s, axis=-1, keepdims=True, out=l)
            np.matmul(s, vv[:, :, :, :S], out=o)                        # (1, K, G, 1, D)
            o /= l
            pwo()
            x += y
            self._norm(mn)
            pgu()
            np.negative(g, out=sig)
            np.exp(sig, out=sig)
            sig += 1.0
            np.reciprocal(sig, out=sig)
            np.multiply(g, sig, out=sw)
            sw *= u
            pd()
            x += y
        self._norm(self.norm_f)
        head_product()
        return self.logits[0]
