"""The engine shared by BPE training and encoding: a token sequence as arrays with a linked list.

Dimension legend: N positions (bytes of the input), K occurrences touched by one merge.

    tok  uint16[N+1]  token id at each position; DEAD once the position was absorbed by a merge
    nxt  intp[N+1]    next live position of the same segment; the sentinel N at a segment's end
    prv  intp[N+1]    previous live position of the same segment; N at a segment's start

Position N is a sentinel: tok[N] = DEAD, nxt[N] = prv[N] = N. Ids are at most 65534 (the
vocabulary of 65536 ends with at least one special id), so DEAD = 65535 is never a real id, and
a window that reaches the sentinel or a dead position never matches a real pair.

Positions never move: a merge of the pair at (p, nxt[p]) writes the new id at p and kills nxt[p].
So the live positions, read in increasing order, are the current token sequence.

A "window" at position p is the adjacent pair (tok[p], tok[nxt[p]]). Segments (documents,
pre-split pieces) are concatenated into one array; no window crosses a segment boundary.

One fact both users rely on: every window a merge creates contains the merge's new id, so a pair
gains windows only during the merge that created the newer of its two ids. A per-pair list of
candidate positions, filled then and afterwards only filtered (stale positions are skipped by
checking tok and nxt), is therefore complete; and a pair's count only falls after that merge.
"""
from __future__ import annotations

import numpy as np

SHIFT = 16  # pair code = a << SHIFT | b
DEAD = 0xFFFF  # tok of absorbed positions and of the sentinel


class LinkedSeq:
    """A mutable token sequence made of segments; see the module docstring for the arrays."""

    def __init__(self, ids: np.ndarray, seg_ends: np.ndarray | None = None):
        """ids: integer[N] token ids (< DEAD); seg_ends: int[S] exclusive segment ends (last == N).

        With seg_ends None the whole array is one segment.
        """
        n = len(ids)
        self.n = n
        self.tok = np.empty(n + 1, dtype=np.uint16)
        self.tok[:n] = ids
        self.tok[n] = DEAD
        self.nxt = np.arange(1, n + 2, dtype=np.intp)
        self.nxt[n] = n
        self.prv = np.arange(-1, n, dtype=np.intp)
        self.prv[0] = n
        self.prv[n] = n
        if seg_ends is not None and len(seg_ends) > 1:
            ends = np.asarray(seg_ends[:-1], dtype=np.int64)
            ends = ends[(ends > 0) & (ends < n)]
            self.nxt[ends - 1] = n
            self.prv[ends] = n

    def byte_pair_codes16(self) -> np.ndarray:
        """uint16[N-1] code a << 8 | b of the pair at each (p, p+1); ids must all be < 256.

        Pairs across a segment boundary are included; windows() rejects them.
        """
        t = self.tok[:self.n]
        return (t[:-1] << 8) | t[1:]

    def windows(self, cands: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """All current windows (a, b) among the candidates, overlapping ones included.

        cands: intp[C] sorted candidate positions (may hold stale ones, which are skipped).
        Returns (P intp[K] left positions, Q intp[K] right positions), sorted.
        """
        tok = self.tok
        c = cands[tok[cands] == a]
        q = self.nxt[c]
        ok = tok[q] == b  # the sentinel and dead positions hold DEAD, never b
        return c[ok], q[ok]

    @staticmethod
    def non_overlapping(P: np.ndarray, Q: np.ndarray, same: bool) -> tuple[np.ndarray, np.ndarray]:
        """The windows to merge, leftmost first without overlap (a run a a a gives (aa) a).

        Only a pair (a, a) (same=True) can overlap: in each chain p -> nxt[p] -> ... of
        overlapping windows the 1st, 3rd, 5th ... are kept.
        """
        if not same or len(P) < 2:
            return P, Q
        chained = np.empty(len(P), dtype=bool)
        chained[0] = False
        np.equal(Q[:-1], P[1:], out=chained[1:])
        if not chained.any():
            return P, Q
        idx = np.arange(len(P))
        start = np.where(chained, 0, idx)
        np.maximum.accumulate(start, out=start)
        keep = ((idx - start) & 1) == 0
        return P[keep], Q[keep]

    def find(self, cands: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Occurrences of (a, b) to merge: (P, Q) left and right positions, sorted, no overlap."""
        P, Q = self.windows(cands, a, b)
        return self.non_overlapping(P, Q, a == b)

    def apply(self, P: np.ndarray, Q: np.ndarray, t: int, want_left: bool = True):
        """Merge the occurrences found by find(): P takes id t, Q dies, P links to nxt[Q].

        Returns (L, R): intp[K] the left and right neighbours of each P (the sentinel N at a
        segment edge; L is None unless want_left). The windows created are (tok[L], t) at L and (t, tok[R]) at P, except
        where tok[L] or tok[R] is DEAD: L == the previous Q (that window is the (t, t) one at
        the previous P) or a segment edge. tok[R] == t where R is itself a merged position.
        """
        tok, nxt, prv = self.tok, self.nxt, self.prv
        L = prv[P] if want_left else None
        R = nxt[Q]
        tok[P] = t
        tok[Q] = DEAD
        nxt[P] = R
        prv[R] = P  # prv[N] of the sentinel is scribbled on; nothing reads it
        return L, R

    def live_ids(self) -> np.ndarray:
        """uint16[n_tokens] the current token sequence."""
        t = self.tok[:self.n]
        return t[t != DEAD]

    def live_segment_ids(self, seg_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(uint16[n_tokens] ids, int64[S] number of tokens in each segment)."""
        t = self.tok[:self.n]
        live = np.flatnonzero(t != DEAD)
        seg_of = np.searchsorted(seg_ends, live, side="right")
        counts = np.bincount(seg_of, minlength=len(seg_ends))
        return t[live], counts
