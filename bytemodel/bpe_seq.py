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

    def merge(self, cands: np.ndarray, a: int, b: int, t: int, want_removed: bool):
        """Merge every occurrence of (a, b) among the candidate positions into id t.

        cands: int[K] sorted candidate positions (may hold stale ones, which are skipped).
        Occurrences are merged leftmost first without overlap: a run a a a with a == b becomes
        (aa) a, as sequential left-to-right replacement would do.

        Returns (n_merged, removed, added): removed is int32[R] positions of windows that
        disappeared (None unless want_removed; their codes must be read BEFORE the call, so it
        returns (positions, codes) instead), added is int32[A] sorted positions of windows that
        the merge created (each containing t) and their codes int64[A].
        """
        tok, nxt, prv = self.tok, self.nxt, self.prv
        q = nxt[cands]
        ok = (tok[cands] == a) & (q >= 0)
        ok &= tok[q] == b  # q == -1 reads the last element; masked by (q >= 0) above
        P = cands[ok]
        if len(P) == 0:
            return 0, None, (np.empty(0, np.int32), np.empty(0, np.int64))
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
        R = nxt[Q]
        hasR = R >= 0
        removed = None
        if want_removed:
            L = prv[P]
            rem = np.concatenate([L[L >= 0], P, Q[hasR]])
            rem = np.unique(rem)
            removed = (rem, codes_of(tok[rem], tok[nxt[rem]]))
        # rewrite: P takes t, Q dies, P links to R
        tok[P] = t
        tok[Q] = -1
        nxt[P] = R
        prv[R[hasR]] = P[hasR]
        Lnew = prv[P]
        add = np.concatenate([Lnew[Lnew >= 0], P[hasR]])
        add = np.unique(add)
        added = (add, codes_of(tok[add], tok[nxt[add]]))
        return len(P), removed, added

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


def group_by_code(pos: np.ndarray, codes: np.ndarray):
    """Split positions by code: yields (code, int32[k] sorted positions) for each distinct code.

    pos must be sorted; a stable sort by code keeps each group's positions sorted.
    """
    if len(codes) == 0:
        return
    order = np.argsort(codes, kind="stable")
    c = codes[order]
    p = pos[order]
    starts = np.flatnonzero(np.concatenate(([True], c[1:] != c[:-1])))
    bounds = starts.tolist() + [len(c)]
    for i, code in enumerate(c[starts].tolist()):
        yield code, p[bounds[i]:bounds[i + 1]]
