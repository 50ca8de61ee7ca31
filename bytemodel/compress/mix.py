"""Context mixing: the model's prediction mixed with counts of what the file itself has shown.

    mix = ContextMix(lengths, alphabet)          # one per compression, the same on both sides
    z = mix.predict(t, active, net_logp)         # (active, A) float64 logits of the mixed prediction
    mix.update(t, active, tokens)                # after the step: what was just coded

A network adapting by gradient steps learns a file slowly: a few hundred updates cannot relearn
machine code or English from a DNA model (benchmarks/README.md, adapting while coding). Counting
learns at once: the second time a context occurs, its count already predicts. General-purpose
context-mixing compressors (PAQ, cmix; Mahoney, "Adaptive weighing of context models for lossless
data compression", 2005) mix many such predictors with weights learned online. This mixer does
that over whole tokens, for every stream at once:

- inputs (M = 2 + len(CONTEXTS) + WORD_CONTEXTS, plus the match model): the network's
  log-probabilities over the alphabet; an order-0 count; for each context in CONTEXTS (which of
  the stream's previous tokens it reads: (1, 2) is the last two, (2,) the one before the last: a
  sparse context) and for the word contexts (the hash of the word being coded: letters, digits,
  bytes >= 0x80 and merges continue a word; and it with the word before) a row of token counts
  in a table shared by all streams (hashed; a row per value for one-token contexts), turned into
  log((c + ALPHA) / (N + ALPHA * A)). A row whose total passes LIMIT is halved.
- a match model: per stream, a pointer to where the last MATCH_MIN tokens occurred before (in any
  stream's coded past); while its predictions come true it follows on, and the predicted token's
  logit gets a learned bonus by match length.
- the mix is geometric: logits z = sum_i w_i * input_i (+ the match bonus), p = softmax(z). The
  weight vector is chosen per stream by the longest order of the order chain (the first CHAIN
  contexts) seen before, and by that context's count (N_BUCKETS buckets); after each step the
  chosen weights take a gradient step on the coded token's log-loss
  (d(-log p[y])/dw_i = E_p[input_i] - input_i[y]), at rate LR.

Memory: the counts, at most 2^15 rows (a power of two near a quarter of the tokens) x A x 2 bytes
per hashed context (about 150 MB for bytes, from 128 KB of tokens up; MAX_CELLS bounds large
alphabets), plus 4 bytes per token of history and a 2 MB match table.

Determinism: integer counts, float64 arithmetic in a fixed order on one thread at a time (the
driver's mixer thread: `prepare` for the next step after `update`, beside the network's forward
pass), the same calls on both sides of the coder. The constants are part of the format: the container names the
mixer (NAME); change any of them and NAME must change too. New files use ctx2 (compress/mix2.py,
a subclass of this one); ctx1 stays as it is, so the files that name it decode.
"""
from __future__ import annotations

import numpy as np

from ..ops.scatter_ops import put_last
from .coder import quantise

NAME = "ctx1"                       # the container's name for this mixer and its constants
CONTEXTS = ((1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6), (2,), (3,), (2, 3), (1, 3), (4,), (1, 2, 4))
CHAIN = 5                           # the first CHAIN contexts are the order chain (weight selection)
ALPHA = 0.05                        # additive prior of a count row
LIMIT = 2000                        # a row whose total passes this is halved (old counts fade)
N_BUCKETS = 4                       # weight sets per chain order, by log4 of its count
LR = 1e-3                           # the mixer's learning rate
W0 = 0.0                            # the counts' starting weights (the network's: 1)
WORD_CONTEXTS = 2                   # and two word contexts: the word so far, and it with the word before
MATCH_MIN = 6                       # tokens a match model's context hashes
MATCH_BITS = 18                     # its hash table: 2^18 entries
MAX_LEN = 31                        # match lengths are bucketed up to this
MAX_ROWS_BITS = 15                  # a count table has at most 2^15 rows ...
MAX_CELLS = 1 << 23                 # ... and at most 2^23 cells (large alphabets get fewer rows)
_P = np.uint64(0x9E3779B97F4A7C15)  # the hash's odd multiplier (2^64 / golden ratio)
_LOG_C = np.log(np.arange(1 << 16) + ALPHA)   # log(c + ALPHA) for every uint16 count: a gather, not a log


