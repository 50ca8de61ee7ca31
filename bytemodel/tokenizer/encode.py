"""Applying byte-pair merges: bytes -> uint16 ids, fast, and the vectorised reverse.

Encoding applies merge 0 to every occurrence (leftmost first, no overlap), then merge 1, and so
on; pairs made by merge i have ranks > i, so this equals GPT-2-style "always merge the
lowest-ranked pair present". It never loops over bytes in Python: the positions of each pair
are indexed once (radix argsort), and each merge that occurs is applied with NumPy
(bytemodel.tokenizer.seq.LinkedSeq.find / apply). A heap of the ranks present skips merges that never
occur.

Big inputs (encode_chunks / encode_file) are cut into chunks at "safe" byte boundaries: between
bytes x, y such that no token of the vocabulary contains x y, so no token can span the cut and the
result equals encoding the whole input at once. If a window of max_chunk bytes has no safe
boundary (e.g. DNA, where every bigram lies inside some token), it is cut at its end anyway:
still an exact round trip, only the tokens at that cut may differ from whole-input encoding.
With pre_split="text" the cut goes between an ASCII letter and a space or newline, which is a
piece boundary of the pattern, so that case is exact too.
"""
from __future__ import annotations

import functools
import heapq
from typing import BinaryIO, Iterable, Iterator

import numpy as np

from ..errors import TokenizerError
from .pretok import PRE_SPLITS, pre_split_pieces
from .seq import DEAD, SHIFT, LinkedSeq


NONE = 0xFFFF  # "no rank" in uint16 rank arrays; ranks are < 65535 - 256


class MergeTable:
    """Lookup structures for a merges list: rank of a pair, fast for byte pairs.

    byte_rank: int32[65536] rank of the pair (a, b) at index a << 8 | b, -1 if not a merge
    codes: int64[M] sorted pair codes; ranks: int64[M] their ranks (lowest rank first on ties)
    """

    def __init__(self, merges: list[tuple[int, int]]):
        m = np.asarray(merges, dtype=np.int64).reshape(-1, 2)
        self.merges = [(int(a), int(b)) for a, b in m]
        self.n = len(self.merges)
        allc = _codes(m[:, 0], m[:, 1]) if self.n else np.empty(0, np.int64)
        order = np.argsort(allc, kind="stable")
        self.codes = allc[order]
        self.ranks = order.astype(np.int64)
        self.byte_rank = np.full(1 << 16, -1, dtype=np.int32)
        small = np.flatnonzero((m[:, 0] < 256) & (m[:, 1] < 256)) if self.n else np.empty(0, np.int64)
        for r in small[::-1].tolist():  # reversed so the lowest rank of a duplicate pair wins
            a, b = self.merges[r]
            self.byte_rank[(a << 8) | b] = r
        self._safe = None
        # partners: id u -> (sorted partner ids, their ranks) for merges (u, y) / (x, u)
        self.right: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.left: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if self.n:
            r = np.arange(self.n, dtype=np.int64)
            for side, key, other in ((self.right, m[:, 0], m[:, 1]), (self.left, m[:, 1], m[:, 0])):
                order = np.lexsort((r, other, key))  # by key, then partner, then rank
                k, o, rr = key[order], other[order], r[order]
                first = np.concatenate(([True], (k[1:] != k[:-1]) | (o[1:] != o[:-1])))
                k, o, rr = k[first], o[first], rr[first]  # a repeated pair: its lowest rank only
                bounds = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1]))).tolist() + [len(k)]
                for j, u in enumerate(k[bounds[:-1]].tolist()):
                    side[u] = (o[bounds[j]:bounds[j + 1]], rr[bounds[j]:bounds[j + 1]])

    def rank_of(self, codes: np.ndarray) -> np.ndarray:
        """int64[K] rank of each pair code, -1 where it is not a merge."""
        if self.n == 0 or len(codes) == 0:
            return np.full(len(codes), -1, np.int64)
        i = np.searchsorted(self.codes, codes)
        i = np.minimum(i, self.n - 1)
        return np.where(self.codes[i] == codes, self.ranks[i], -1)

    def inside(self) -> np.ndarray:
        """bool[256, 256]: True where the bigram x y occurs inside some token of the vocabulary."""
        if self._safe is None:
            vocab = [bytes([i]) for i in range(256)]
            inside = np.zeros((256, 256), dtype=bool)
            for a, b in self.merges:
                v = vocab[a] + vocab[b]
                vocab.append(v)
                # only the bigram across the join is new; the rest are inside vocab[a], vocab[b]
                inside[vocab[a][-1], vocab[b][0]] = True
            self._safe = inside
        return self._safe


