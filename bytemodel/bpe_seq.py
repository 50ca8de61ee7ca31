"""The engine shared by BPE training and encoding: a token sequence as arrays with a linked list.

Dimension legend: N positions (bytes of the input), K occurrences touched by one merge.

    tok  int32[N]  token id at each position; -1 once the position was absorbed by a merge
    nxt  int32[N]  next live position of the same segment; -1 at a segment's end
    prv  int32[N]  previous live position of the same segment; -1 at a segment's start

Positions never move: a merge of the pair at (p, nxt[p]) writes the new id at p and kills nxt[p].
So the live positions, read in increasing order, are the current token sequence.

A "window" at position p is the adjacent pair (tok[p], tok[nxt[p]]), keyed by the int64
code  tok[p] << 16 | tok[nxt[p]]. Segments (documents, pre-split pieces) are concatenated into one
array; no window crosses a segment boundary.

One fact both users rely on: every window a merge creates contains the merge's new id, so a pair
code gains windows only during the merge that created the newer of its two ids. A per-pair list
of candidate positions, filled once and then only filtered (stale positions are skipped by
checking tok and nxt), is therefore complete; and pair counts only go up in that one merge.
"""
from __future__ import annotations

import numpy as np

SHIFT = 16  # code = a << SHIFT | b; ids are < 65536


def codes_of(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pair codes (int64[K]) of id arrays a, b (any integer dtype, same length K)."""
    return (a.astype(np.int64) << SHIFT) | b.astype(np.int64)


class LinkedSeq:
    """A mutable token sequence made of segments; see the module docstring for the arrays."""

    def __init__(self, ids: np.ndarray, seg_ends: np.ndarray | None = None):
        """ids: integer[N] token ids; seg_ends: int[S] exclusive end of each segment (last == N).

        With seg_ends None the whole array is one segment.
        """
        n = len(ids)
        self.n = n
        self.tok = ids.astype(np.int32)
        self.nxt = np.arange(1, n + 1, dtype=np.int32)
        self.prv = np.arange(-1, n - 1, dtype=np.int32)
        # window_ok[p]: a window starts at p initially (p is not the last of its segment)
        self.window_ok = np.ones(max(n - 1, 0), dtype=bool)
        if n:
            self.nxt[-1] = -1
        if seg_ends is not None and len(seg_ends) > 1:
            ends = np.asarray(seg_ends[:-1], dtype=np.int64)
            ends = ends[(ends > 0) & (ends < n)]
            self.nxt[ends - 1] = -1
            self.prv[ends] = -1
            self.window_ok[ends - 1] = False

    def byte_pair_codes16(self) -> np.ndarray:
        """uint16[N-1] code a << 8 | b of each initial window (ids must all be < 256)."""
        t = self.tok.astype(np.uint16)
        return (t[:-1] << 8) | t[1:]

    def find(self, cands: np.ndarray, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Occurrences of (a, b) to merge: (P int32[K] left positions, Q int32[K] right positions).

        cands: int[C] sorted candidate positions (may hold stale ones, which are skipped).
        Occurrences are taken leftmost first without overlap: a run a a a with a == b gives
        (aa) a, as sequential left-to-right replacement does.
        """
        tok, nxt = self.tok, self.nxt
        q = nxt[cands]
        ok = tok[cands] == a
        ok &= q >= 0
        ok &= tok[q] == b  # q == -1 reads the last element; masked by (q >= 0) above
        P = cands[ok]
        Q = q[ok]
        if a == b and len(P) > 1:
            # chains of overlapping occurrences p -> nxt[p] -> ...: keep the 1st, 3rd, 5th ...
            chained = np.empty(len(P), dtype=bool)
            chained[0] = False
            np.equal(Q[:-1], P[1:], out=chained[1:])
            if chained.any():
                idx = np.arange(len(P))
                start = np.where(chained, 0, idx)
                np.maximum.accumulate(start, out=start)
                keep = ((idx - start) & 1) == 0
                P, Q = P[keep], Q[keep]
        return P, Q

    def apply(self, P: np.ndarray, Q: np.ndarray, t: int) -> np.ndarray:
        """Merge the occurrences found by find(): P takes id t, Q dies, P links to nxt[Q].

        Returns R = int32[K] the new right neighbour of each P (-1 at a segment end).
        Afterwards the windows that changed are: created at P where R >= 0, (t, tok[R]), and at
        prv[P] where that is >= 0 and not the previous P, (tok[prv[P]], t).
        """
        tok, nxt, prv = self.tok, self.nxt, self.prv
        R = nxt[Q]
        tok[P] = t
        tok[Q] = -1
        nxt[P] = R
        hasR = R >= 0
        prv[R[hasR]] = P[hasR]
        return R

    def live_ids(self) -> np.ndarray:
        """uint16[n_tokens] the current token sequence."""
        t = self.tok
        return t[t >= 0].astype(np.uint16)

    def live_segment_ids(self, seg_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(uint16[n_tokens] ids, int64[S] number of tokens in each segment)."""
        live = np.flatnonzero(self.tok >= 0)
        seg_of = np.searchsorted(seg_ends, live, side="right")
        counts = np.bincount(seg_of, minlength=len(seg_ends))
        return self.tok[live].astype(np.uint16), counts
