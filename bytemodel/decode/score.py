"""Scoring documents: their log-likelihood under a model, in bits and bits per byte.

    score(model, tok, data)                      -> {'bytes', 'tokens', 'bits', 'bits_per_byte'}
    score_documents(model, tok, docs)            the same over documents (each from its <doc>)
    score_stream(model, tok, pieces)             over (bytes, last_piece_of_document) pieces, as
                                                 readers.stream_documents gives them
    score_windows(model, tok, windows)           over (x, y, k) windows: a run's held-out tail

The window policy: each document is <doc> followed by its ids; windows of the model's context
overlap by half, each target is scored once, with at least context/2 tokens of history after the
first window (the windows start at 0, T/2, T, ...; the last may be short). Windows from any
number of documents are gathered into batches and scored by bytemodel.ops.scorer.Scorer (on the
device: float32 log-softmax, float64 sums, only the sums come back). Memory is bounded whatever
the input's size: a document's ids are read in pieces (tokenizer.encode_chunks) and only a
batch of windows is held.

`reference_score` is the path this replaced (one window at a time, the whole logits to the host,
a float64 log-softmax there): the oracle the tests hold the batched path to (within 1e-4 bits
a byte).
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError
from ..ops import numpy_ops
from ..ops.scorer import Scorer

LN2 = math.log(2)


def doc_windows(id_pieces, T: int):
    """Ids of one document in pieces (the first starting with <doc>) -> windows (x, y, k): x, y
    (L,) int64 with L <= T, and y[k:] the targets this window scores. Holds O(T + a piece)."""
    half = T // 2
    buf, base = np.zeros(0, np.int64), 0       # buf holds ids[base:]
    pieces, more = iter(id_pieces), True
    start = done = 0                            # window start; targets before `done` are scored
    while True:
        while more and base + len(buf) < start + T + 2:   # enough to know whether the window is the last
            nxt = next(pieces, None)
            if nxt is None:
                more = False
            else:
                buf = np.concatenate([buf[start - base:], np.asarray(nxt, dtype=np.int64)])
                base = start
        n = base + len(buf) - 1                 # targets: ids[1:]
        if done >= n:
            return
        end = min(start + T, n)
        seg = buf[start - base:end + 1 - base]
        yield seg[:-1], seg[1:], done - start
        done = end
        start = end - half


def _documents(pieces):
    """(bytes, last) pieces -> one iterator of bytes per document (consumed in order)."""
    it = iter(pieces)
    while True:
        first = next(it, None)
        if first is None:
            return

        def one(first=first):
            piece, last = first
            yield piece
            while not last:
                nxt = next(it, None)
                if nxt is None:
                    return
                piece, last = nxt
                yield piece
        doc = one()
        yield doc
        for _ in doc:   # whatever the consumer left of this document
            pass


class _Tally:
    """Batches of windows -> the scorer; sums of nats, tokens."""

    def __init__(self, scorer: Scorer):
        self.s, self.rows, self.nats, self.tokens = scorer, [], 0.0, 0

    def add(self, x, y, k):
        self.rows.append((x, y, k))
        if len(self.rows) == self.s.batch:
            self.flush()

    def flush(self):
        if not self.rows:
            return
        L = max(len(x) for x, _, _ in self.rows)
        B = len(self.rows)
        X = np.zeros((B, L), np.int64)
        Y = np.zeros((B, L), np.int64)
        M = np.zeros((B, L), np.uint8)
        for i, (x, y, k) in enumerate(self.rows):
            X[i, :len(x)], Y[i, :len(y)], M[i, k:len(y)] = x, y, 1
            self.tokens += len(y) - k
        self.nats += float(self.s.nll(X, Y, M).sum())
        self.rows = []


def score_stream(model, tokenizer, pieces, workers: int | None = None) -> dict:
    """Score the documents of (bytes, last) pieces; empty documents count for nothing.
    Returns {'bytes', 'tokens', 'bits', 'bits_per_byte', 'documents'} (bytes 0 and bits_per_byte
    NaN when there was nothing to score: the caller says so)."""
    T = model.cfg.context
    tally = _Tally(Scorer(model, tokenizer.vocab_size, workers))
    n_bytes = n_docs = 0
    for doc in _documents(pieces):
        seen = [0]

        def counted(doc=doc):
            for p in doc:
                seen[0] += len(p)
                if p:
                    yield bytes(p)

        def ids():
            yield np.array([tokenizer.doc_id], np.int64)
            yield from tokenizer.encode_chunks(counted())
        for x, y, k in doc_windows(ids(), T):
            tally.add(x, y, k)
        if seen[0]:
            n_docs += 1
            n_bytes += seen[0]
    tally.flush()
    bits = tally.nats / LN2
    return {"bytes": n_bytes, "tokens": tally.tokens, "bits": bits,
            "bits_per_byte": bits / n_bytes if n_bytes else float("nan"), "documents": n_docs}


def score_windows(model, tokenizer, windows, workers: int | None = None) -> dict:
    """Score (x, y, k) windows (y[k:] the targets; corpus.overlapped_windows gives a run's held-out
    tail so) in shared batches: {'bytes', 'tokens', 'bits', 'bits_per_byte'}, bytes those of the
    scored targets (tokenizer.token_lengths; a document separator has none)."""
    tally = _Tally(Scorer(model, tokenizer.vocab_size, workers))
    n_bytes = 0
    for x, y, k in windows:
        tally.add(x, y, k)
        n_bytes += int(tokenizer.token_lengths[y[k:]].sum())
    tally.flush()
    bits = tally.nats / LN2
    return {"bytes": n_bytes, "tokens": tally.tokens, "bits": bits,
            "bits_per_byte": bits / n_bytes if n_bytes else float("nan")}


def score_documents(model, tokenizer, docs, workers: int | None = None) -> dict:
    """Score each document of `docs` (bytes) from its <doc>, all in shared batches."""
    return score_stream(model, tokenizer, ((bytes(d), True) for d in docs), workers)


def score(model, tokenizer, data: bytes, workers: int | None = None) -> dict:
    """Log-likelihood of `data` as a new document: {'bytes', 'tokens', 'bits', 'bits_per_byte'}."""
    if not data:
        raise ConfigError("nothing to score: the data is empty")
    r = score_documents(model, tokenizer, [data], workers)
    r.pop("documents")
    return r


def reference_score(model, tokenizer, data: bytes) -> dict:
    """The float64 host path (one window at a time): the oracle for `score`."""
    if not data:
        raise ConfigError("nothing to score: the data is empty")
    ops, T = model.ops, model.cfg.context
    V = tokenizer.vocab_size
    ids = np.concatenate([[tokenizer.doc_id], tokenizer.encode(data)]).astype(np.int64)
    n = len(ids) - 1  # targets ids[1:]
    nll = 0.0
    start, done = 0, 0  # window start; targets before `done` are scored already
    while done < n:
        end = min(start + T, n)
        x, y = ids[start:end], ids[start + 1:end + 1]
        logits = ops.to_numpy(model.forward_cached(ops.asarray(x[None]), model.new_cache(1, len(x)), 0))[0]
        lp = numpy_ops.log_softmax(logits[:, :V].astype(np.float64))
        k = done - start
        nll -= lp[np.arange(k, len(y)), y[k:]].sum()
        done = end
        start = max(end - T // 2, 0) if end < n else end
    bits = nll / LN2
    return {"bytes": len(data), "tokens": n, "bits": bits, "bits_per_byte": bits / len(data)}
