"""Learning byte-pair merges from any bytes (text, DNA, binaries).

Algorithm (the classic incremental one, vectorised per merge):
1. Take a sample of at most max_sample_bytes (see sample_segments), optionally pre-split into
   pieces by a regex (pre_split="text"); identical segments are stored once with a weight.
2. Count every adjacent pair once (np.bincount over uint16 codes a << 8 | b) and index the
   positions of each pair (one radix argsort).
3. Repeat M times: pop the best pair from a heap, merge all of its occurrences with NumPy
   (bytemodel.tokenizer.seq.LinkedSeq.find / apply), subtract the windows the merge destroyed from
   their pairs' counts (one ufunc.at over per-position count slots) and count the new windows
   (np.bincount over the neighbours' ids). Python work per merge is per new pair, not per byte.

Counts are of adjacent windows, overlapping ones included (a a a holds (a, a) twice), weighted by
how often the segment occurs. The merge applied is leftmost-first without overlap, exactly what
encoding does, so encoding the sample reproduces the training segmentation.

Tie-break rule: the highest count wins; among equal counts the smallest pair (a, b), compared as
(a, then b) on ids, wins. (The same rule as HuggingFace tokenizers' BPE trainer with the byte
alphabet in byte order.)
"""
from __future__ import annotations

import heapq
import itertools
from collections import Counter
from typing import Iterable

import numpy as np

from ..errors import TokenizerError
from .pretok import PRE_SPLITS, pre_split_pieces
from .seq import DEAD, SHIFT, LinkedSeq
from .vocab import MAX_VOCAB, SPECIALS

DEFAULT_MAX_SAMPLE_BYTES = 16 << 20  # 16 MiB: ~1 GB peak while training (~60 bytes per sample byte)
SAMPLE_BLOCK = 1 << 16  # sampling unit: 64 KiB slices of big documents, or packs of small ones
READ_FACTOR = 64        # the sample is drawn from at most this many times its size of the source (16 MiB
                        # -> the first GiB): a 7.5 KB .bz2 of 10 GiB is not decompressed to the end


