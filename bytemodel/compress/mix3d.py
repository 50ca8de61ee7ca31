"""ctx3 where the model computes ("ctx3d"): compress/mix2.py's ContextMix3 written once for an
array module, so that on a GPU the mixer's state stays on the device beside the network's.

    mix = mixer("ctx3d", lengths, alphabet, fresh, xp)   # xp: numpy or cupy (other names: mix2.mixer's)
    z = mix.predict(t, active, net_logp)                  # xp arrays (active, A) float64
    mix.update(t, active, tokens)

Why: ctx3 on the host costs 42-76 us a stream-token (56.6 ms a step at 1,024 streams on the
2-core CPU), which bounds a GPU's `--adapt` at ~20k tokens a second whatever it does; here a step
is a few dozen device launches whatever the streams.

The arithmetic is ctx3's, line for line (the module doc of compress/mix2.py), but for what a
device needs to give the same bits every run:
- every repeated-row addition of floats (the weight steps) is ops/scatter_ops.add_rows, in index
  order (np.add.at's order; on a GPU gpu/scatter.cu, no atomics); the counts' additions of one are
  scatter_ops.add_ones (integers: on a GPU atomics give the same sums);
- "last write wins" (the match table) and "first claimant owns" (a checked row changing hands)
  are explicit (scatter_ops.put_last / claim_rows: on a GPU the largest / smallest index chosen by
  atomics, gpu/mixer.cu), not an assignment's unspecified order;
- the token contexts' hashes (ctx2's _keys) are one kernel on a GPU (ops/cuda_scatter.context_keys);
- floor(log2(n + 1)) of a count is read from frexp (exact), not from a log.
With NumPy, ContextMix3D is ContextMix3 bit for bit (tests/test_mix.py); with CuPy its integers
(counts, checks, hashes, the match model) are the same as NumPy's, its floats differ from them in
the last bits (the device's exp and log), so a ctx3d file decodes on the device kind that made it
(compress/adapt.check_gpu), as every GPU `--adapt` file does.
"""
from __future__ import annotations

import numpy as np

from ..ops.scatter_ops import kit_for
from . import mix as ctx1
from . import mix2
from .mix import _LOG_C, _P, MAX_LEN
from .mix2 import CONF_BUCKETS, CONTEXTS, LIMIT, LR, LR_CONF, LR_FINAL, SETS

NAME = "ctx3d"


def mixer(name: str, lengths, alphabet: int, fresh: bool = False, xp=np):
    """The mixer the container names: "ctx3d" here (its arrays on xp), the host's (mix2.mixer) else."""
    if name == NAME:
        return ContextMix3D(lengths, alphabet, fresh, xp)
    return mix2.mixer(name, lengths, alphabet, fresh)


def _floor_log2(x, xp):
    """floor(log2(x)) of float64 integers x >= 1, exactly (frexp: x = f * 2^e, f in [0.5, 1))."""
    return xp.frexp(x)[1].astype(np.int64) - 1