def rows_for(n_tokens: int, alphabet: int) -> int:
    """Rows of a hashed count table: a power of two near n / 4 (small files, small tables), within the caps."""
    bits = max(8, min(MAX_ROWS_BITS, int(max(n_tokens, 1) // 4).bit_length()))
    while bits > 8 and (1 << bits) * alphabet > MAX_CELLS:
        bits -= 1
    return 1 << bits


class ContextMix:
    """The mixer of one compression (see the module doc). lengths (S,): tokens per stream
    (non-increasing); alphabet A: the coded ids are 0..A-1. The format's constants are class
    attributes (the module's), so a later mixer (compress/mix2.py) can change them in a subclass."""

    NAME, CONTEXTS, CHAIN, WORD_CONTEXTS = NAME, CONTEXTS, CHAIN, WORD_CONTEXTS
    xp = np                             # where its arrays live (compress/mix3d.py: also the model's device)

    def __init__(self, lengths, alphabet: int):
        self.lengths = np.asarray(lengths, dtype=np.int64)
        S, A = len(self.lengths), int(alphabet)
        self.A, steps = A, int(self.lengths[0]) if S else 0
        n = int(self.lengths.sum())
        self.R = rows_for(n, A)
        self.hist = np.zeros((S, steps + 1), dtype=np.int32)   # column j: the token of step j - 1
        self.row_len = steps + 1
        K = len(self.CONTEXTS) + self.WORD_CONTEXTS
        rows = [A + 1 if i < len(self.CONTEXTS) and len(self.CONTEXTS[i]) == 1 else self.R for i in range(K)]
        self.K, self.offset = K, np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
        self.table = np.zeros((sum(rows), A), dtype=np.uint16)   # every context's rows, one after the other
        self.total = np.zeros(sum(rows), dtype=np.int64)         # each row's sum
        self.word = np.zeros(S, dtype=np.uint64)      # hash of the word being coded (0: between words)
        self.prev_word = np.zeros(S, dtype=np.uint64)
        self.wordish = np.ones(A, dtype=bool)          # ids that continue a word: letters, digits, >= 0x80, merges
        ascii_ = np.arange(min(A, 128))
        self.wordish[ascii_] = np.isin(ascii_, np.frombuffer(
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", dtype=np.uint8))
        self.c0 = np.zeros(A, dtype=np.int64)
        self.M = 2 + K                               # network, order 0, contexts
        self.W = np.full(((self.CHAIN + 1) * N_BUCKETS, self.M), W0)
        self.W[:, 0] = 1.0                                       # start as the network alone
        self.wm = np.zeros(MAX_LEN + 1)
        self.mtab = np.full(1 << MATCH_BITS, -1, dtype=np.int64)   # hash -> flat index into hist
        self.mptr = np.full(S, -1, dtype=np.int64)
        self.mlen = np.zeros(S, dtype=np.int64)
        self._step = self._ready = None

    def _key(self, t: int, active: int, ctx, salt: int):
        """Each active stream's context `ctx` before step t (tokens before a stream's start: A): its
        token for one-token contexts (a table with a row per value), else a 64-bit hash."""
        if len(ctx) == 1:
            col = t + 1 - ctx[0]
            return self.hist[:active, col] if col >= 1 else np.full(active, self.A, dtype=np.int64)
        h = np.full(active, salt, dtype=np.uint64)
        for j in ctx:
            col = t + 1 - j
            v = self.hist[:active, col] if col >= 1 else np.full(active, self.A, dtype=np.int64)
            h = h * _P + v.astype(np.uint64) + np.uint64(j)
        h ^= h >> np.uint64(29)
        h *= _P
        h ^= h >> np.uint64(32)
        return h

    def _hash(self, t: int, active: int, ctx, salt: int) -> np.ndarray:
        """Row of each active stream's context `ctx` before step t."""
        h = self._key(t, active, ctx, salt)
        return h if len(ctx) == 1 else (h % np.uint64(self.R)).astype(np.int64)

    def _word_key(self, active: int, i: int) -> np.ndarray:
        h = self.word[:active] * _P + np.uint64(i)
        if i > len(self.CONTEXTS):
            h = (h ^ (self.prev_word[:active] >> np.uint64(7))) * _P
        h ^= h >> np.uint64(32)
        return h

    def _word_row(self, active: int, i: int) -> np.ndarray:
        return (self._word_key(active, i) % np.uint64(self.R)).astype(np.int64)

    def _match(self, active: int):
        """The match model's prediction before a step: (pred (active,), -1 where none; has; length bucket)."""
        ptr = self.mptr[:active]
        has = ptr >= 0
        pred = np.where(has, self.hist.reshape(-1)[np.maximum(ptr, 0)], -1)
        return pred, has, np.minimum(self.mlen[:active], MAX_LEN)

    def prepare(self, t: int, active: int) -> None:
        """The part of step t's prediction that the network's does not enter (predict does it if not
        done): callable while the network computes, on another thread (the driver does)."""
        A = self.A
        X = np.empty((active, self.M, A))
        X[:, 1] = np.log((self.c0 + 0.5) / (self.c0.sum() + 0.5 * A))
        rows = np.empty((active, self.K), dtype=np.int64)
        for i in range(self.K):
            rows[:, i] = self._hash(t, active, self.CONTEXTS[i], i + 1) if i < len(self.CONTEXTS) else self._word_row(active, i)
        rows += self.offset
        counts = self.total[rows].astype(np.float64)                     # (active, K)
        np.subtract(_LOG_C[self.table[rows]], np.log(counts + ALPHA * A)[:, :, None], out=X[:, 2:])
        C = self.CHAIN
        seen = counts[:, :C] > 0
        order = np.where(seen.any(axis=1), C - np.argmax(seen[:, ::-1], axis=1), 0)   # 0: none seen
        n_top = np.where(order > 0, counts[np.arange(active), np.maximum(order - 1, 0)], 0.0)
        bucket = np.minimum(np.log2(n_top + 1).astype(np.int64) // 2, N_BUCKETS - 1)
        sel = order * N_BUCKETS + bucket
        self._ready = (t, active, X, rows, sel, self._match(active))

    def predict(self, t: int, active: int, net) -> np.ndarray:
        """net (active, A) float64: the network's log-probabilities -> the mix's logits (active, A)."""
        if self._ready is None or self._ready[:2] != (t, active):
            self.prepare(t, active)
        _, _, X, rows, sel, (pred, has, lb) = self._ready
        self._ready = None
        X[:, 0] = net
        z = np.einsum("sm,sma->sa", self.W[sel], X)
        hs = np.flatnonzero(has)
        z[hs, pred[hs]] += self.wm[lb[hs]]
        self._step = (t, active, X, rows, sel, pred, has, lb, z)
        return z

    def frequencies(self, z):
        """The coder's frequencies (active, A) of predict's logits z (compress/coder.quantise, on
        self.xp; ctx3f's predict made them already)."""
        return quantise(z, self.A, self.xp)

    def update(self, t: int, active: int, sym) -> None:
        """After step t: learn the coded tokens sym (active,) (predict(t, ...) came first)."""
        st, act, X, rows, sel, pred, has, lb, z = self._step
        assert st == t and act == active, "update follows the predict of the same step"
        sym = np.asarray(sym, dtype=np.int64)
        s = np.arange(active)
        zz = z - z.max(axis=1, keepdims=True)
        p = np.exp(zz)
        p /= p.sum(axis=1, keepdims=True)
        g = X[s, :, sym] - np.einsum("sa,sma->sm", p, X)           # -d(log loss)/dw, per stream
        np.add.at(self.W, sel, LR * g)
        gm = (pred == sym).astype(np.float64) - np.where(has, p[s, np.maximum(pred, 0)], 0.0)
        np.add.at(self.wm, lb[has], 4 * LR * gm[has])
        r = rows.reshape(-1)
        self._count(r, np.repeat(sym, self.K), LIMIT)
        self._advance(t, active, sym, pred, has)
        self._step = self._ready = None

    def _count(self, r, sym, limit: int) -> None:
        """Add one to the cells (r, sym) (flat rows, repeats add up); halve a row whose total passes limit."""
        np.add.at(self.table, (r, sym), 1)
        np.add.at(self.total, r, 1)
        full = r[self.total[r] > limit]
        if len(full):
            full = np.unique(full)
            self.table[full] >>= 1
            self.total[full] = self.table[full].sum(axis=1, dtype=np.int64)

    def _bump(self, counts, idx) -> None:
        """Add one to counts[idx] (repeats add up)."""
        np.add.at(counts, idx, 1)

    def _put_last(self, out, idx, vals) -> None:
        """out[idx[i]] = vals[i], a repeated idx keeping the last i's (ops/scatter_ops.put_last)."""
        put_last(out, idx, vals)

    def _advance(self, t: int, active: int, sym, pred, has) -> None:
        """After step t: order 0, the history, the words and the match model take the coded tokens sym.
        Written for any array module self.xp (NumPy here; ctx3d's CuPy: compress/mix3d.py)."""
        xp = self.xp
        self._bump(self.c0, sym)
        self.hist[:active, t + 1] = sym
        w = self.wordish[sym]
        word = self.word[:active]
        ended = ~w & (word != 0)
        self.prev_word[:active] = xp.where(ended, word, self.prev_word[:active])
        self.word[:active] = xp.where(w, (word + np.uint64(1)) * _P + sym.astype(np.uint64), np.uint64(0))
        ok = has & (pred == sym)
        self.mlen[:active] = xp.where(ok, self.mlen[:active] + 1, 0)
        self.mptr[:active] = xp.where(ok, self.mptr[:active] + 1, -1)
        if t + 1 >= MATCH_MIN:
            h = xp.zeros(active, dtype=np.uint64)
            for j in range(MATCH_MIN):
                h = h * _P + self.hist[:active, t + 1 - j].astype(np.uint64)
            h ^= h >> np.uint64(31)
            slot = (h % np.uint64(1 << MATCH_BITS)).astype(np.int64)
            lost = self.mptr[:active] < 0
            found = self.mtab[slot]
            self.mptr[:active] = xp.where(lost & (found >= 0), found, self.mptr[:active])
            # where the token after this context will be: column t + 2 of the stream (known from the next
            # step on); a slot written by two streams keeps the last one's, on any xp
            self._put_last(self.mtab, slot, xp.arange(active, dtype=np.int64) * self.row_len + t + 2)