def sample_segments(data, max_bytes: int, seed: int = 0) -> list[bytes]:
    """A deterministic sample of at most max_bytes from bytes or an iterable of byte documents.

    Documents are cut into units of at most SAMPLE_BLOCK bytes: a big document into consecutive
    slices, small consecutive documents packed together (each stays its own segment). If all
    units fit, everything is kept; otherwise reservoir sampling (Algorithm R, NumPy generator
    seeded with `seed`) keeps max_bytes // SAMPLE_BLOCK units, returned in input order, with
    consecutive kept slices of one document joined again (so a source that fits comes back as its
    documents). ``data`` may also be stream_documents' (piece, last) pairs: memory is then the
    sample plus one block, whatever a document's size (else the largest document). At most
    READ_FACTOR times max_bytes of the source is read.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = [bytes(data)]
    if isinstance(data, (list, tuple)) and data and isinstance(data[0], tuple):
        data = iter(data)
    if isinstance(data, (list, tuple)) and sum(map(len, data)) <= max_bytes:  # it all fits
        return [d if isinstance(d, bytes) else bytes(d) for d in data if len(d)]
    cap = max(1, max_bytes // SAMPLE_BLOCK) if max_bytes >= SAMPLE_BLOCK else 1
    block = min(SAMPLE_BLOCK, max(1, max_bytes))
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise TokenizerError(f"seed must be a non-negative integer, got {seed!r}")
    rng = np.random.default_rng(seed)
    kept: list[tuple[int, list[tuple[int, int, bytes]]]] = []
    n_units = 0

    it = iter(data)
    first = next(it, None)
    streamed = isinstance(first, tuple)      # (piece, last piece of its document): stream_documents
    items = itertools.chain([] if first is None else [first], it)
    budget = {"left": READ_FACTOR * max(max_bytes, 1)}   # what is read at all, not just what is kept

    def docs_of_pieces():
        """(document number, its bytes if small, else None and its slices) from streamed pieces,
        holding at most one block of a document at a time."""
        k, cur, j = 0, b"", 0
        for piece, last in items:
            cur += bytes(piece)
            while len(cur) > block or (len(cur) == block and not last):
                yield k, None, [(j, cur[:block])]
                cur, j = cur[block:], j + 1
            if last:
                if j or len(cur) >= block:      # a big document's last slice
                    if cur:
                        yield k, None, [(j, cur)]
                elif cur:
                    yield k, cur, None
                k, cur, j = k + 1, b"", 0
        if cur:
            yield k, (None if j else cur), ([(j, cur)] if j else None)

    def docs_whole():
        for k, doc in enumerate(items):
            doc = bytes(doc)
            if len(doc) >= block:
                yield k, None, [(j, doc[i:i + block]) for j, i in enumerate(range(0, len(doc), block))]
            elif doc:
                yield k, doc, None

    def units():  # each unit: list of (document number, slice number, bytes)
        pack: list[tuple[int, int, bytes]] = []
        size = 0
        for k, small, slices in (docs_of_pieces() if streamed else docs_whole()):
            if budget["left"] <= 0:
                break
            if slices is not None:
                for j, piece in slices:
                    if budget["left"] <= 0:
                        break
                    budget["left"] -= len(piece)
                    yield [(k, j, piece)]
                continue
            budget["left"] -= len(small)
            if size + len(small) > block:
                yield pack
                pack, size = [], 0
            pack.append((k, 0, small))
            size += len(small)
        if pack:
            yield pack

    for unit in units():
        if len(kept) < cap:
            kept.append((n_units, unit))
        else:
            j = int(rng.integers(0, n_units + 1))
            if j < cap:
                kept[j] = (n_units, unit)
        n_units += 1
    kept.sort(key=lambda x: x[0])
    # consecutive slices of one document that were both kept are joined again
    out: list[bytes] = []
    last = (-1, -1)
    for _, unit in kept:
        for k, j, piece in unit:
            if (k, j - 1) == last:
                out[-1] += piece
            else:
                out.append(piece)
            last = (k, j)
    return out


def train_bpe(
    data: bytes | Iterable[bytes],
    n_merges: int,
    *,
    pre_split: str | None = None,
    max_sample_bytes: int = DEFAULT_MAX_SAMPLE_BYTES,
    seed: int = 0,
) -> list[tuple[int, int]]:
    """Learn n_merges merges; merge i turns the pair (a, b) into id 256 + i.

    data: bytes, or an iterable of byte documents (no pair crosses a document boundary).
    pre_split: None (default: no splitting, for any data) or "text" (TEXT_PATTERN).
    Raises TokenizerError if n_merges is out of range or the data cannot supply that many
    merges (no pair occurs twice any more).
    """
    n_merges = int(n_merges)
    if n_merges < 0:
        raise TokenizerError(f"number of merges must be >= 0, got {n_merges}")
    max_merges = MAX_VOCAB - 256 - len(SPECIALS)
    if n_merges > max_merges:
        raise TokenizerError(f"{n_merges} merges exceed the uint16 vocabulary; at most {max_merges}")
    if pre_split is not None and pre_split not in PRE_SPLITS:
        raise TokenizerError(f"unknown pre-split {pre_split!r}; known: {', '.join(PRE_SPLITS)}")
    segs = sample_segments(data, max_sample_bytes, seed)
    if not segs:
        raise TokenizerError("no data to learn merges from (empty source)")
    if n_merges == 0:
        return []
    if pre_split is None:
        counter: Counter[bytes] = Counter(segs)
    else:
        counter = Counter()
        for s in segs:
            counter.update(pre_split_pieces(s, pre_split))
    del segs
    return _learn(list(counter.keys()), list(counter.values()), n_merges)


def _learn(pieces: list[bytes], weights: list[int], n_merges: int) -> list[tuple[int, int]]:
    """The merge loop over distinct pieces with integer weights (see the module docstring)."""
    lens = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    seg_ends = np.cumsum(lens)
    ids = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    w_seg = np.asarray(weights, dtype=np.int64)
    uniform = bool((w_seg == 1).all())
    wpos = None if uniform else np.repeat(w_seg, lens)  # int64[N] weight of each position
    del pieces
    seq = LinkedSeq(ids, seg_ends)
    if seq.n < 2:
        raise TokenizerError("the sample has fewer than 2 bytes; no merge can be learned")

    # initial windows: counts, and positions grouped by code16 = a << 8 | b (radix argsort)
    c16 = seq.byte_pair_codes16()
    init_pos = np.argsort(c16, kind="stable")  # includes cross-segment pairs
    init_off = np.concatenate(([0], np.cumsum(np.bincount(c16, minlength=1 << 16))))
    # counts of real windows only: drop the pairs that straddle a segment boundary
    real = seq.nxt[:seq.n - 1] == np.arange(1, seq.n)
    w = None if uniform else wpos[:-1][real]
    counts16 = np.bincount(c16[real], weights=w, minlength=1 << 16)  # float64 sums: exact below 2**53
    counts16 = counts16.astype(np.int64)
    # Exact counts per "slot": slot 1 + code16 for byte pairs, then one new slot per pair made by
    # a merge (if it occurs at least twice: pairs below 2 can never rise, so they are not kept).
    # slot_at[p] is the slot of the window starting at p (0: untracked), so the windows a merge
    # destroys are subtracted from their counts without any per-pair Python work.
    slot_at = np.zeros(seq.n + 1, dtype=np.intp)
    slot_at[:seq.n - 1][real] = c16[real].astype(np.intp) + 1
    cnt = np.zeros(max(1 << 17, 4 * n_merges + (1 << 16)), dtype=np.int64)
    cnt[1:(1 << 16) + 1] = counts16
    n_slots = (1 << 16) + 1
    del c16, real, w
    slot_of: dict[int, int] = {}  # code (with an id >= 256) -> slot
    # heap of (-count, a, b), lazily refreshed: an entry whose count is no longer exact is
    # pushed back with the exact one (counts only fall after their push)
    heap: list[tuple[int, int, int]] = []
    for code in np.flatnonzero(counts16 >= 2).tolist():
        heap.append((-int(counts16[code]), code >> 8, code & 0xFF))
    heapq.heapify(heap)
    index: dict[int, np.ndarray] = {}  # code -> sorted candidate positions (may be stale)
    tok = seq.tok

    merges: list[tuple[int, int]] = []
    while len(merges) < n_merges:
        while heap:
            negc, a, b = heapq.heappop(heap)
            code = (a << SHIFT) | b
            slot = ((a << 8) | b) + 1 if a < 256 and b < 256 else slot_of[code]
            cur = int(cnt[slot])
            if cur == -negc:
                break
            if cur >= 2:
                heapq.heappush(heap, (-cur, a, b))
            else:
                index.pop(code, None)
        else:
            k = len(merges)
            raise TokenizerError(
                f"the data supports only {k} merges (no pair occurs twice after merge {k}); "
                f"asked for {n_merges}: use fewer merges or more data")
        t = 256 + len(merges)
        merges.append((a, b))
        cands = index.pop(code, None)
        if cands is None:  # only byte pairs start outside the index
            c = (a << 8) | b
            cands = init_pos[init_off[c]:init_off[c + 1]]
        P, Q = seq.find(cands, a, b)
        L, R = seq.apply(P, Q, t)
        # destroyed windows: (x, a) at L and (b, y) at Q, where x, y are live (not DEAD)
        x = tok[L]
        lm = x != DEAD
        y = tok[R]
        rm = y != DEAD
        gone = np.concatenate([slot_at[L[lm]], slot_at[Q[rm]]])
        if uniform:
            np.subtract.at(cnt, gone, 1)
        else:
            wP = wpos[P]
            np.subtract.at(cnt, gone, np.concatenate([wP[lm], wP[rm]]))
        cnt[slot] = 0
        cnt[0] = 0
        # new windows: (x, t) at L and (t, y) at P (y == t where R is itself a merged position)
        for pos, other, left in ((L[lm], x[lm], True), (P[rm], y[rm], False)):
            if len(pos) == 0:
                continue
            w = None if uniform else wpos[pos]
            hist = np.bincount(other, weights=w, minlength=t + 1)
            keep = hist[other] >= 2
            slot_at[pos] = 0
            if not keep.any():
                continue
            pos, other = pos[keep], other[keep]
            order = np.argsort(other, kind="stable")
            pos, other = pos[order], other[order]
            starts = np.flatnonzero(np.concatenate(([True], other[1:] != other[:-1])))
            g = len(starts)
            if n_slots + g > len(cnt):
                cnt = np.concatenate([cnt, np.zeros(max(len(cnt), g), dtype=np.int64)])
            us = other[starts]
            cnt[n_slots:n_slots + g] = hist[us]
            slot_at[pos] = np.repeat(np.arange(n_slots, n_slots + g), np.diff(np.append(starts, len(other))))
            bounds = starts.tolist() + [len(other)]
            for j, u in enumerate(us.tolist()):
                c = int(hist[u])
                k = (u << SHIFT) | t if left else (t << SHIFT) | u
                slot_of[k] = n_slots + j
                index[k] = pos[bounds[j]:bounds[j + 1]]
                heapq.heappush(heap, (-c, u, t) if left else (-c, t, u))
            n_slots += g
    return merges