@functools.lru_cache(maxsize=8)
def _cached_table(key: tuple) -> MergeTable:
    return MergeTable(list(key))


def as_table(merges) -> MergeTable:
    """A MergeTable for a merges list (the last few are cached by value) or the table itself."""
    if isinstance(merges, MergeTable):
        return merges
    return _cached_table(tuple((int(a), int(b)) for a, b in merges))


def apply_merges(ids: np.ndarray, merges, seg_ends: np.ndarray | None = None) -> np.ndarray:
    """uint16[N] ids -> uint16[n] ids after the merges (list of pairs, or a MergeTable).

    seg_ends: optional int[S] exclusive segment ends; no merge crosses a segment boundary.
    """
    table = as_table(merges)
    ids = np.asarray(ids)
    if table.n == 0 or len(ids) < 2:
        return ids.astype(np.uint16)
    seq = LinkedSeq(ids, seg_ends)
    return _run(seq, table).live_ids()


def _codes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """int64 pair codes a << SHIFT | b."""
    return (a.astype(np.int64) << SHIFT) | b.astype(np.int64)


def _run(seq: LinkedSeq, table: MergeTable) -> LinkedSeq:
    """Apply the table's merges to seq in rank order (in place); returns seq."""
    n = seq.n
    tok = seq.tok
    index: dict[int, np.ndarray] = {}  # rank -> sorted candidate positions (may be stale)
    pending: list[int] = []  # heap of ranks that have candidates
    init_pos = init_off = None
    if n < 2:
        return seq
    if int(tok[:n].max()) < 256:
        c16 = seq.byte_pair_codes16()
        init_pos = np.argsort(c16, kind="stable")  # radix sort
        # group offsets by binary search in the sorted codes (np.bincount would first copy
        # the uint16 codes to intp)
        init_off = np.searchsorted(c16[init_pos], np.arange((1 << 16) + 1), side="left")
        ranks = table.byte_rank[np.flatnonzero(np.diff(init_off))]
        pending = ranks[ranks >= 0].tolist()
        del c16
    else:  # input already holds merged ids: index every window through the general lookup
        wpos = np.flatnonzero(seq.nxt[:n] < n)
        _add_to_index(index, pending, wpos, table.rank_of(_codes(tok[wpos], tok[wpos + 1])))
    heapq.heapify(pending)
    right, left = table.right, table.left
    lut = np.full(DEAD + 1, NONE, dtype=np.uint16)  # partner id -> rank, for the merge at hand
    while pending:
        r = heapq.heappop(pending)
        a, b = table.merges[r]
        cands = index.pop(r, None)
        if cands is None:
            if init_pos is None or a >= 256 or b >= 256:
                continue
            c = (a << 8) | b
            cands = init_pos[init_off[c]:init_off[c + 1]]
        t = 256 + r
        P, Q = seq.find(cands, a, b)
        if len(P) == 0:
            continue
        rp, lp = right.get(t), left.get(t)
        L, R = seq.apply(P, Q, t, want_left=lp is not None)
        for side in (0, 1):
            partners = rp if side == 0 else lp
            if partners is None:
                continue
            pos, other = (P, tok[R]) if side == 0 else (L, tok[L])
            ids, rks = partners
            if len(ids) == 1:
                hit = np.flatnonzero(other == ids[0])
                if len(hit):
                    _put(index, pending, int(rks[0]), pos[hit])
                continue
            lut[ids] = rks
            rk = lut[other]  # DEAD maps to NONE
            lut[ids] = NONE
            hit = np.flatnonzero(rk != NONE)
            if len(hit) == 0:
                continue
            pos, rk = pos[hit], rk[hit]
            order = np.argsort(rk, kind="stable")  # uint16: a radix sort
            pos, rk = pos[order], rk[order]
            bounds = np.flatnonzero(np.concatenate(([True], rk[1:] != rk[:-1]))).tolist() + [len(rk)]
            for j, rr in enumerate(rk[bounds[:-1]].tolist()):
                _put(index, pending, rr, pos[bounds[j]:bounds[j + 1]])
    return seq


