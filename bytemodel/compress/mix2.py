"""The second context mixer ("ctx2", the default of new `--adapt` files): ctx1 (compress/mix.py)
with checked rows, weights by each input's own confidence, and two weight sets mixed again.

    mix = mixer(name, lengths, alphabet, fresh)     # "ctx1" or "ctx2": the container's name
    z = mix.predict(t, active, net_logp); mix.update(t, active, tokens)   # as ctx1

What changes from ctx1 (each measured on machine code under a DNA model and on English from a
fresh model: benchmarks/README.md, "A second mixer"):
- checked rows: a hashed context's row carries 16 bits of its hash; a row that another context
  owns reads as empty (no longer one context's counts polluted by another's), and the update
  gives it to the first stream (in stream order) that claims it this step, cleared; a stream
  whose check then differs from the owner's adds nothing to it.
- confidence weights: each context input's weight is the chosen set's weight plus a weight of its
  own class: log2 of its row's count (CONF_BUCKETS classes) and whether the row has seen a single
  token only (deterministic), so a context that has seen little counts for little.
- two weight sets, one chosen by the longest order seen and its count (as ctx1), one by the
  previous token; each learns as if it predicted alone (its own softmax), and a final layer
  (weights chosen by the order, starting at 1/2 each) mixes their logits and learns on the mix.
- an order-8 context, LIMIT 8000, LR 1.5e-3.
- a fresh start (`--adapt --preset`, no checkpoint) gives the network weight 0 at the start: it
  knows nothing yet (from a checkpoint: 1, as ctx1).

ctx3 (ContextMix3, the default of new files since 2026-12-02): ctx2 with each step's weight
updates scaled by min(1, FULL_RATE_STREAMS / active streams). Every mixer sums its per-stream
steps over the streams of a step, all taken from the same weights; at up to 256 streams that is
ctx2 exactly (the same bits), beyond it ctx2 over-steps (a fresh tiny model on 256 KB of English in
512 streams: 2.80 bits/byte against 2.07 in 256; on 1 MB in 1,024 streams it diverged to 7.61)
where ctx3 gives 2.10 and 2.02 (benchmarks/README.md, "Many streams under --adapt").

Memory: ctx1's, with 10 hashed contexts (was 9) and a uint16 check per row: about 170 MB of counts
for bytes from 128 KB of tokens up.

Determinism: as ctx1 (integer counts; float64 in a fixed order on the calling thread, the weighted
sums by einsum as ctx1's, no BLAS). The constants
are the format: change any and NAME must change too.
"""
from __future__ import annotations

import numpy as np

from . import mix as ctx1
from .mix import _LOG_C, _P, ContextMix

NAME = "ctx2"
CONTEXTS = ctx1.CONTEXTS + ((1, 2, 3, 4, 5, 6, 7, 8),)
LIMIT = 8000                        # a row whose total passes this is halved (ctx1: 2000)
LR = 1.5e-3                         # each weight set's rate (ctx1: 1e-3)
LR_CONF = 3e-4                      # the confidence weights' rate
LR_FINAL = 2e-3                     # the final layer's rate
CONF_BUCKETS = 6                    # confidence classes by log2(count + 1), each deterministic or not
SETS = 2                            # weight sets: by order and count, by the previous token
NAME3 = "ctx3"                      # ctx2 with its steps scaled past FULL_RATE_STREAMS streams
FULL_RATE_STREAMS = 256             # ctx3: up to this many streams a step, every step at full rate


def mixer(name: str, lengths, alphabet: int, fresh: bool = False):
    """A host mixer the container names: "ctx1", "ctx2" (files from before ctx3) or "ctx3"
    (compress/mix3d.mixer adds "ctx3d", on the model's device)."""
    if name == ctx1.NAME:
        return ContextMix(lengths, alphabet)
    if name == NAME:
        return ContextMix2(lengths, alphabet, fresh)
    if name == NAME3:
        return ContextMix3(lengths, alphabet, fresh)
    raise ValueError(f"unknown mixer {name!r}")