class ContextMix3D(mix2.ContextMix3):
    """ctx3 on the array module xp (the module doc)."""

    NAME = NAME

    def __init__(self, lengths, alphabet: int, fresh: bool = False, xp=np):
        super().__init__(lengths, alphabet, fresh)
        self.xp, self.kit = xp, kit_for(xp)
        self.add_rows = self.kit.add_rows
        for name in ("hist", "table", "total", "word", "prev_word", "wordish", "c0", "Ws", "base", "Wc", "V",
                     "wm", "mtab", "mptr", "mlen", "check", "multi", "single", "single_j", "salts", "offset"):
            setattr(self, name, xp.asarray(getattr(self, name)))
        self.by_k = [(xp.asarray(cols), xp.asarray(js), xp.asarray(js.astype(np.uint64))) for cols, js in self.by_k]
        self.words = xp.arange(len(CONTEXTS), self.K, dtype=np.int64)
        self.log_c = xp.asarray(_LOG_C)
        # the hashed contexts' token distances, flattened, for the device's keys (ops/cuda_scatter.context_keys)
        ctx = [CONTEXTS[i] for i in self.multi.tolist()] if xp is not np else []
        self.dist = xp.asarray(np.array([j for c in ctx for j in c], dtype=np.int64))
        self.dist_off = xp.asarray(np.concatenate([[0], np.cumsum([len(c) for c in ctx])]).astype(np.int64))

    def _keys(self, t: int, active: int):
        xp = self.xp
        if xp is not np:            # one kernel, the same integers (ops/cuda_scatter.context_keys)
            from ..ops.cuda_scatter import context_keys
            return context_keys(self.hist, t, active, self.depth, self.A, self.dist, self.dist_off, self.salts, _P)
        back = xp.full((active, self.depth + 1), self.A, dtype=np.int64)
        j0 = max(1, t + 1 - self.depth)
        if t >= 1:
            back[:, t + 1 - xp.arange(j0, t + 1)] = self.hist[:active, j0:t + 1]
        v = back.astype(np.uint64)
        h = xp.broadcast_to(self.salts, (active, len(self.salts))).copy()
        for cols, js, js64 in self.by_k:
            h[:, cols] = h[:, cols] * _P + v[:, js] + js64
        h ^= h >> np.uint64(29)
        h *= _P
        h ^= h >> np.uint64(32)
        return back, h

    def _match(self, active: int):
        xp = self.xp
        ptr = self.mptr[:active]
        has = ptr >= 0
        pred = xp.where(has, self.hist.reshape(-1)[xp.maximum(ptr, 0)], np.int32(-1))
        return pred, has, xp.minimum(self.mlen[:active], MAX_LEN)

    def prepare(self, t: int, active: int) -> None:
        xp, A, K, C = self.xp, self.A, self.K, self.CHAIN
        s = xp.arange(active)
        X = xp.empty((active, self.M, A))
        X[:, 1] = xp.log((self.c0 + 0.5) / (self.c0.sum() + 0.5 * A))
        rows = xp.empty((active, K), dtype=np.int64)
        chk = xp.zeros((active, K), dtype=np.uint16)
        back, hm = self._keys(t, active)
        hw = xp.stack([self._word_key(active, i) for i in range(len(CONTEXTS), K)], axis=1)
        rows[:, self.single] = back[:, self.single_j]
        for idx, h in ((self.multi, hm), (self.words, hw)):
            rows[:, idx] = (h % np.uint64(self.R)).astype(np.int64)
            chk[:, idx] = ((h >> np.uint64(48)) | np.uint64(1)).astype(np.uint16)
        rows += self.offset
        bad = self.check[rows] != chk                                  # owned by another context: empty
        cnt = xp.where(bad[:, :, None], np.uint16(0), self.table[rows])   # (active, K, A)
        counts = xp.where(bad, 0.0, self.total[rows].astype(np.float64))
        X[:, 2:] = self.log_c[cnt]                                     # log(c + ALPHA) - log(N + ALPHA A)
        X[:, 2:] -= xp.log(counts + ctx1.ALPHA * A)[:, :, None]
        seen = counts[:, :C] > 0
        order = xp.where(seen.any(axis=1), C - xp.argmax(seen[:, ::-1], axis=1), 0)
        n_top = xp.where(order > 0, counts[s, xp.maximum(order - 1, 0)], 0.0)
        bucket = xp.minimum(_floor_log2(n_top + 1, xp) // 2, ctx1.N_BUCKETS - 1)
        prev = back[:, 1]
        sel = xp.stack([order * ctx1.N_BUCKETS + bucket, prev], axis=1) + self.base
        nb = xp.minimum(_floor_log2(counts + 1, xp), CONF_BUCKETS - 1)
        cls = 2 * nb + ((cnt.max(axis=2) == counts) & (counts > 0))
        W = self.Ws[sel]                                               # (active, SETS, M)
        W[:, :, 2:] += self.Wc[xp.arange(K), cls][:, None, :]
        self._ready = (t, active, X, rows, chk, bad, sel, cls, order, W, self._match(active))

    def predict(self, t: int, active: int, net):
        xp = self.xp
        if self._ready is None or self._ready[:2] != (t, active):
            self.prepare(t, active)
        _, _, X, rows, chk, bad, sel, cls, order, W, (pred, has, lb) = self._ready
        self._ready = None
        X[:, 0] = net
        zs = xp.einsum("skm,sma->ska", W, X)                           # (active, SETS, A)
        v = self.V[order]
        z = v[:, 0, None] * zs[:, 0] + v[:, 1, None] * zs[:, 1]
        s = xp.arange(active)
        z[s, xp.maximum(pred, 0)] += xp.where(has, self.wm[lb], 0.0)   # the match bonus (x + 0.0 is x)
        self._step = (t, active, X, rows, chk, bad, sel, cls, order, zs, pred, has, lb, z)
        return z

    def update(self, t: int, active: int, sym) -> None:
        st, act, X, rows, chk, bad, sel, cls, order, zs, pred, has, lb, z = self._step
        assert st == t and act == active, "update follows the predict of the same step"
        xp, K, add = self.xp, self.K, self.add_rows
        f = self._rate(active)
        sym = xp.asarray(sym, dtype=np.int64)
        s = xp.arange(active)
        p = _softmax(z, xp)
        ps = _softmax(zs, xp)
        Xy = X[s, :, sym]
        g = Xy[:, None, :] - xp.einsum("ska,sma->skm", ps, X)
        gv = zs[s, :, sym] - (p[:, None, :] * zs).sum(axis=2)
        add(self.V, order, (LR_FINAL * f) * gv)
        add(self.Ws, sel.reshape(-1), (LR * f) * g.reshape(-1, self.M))
        gc = g[:, :, 2:].sum(axis=1) / SETS
        add(self.Wc.reshape(-1), (xp.arange(K) * (2 * CONF_BUCKETS) + cls).reshape(-1), (LR_CONF * f) * gc.reshape(-1))
        gm = (pred == sym).astype(np.float64) - xp.where(has, p[s, xp.maximum(pred, 0)], 0.0)
        add(self.wm, lb, (4 * LR * f) * gm, mask=has)
        r, c, b = rows.reshape(-1), chk.reshape(-1), bad.reshape(-1)
        self.kit.claim_rows(self.check, r, c, b, (self.table, self.total))   # cleared, first claimant owns
        mine = self.check[r] == c
        self._count(r, xp.repeat(sym, K), mine)
        self._advance(t, active, sym, pred, has)
        self._step = self._ready = None

    def _count(self, r, sym, mine) -> None:
        """ctx2's _count of the cells (r, sym) where mine, at LIMIT."""
        xp = self.xp
        self.kit.add_ones(self.table.reshape(-1), r * self.A + sym, mine)
        self.kit.add_ones(self.total, r, mine)
        full = r[(self.total[r] > LIMIT) & mine]
        if len(full):
            full = xp.unique(full)
            self.table[full] >>= 1
            self.total[full] = self.table[full].sum(axis=1, dtype=np.int64)

    def _bump(self, counts, idx) -> None:
        """ctx1's order-0 count (ctx1's _advance, written for any xp, is the rest)."""
        self.kit.add_ones(counts, idx)

    def _put_last(self, out, idx, vals) -> None:
        self.kit.put_last(out, idx, vals)


def _softmax(z, xp):
    e = xp.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