def _put(index: dict, pending: list, r: int, p: np.ndarray) -> None:
    """Add sorted positions p under rank r and queue r."""
    old = index.get(r)
    if old is None:
        index[r] = p
        heapq.heappush(pending, r)
    else:  # only when the input already held merged ids
        index[r] = np.union1d(old, p)


def _add_to_index(index: dict, pending: list, pos: np.ndarray, ranks: np.ndarray) -> None:
    """Record sorted positions pos under their ranks (skipping -1) and queue each new rank."""
    keep = ranks >= 0
    if not keep.any():
        return
    pos, ranks = pos[keep], ranks[keep]
    order = np.argsort(ranks, kind="stable")
    pos, ranks = pos[order], ranks[order]
    bounds = np.flatnonzero(np.concatenate(([True], ranks[1:] != ranks[:-1]))).tolist() + [len(ranks)]
    for j, r in enumerate(ranks[bounds[:-1]].tolist()):
        _put(index, pending, r, pos[bounds[j]:bounds[j + 1]])


def encode_bytes(data: bytes, merges, pre_split: str | None = None) -> np.ndarray:
    """bytes -> uint16 ids. pre_split "text" encodes each distinct regex piece once."""
    table = as_table(merges)
    raw = np.frombuffer(bytes(data), dtype=np.uint8)
    if pre_split is None or table.n == 0 or len(raw) < 2:
        return apply_merges(raw, table)
    pieces = pre_split_pieces(bytes(data), pre_split)
    uniq: dict[bytes, int] = {}
    occ = [uniq.setdefault(p, len(uniq)) for p in pieces]
    keys = list(uniq)
    lens = np.fromiter((len(k) for k in keys), dtype=np.int64, count=len(keys))
    seg_ends = np.cumsum(lens)
    seq = LinkedSeq(np.frombuffer(b"".join(keys), dtype=np.uint8), seg_ends)
    ids, ntok = _run(seq, table).live_segment_ids(seg_ends)
    tstart = np.concatenate(([0], np.cumsum(ntok)[:-1]))
    occ = np.asarray(occ, dtype=np.int64)
    return _gather_ranges(ids, tstart[occ], ntok[occ])