class ContextMix2(ContextMix):
    """The ctx2 mixer (the module doc). fresh: the network starts with weight 0 (a seeded fresh model)."""

    NAME, CONTEXTS = NAME, CONTEXTS

    def __init__(self, lengths, alphabet: int, fresh: bool = False):
        super().__init__(lengths, alphabet)
        A, K = self.A, self.K
        self.hashed = np.array([i >= len(CONTEXTS) or len(CONTEXTS[i]) > 1 for i in range(K)])
        self.check = np.zeros(len(self.total), dtype=np.uint16)   # a hashed row's owner (0: nobody yet)
        w_net = 0.0 if fresh else 1.0
        self.Ws = np.zeros((self.W.shape[0] + A + 1, self.M))     # set 0's rows, then set 1's (a row per token, and none)
        self.Ws[:, 0] = w_net
        self.base = np.array([0, self.W.shape[0]], dtype=np.int64)
        del self.W
        self.Wc = np.zeros((K, 2 * CONF_BUCKETS))                 # each context's weight by its class
        self.V = np.full((self.CHAIN + 1, SETS), 1.0 / SETS)     # the final layer, by order
        # the token contexts' keys all at once (_keys): which tokens back each reads, by its k-th token
        self.depth = max(max(c) for c in CONTEXTS)
        multi = [i for i, c in enumerate(CONTEXTS) if len(c) > 1]
        self.multi = np.array(multi, dtype=np.int64)
        self.single = np.array([i for i, c in enumerate(CONTEXTS) if len(c) == 1], dtype=np.int64)
        self.single_j = np.array([CONTEXTS[i][0] for i in self.single], dtype=np.int64)
        self.by_k = [(np.array([n for n, i in enumerate(multi) if len(CONTEXTS[i]) > k]),
                      np.array([CONTEXTS[i][k] for i in multi if len(CONTEXTS[i]) > k], dtype=np.int64))
                     for k in range(max(len(CONTEXTS[i]) for i in multi))]
        self.salts = (self.multi + 1).astype(np.uint64)

    def _keys(self, t: int, active: int):
        """The keys of every token context before step t, as ctx1's _key computes them one by one
        (the same integers: the hash's sums and products are modulo 2^64, whatever their grouping):
        -> (back (active, depth + 1) int64: column j the token j back, A before the start;
        multi (active, len(self.multi)) uint64: the hashed contexts' keys)."""
        back = np.full((active, self.depth + 1), self.A, dtype=np.int64)
        j0 = max(1, t + 1 - self.depth)                 # the oldest column read
        if t >= 1:
            back[:, t + 1 - np.arange(j0, t + 1)] = self.hist[:active, j0:t + 1]
        v = back.astype(np.uint64)
        h = np.broadcast_to(self.salts, (active, len(self.salts))).copy()
        for cols, js in self.by_k:                      # the k-th token of every context that has one
            h[:, cols] = h[:, cols] * _P + v[:, js] + js.astype(np.uint64)
        h ^= h >> np.uint64(29)
        h *= _P
        h ^= h >> np.uint64(32)
        return back, h

    def prepare(self, t: int, active: int) -> None:
        """The part of step t's prediction that the network's does not enter (predict does it if not
        done): callable while the network computes, on another thread."""
        A, K, C = self.A, self.K, self.CHAIN
        s = np.arange(active)
        X = np.empty((active, self.M, A))
        X[:, 1] = np.log((self.c0 + 0.5) / (self.c0.sum() + 0.5 * A))
        rows = np.empty((active, K), dtype=np.int64)
        chk = np.zeros((active, K), dtype=np.uint16)
        back, hm = self._keys(t, active)
        hw = np.stack([self._word_key(active, i) for i in range(len(CONTEXTS), K)], axis=1)
        rows[:, self.single] = back[:, self.single_j]
        for idx, h in ((self.multi, hm), (np.arange(len(CONTEXTS), K), hw)):
            rows[:, idx] = (h % np.uint64(self.R)).astype(np.int64)
            chk[:, idx] = ((h >> np.uint64(48)) | np.uint64(1)).astype(np.uint16)
        rows += self.offset
        bad = self.check[rows] != chk                                  # owned by another context: empty
        cnt = self.table[rows]                                         # (active, K, A)
        cnt[bad] = 0
        counts = self.total[rows].astype(np.float64)
        counts[bad] = 0.0
        np.take(_LOG_C, cnt, out=X[:, 2:])                             # log(c + ALPHA) - log(N + ALPHA A)
        X[:, 2:] -= np.log(counts + ctx1.ALPHA * A)[:, :, None]
        seen = counts[:, :C] > 0
        order = np.where(seen.any(axis=1), C - np.argmax(seen[:, ::-1], axis=1), 0)   # 0: none seen
        n_top = np.where(order > 0, counts[s, np.maximum(order - 1, 0)], 0.0)
        bucket = np.minimum(np.log2(n_top + 1).astype(np.int64) // 2, ctx1.N_BUCKETS - 1)
        prev = back[:, 1]                                              # the previous token (A before the start)
        sel = np.stack([order * ctx1.N_BUCKETS + bucket, prev], axis=1) + self.base   # (active, SETS) rows of Ws
        nb = np.minimum(np.log2(counts + 1).astype(np.int64), CONF_BUCKETS - 1)
        cls = 2 * nb + ((cnt.max(axis=2) == counts) & (counts > 0))   # (active, K)
        W = self.Ws[sel]                                               # (active, SETS, M)
        W[:, :, 2:] += self.Wc[np.arange(K), cls][:, None, :]
        self._ready = (t, active, X, rows, chk, bad, sel, cls, order, W, self._match(active))

    def predict(self, t: int, active: int, net) -> np.ndarray:
        if self._ready is None or self._ready[:2] != (t, active):
            self.prepare(t, active)
        _, _, X, rows, chk, bad, sel, cls, order, W, (pred, has, lb) = self._ready
        self._ready = None
        X[:, 0] = net
        zs = np.einsum("skm,sma->ska", W, X)                           # (active, SETS, A)
        v = self.V[order]                                              # (active, SETS)
        z = v[:, 0, None] * zs[:, 0] + v[:, 1, None] * zs[:, 1]
        hs = np.flatnonzero(has)
        z[hs, pred[hs]] += self.wm[lb[hs]]
        self._step = (t, active, X, rows, chk, bad, sel, cls, order, zs, pred, has, lb, z)
        return z

    def _rate(self, active: int) -> float:
        """The factor on every weight step of a step of `active` streams: 1 (ctx3 scales it)."""
        return 1.0

    def update(self, t: int, active: int, sym) -> None:
        st, act, X, rows, chk, bad, sel, cls, order, zs, pred, has, lb, z = self._step
        assert st == t and act == active, "update follows the predict of the same step"
        f = self._rate(active)          # 1.0 leaves every rate as it is, so ctx2's steps are bit for bit
        sym = np.asarray(sym, dtype=np.int64)
        s = np.arange(active)
        p = _softmax(z)                                                # (active, A) the mix
        ps = _softmax(zs)                                              # (active, SETS, A) each set alone
        Xy = X[s, :, sym]                                              # (active, M)
        g = Xy[:, None, :] - np.einsum("ska,sma->skm", ps, X)           # (active, SETS, M): d log p_k[y] / dw
        gv = zs[s, :, sym] - (p[:, None, :] * zs).sum(axis=2)          # (active, SETS): d log p[y] / dv
        np.add.at(self.V, order, (LR_FINAL * f) * gv)
        np.add.at(self.Ws, sel.reshape(-1), (LR * f) * g.reshape(-1, self.M))
        gc = g[:, :, 2:].sum(axis=1) / SETS                            # (active, K)
        np.add.at(self.Wc, (np.broadcast_to(np.arange(self.K), cls.shape).reshape(-1), cls.reshape(-1)),
                  (LR_CONF * f) * gc.reshape(-1))
        gm = (pred == sym).astype(np.float64) - np.where(has, p[s, np.maximum(pred, 0)], 0.0)
        np.add.at(self.wm, lb[has], (4 * LR * f) * gm[has])
        r, c, b = rows.reshape(-1), chk.reshape(-1), bad.reshape(-1)
        if b.any():                                                    # rows changing hands: cleared, first claimant owns
            rb = r[b]
            self.table[rb] = 0
            self.total[rb] = 0
            owners, first = np.unique(rb, return_index=True)
            self.check[owners] = c[b][first]
        mine = self.check[r] == c
        self._count(r[mine], np.repeat(sym, self.K)[mine], LIMIT)
        self._advance(t, active, sym, pred, has)
        self._step = self._ready = None


class ContextMix3(ContextMix2):
    """ctx3: ctx2 whose weight steps are scaled by min(1, FULL_RATE_STREAMS / active) (the module doc)."""

    NAME = NAME3

    def _rate(self, active: int) -> float:
        return min(1.0, FULL_RATE_STREAMS / max(active, 1))


def _softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, float64."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