def _gather_ranges(src: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate src[starts[i] : starts[i] + lengths[i]] for all i, vectorised."""
    total = int(lengths.sum())
    if total == 0:
        return src[:0].copy()
    out_start = np.cumsum(lengths) - lengths
    idx = np.repeat(starts - out_start, lengths) + np.arange(total)
    return src[idx]


class FlatVocab:
    """Every id's bytes in one array, for vectorised decoding (special ids give no bytes).

    flat uint8[total] all token bytes; off int64[V] offsets; lens int64[V] lengths.
    """

    def __init__(self, vocab: list[bytes]):
        self.flat = np.frombuffer(b"".join(vocab), dtype=np.uint8)
        self.lens = np.fromiter((len(v) for v in vocab), dtype=np.int64, count=len(vocab))
        self.off = np.cumsum(self.lens) - self.lens

    def decode(self, ids) -> bytes:
        """ids -> bytes; an id outside the vocabulary is a TokenizerError."""
        ids = np.asarray(ids, dtype=np.int64)
        V = len(self.lens)
        if len(ids) and (ids.min() < 0 or ids.max() >= V):
            bad = int(ids[(ids < 0) | (ids >= V)][0])
            raise TokenizerError(f"id {bad} is outside the vocabulary of {V} ids")
        return _gather_ranges(self.flat, self.off[ids], self.lens[ids]).tobytes()


def _find_cut(buf: bytes, table: MergeTable, pre_split: str | None, lo: int) -> int:
    """Last safe cut position q in [lo, len(buf)) (bytes before q go out), or -1 if none."""
    x = np.frombuffer(buf, dtype=np.uint8)
    if len(x) < 2 or lo >= len(x):
        return -1
    lo = max(lo, 1)
    left, right = x[lo - 1:-1], x[lo:]
    if pre_split is None:
        ok = ~table.inside()[left, right]
    else:
        letter = ((left | 0x20) >= ord("a")) & ((left | 0x20) <= ord("z"))
        ok = letter & ((right == 0x20) | (right == 0x0A))
    hits = np.flatnonzero(ok)
    return lo + int(hits[-1]) if len(hits) else -1


def encode_chunks(chunks: Iterable[bytes], merges, pre_split: str | None = None,
                  chunk_bytes: int = 8 << 20, max_chunk: int = 16 << 20) -> Iterator[np.ndarray]:
    """Encode a stream of byte chunks (any sizes) as uint16 id arrays, in bounded memory.

    Each piece encoded holds between chunk_bytes // 2 and max_chunk bytes, cut at a safe boundary
    (see the module docstring). The concatenated output decodes to the concatenated input.
    Memory: about 30 bytes per byte of max_chunk (0.5 GB at the default 16 MiB).
    """
    table = as_table(merges)
    if pre_split is not None and pre_split not in PRE_SPLITS:
        raise TokenizerError(f"unknown pre-split {pre_split!r}")
    buf = bytearray()
    for chunk in chunks:
        buf += chunk
        while len(buf) >= chunk_bytes:
            q = _find_cut(bytes(buf[:max_chunk]), table, pre_split, chunk_bytes // 2)
            if q < 0:
                if len(buf) < max_chunk:
                    break  # read more and look again
                q = max_chunk
            yield encode_bytes(bytes(buf[:q]), table, pre_split)
            del buf[:q]
    if buf:
        yield encode_bytes(bytes(buf), table, pre_split)


def encode_file(src: str | BinaryIO, dst: str | BinaryIO, merges, pre_split: str | None = None,
                read_bytes: int = 1 << 20, **kw) -> tuple[int, int]:
    """Encode the raw bytes of src into dst as uint16 little-endian ids; returns (bytes, ids)."""
    table = as_table(merges)
    fin = open(src, "rb") if isinstance(src, (str, bytes)) or hasattr(src, "__fspath__") else src
    fout = open(dst, "wb") if isinstance(dst, (str, bytes)) or hasattr(dst, "__fspath__") else dst
    n_in = n_out = 0
    try:
        def reader():
            nonlocal n_in
            while True:
                b = fin.read(read_bytes)
                if not b:
                    return
                n_in += len(b)
                yield b
        for ids in encode_chunks(reader(), table, pre_split, **kw):
            fout.write(ids.astype("<u2").tobytes())
            n_out += len(ids)
    finally:
        if fin is not src:
            fin.close()
        if fout is not dst:
            fout.close()
    return n_in, n_out


__all__ = ["MergeTable", "FlatVocab", "apply_merges", "encode_bytes", "encode_chunks", "encode_file"]
