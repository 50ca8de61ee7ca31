"""Corpus building and the batch sampler.

A corpus is one token file (uint16, little-endian) in the run directory:
    doc_1 <doc> doc_2 <doc> ... doc_n <doc>
The last `val_fraction` of it is held out for validation (a contiguous tail, so validation text
is never seen in training). The file is memory-mapped, so corpora larger than RAM work.

The sampler is a pure function of (seed, step): a resumed run sees exactly the batches an
uninterrupted one would, with no sampler state to save.

Every corpus a run trains on (this one, and pairs.ExampleCorpus for fine-tuning examples) answers
the same three calls, so the training loop never asks which kind it has:
    sample(batch, context, seed, step) -> x, y (B, T) int64 and a loss mask (B, T) or None
    score(nll, tokenizer, context, max_tokens, batch) -> (bits per byte, its standard error)
    verify(vocab_size, where)                       the files still match the checkpoint's hash
`nll(x, y, m)` is a window scorer: x, y (B, L) int64, m (B, L) 0/1 or None -> (B,) float64, the
summed nats of each window's (counted) targets (bytemodel.ops.scorer.Scorer.nll, which the training
loop passes in: corpus sits below the model in the layers); `batch` windows go to one call.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .atomic import write_atomic
from .jsonguard import loads as json_loads
from .errors import SourceError, named
from .tokenizer import Tokenizer

TOKENS_FILE = "tokens.u16"
CORPUS_FILE = "corpus.json"
LN2 = math.log(2)


@dataclass
class Corpus:
    tokens: np.ndarray   # (n,) uint16 memmap: the whole stream
    split: int           # tokens[:split] train, tokens[split:] validation
    n_bytes: int         # source bytes in the stream (separators excluded)
    n_docs: int
    sha256: str          # of the token file, to check a resumed run reads the same data

    @property
    def train(self) -> np.ndarray:
        return self.tokens[:self.split]

    @property
    def val(self) -> np.ndarray:
        return self.tokens[self.split:]

    def sample(self, batch: int, context: int, seed: int, step: int):
        """Random training windows x, y (B, T); no mask: every target counts. Pure in (seed, step)."""
        x, y = sample_batch(self.train, batch, context, seed, step)
        return x, y, None

    def score(self, nll, tokenizer: Tokenizer, context: int, max_tokens: int, batch: int = 16) -> tuple[float, float]:
        """Bits per byte of the held-out tail and its standard error (score_tokens)."""
        bpb, _, se = score_tokens(nll, self.val, tokenizer, context, max_tokens, batch)
        return bpb, se

    def verify(self, vocab_size: int, where) -> None:
        """Hash the token file again (resume) and check its ids; SourceError if it changed."""
        from .runfiles import verify_tokens
        verify_tokens(self.tokens, self.sha256, vocab_size, where)


def build_corpus(documents, tokenizer: Tokenizer, run_dir: str | os.PathLike,
                 val_fraction: float = 0.1, context: int = 256, pieces=None) -> Corpus:
    """Encode byte documents into run_dir/tokens.u16, one document in memory at a time.

    pieces: instead of documents, an iterable of (bytes, last_piece_of_document), as the readers'
    stream_documents yields; memory is then bounded by the piece size (with merges, by
    encode_chunks' chunk: a document's pieces are encoded as one stream, cut where no merge spans).
    """
    if pieces is None:
        pieces = ((doc, True) for doc in documents)
    run_dir = Path(run_dir)
    h = hashlib.sha256()
    n_tok = n_bytes = n_docs = 0
    n_val = 0
    sep = np.array([tokenizer.doc_id], dtype="<u2").tobytes()

    def write(f):
        nonlocal n_tok, n_bytes, n_docs, n_val
        open_doc = False  # a document has bytes written and no separator yet
        for ids, nb, last in _encoded(pieces, tokenizer):
            if nb or len(ids):
                ids = ids.astype("<u2", copy=False).tobytes()
                f.write(ids)
                h.update(ids)
                n_tok += len(ids) // 2
                n_bytes += nb
                open_doc = True
            if last and open_doc:
                f.write(sep)
                h.update(sep)
                n_tok += 1
                n_docs += 1
                open_doc = False
        if n_bytes == 0:
            raise SourceError("the source holds no data (empty file or files)")
        need = 2 * (context + 1)
        n_val = max(int(n_tok * val_fraction), context + 1)
        if n_tok < need or n_tok - n_val < context + 1:
            raise SourceError(f"too little data: {n_bytes} bytes give {n_tok} tokens, but one training and one "
                              f"validation window of context {context} need at least {max(need, n_val + context + 1)}"
                              f" (try a smaller {named('--context', 'context')})")

    write_atomic(run_dir / TOKENS_FILE, write, error=SourceError)   # a failure leaves no partial file
    info = dict(n_tokens=n_tok, split=n_tok - n_val, n_bytes=n_bytes, n_docs=n_docs, sha256=h.hexdigest())
    write_atomic(run_dir / CORPUS_FILE, json.dumps(info).encode(), error=SourceError)
    return open_corpus(run_dir)


def _encoded(pieces, tokenizer: Tokenizer):
    """(ids, source bytes they came from, last of its document) from (bytes, last) pieces. With
    merges a document's pieces go through encode_chunks (cut only where a merge cannot span), so
    no document is ever held whole: a 10 GiB document costs what one chunk does."""
    if not tokenizer.merges:
        for piece, last in pieces:
            yield (tokenizer.encode(piece) if piece else _NONE), len(piece), last
        return
    it = iter(pieces)
    seen = [0]

    def rest_of(first, last):
        seen[0] += len(first)
        yield first
        while not last:
            try:
                piece, last = next(it)
            except StopIteration:
                return
            seen[0] += len(piece)
            yield piece

    for first, last in it:
        done = seen[0]
        for ids in tokenizer.encode_chunks(rest_of(first, last)):
            yield ids, seen[0] - done, False
            done = seen[0]
        yield _NONE, seen[0] - done, True


_NONE = np.zeros(0, dtype=np.uint16)


def open_corpus(run_dir: str | os.PathLike) -> Corpus:
    run_dir = Path(run_dir)
    from .runfiles import check_corpus_info
    try:
        info = json_loads((run_dir / CORPUS_FILE).read_bytes(), f"corpus.json in {run_dir}", SourceError)
        tokens = np.memmap(run_dir / TOKENS_FILE, dtype="<u2", mode="r")
    except (OSError, ValueError) as e:
        raise SourceError(f"cannot open the corpus in {run_dir}: {e}") from None
    check_corpus_info(info, len(tokens), run_dir)
    return Corpus(tokens, info["split"], info["n_bytes"], info["n_docs"], info["sha256"])


def sample_batch(tokens: np.ndarray, batch: int, context: int, seed: int, step: int, rows: slice | None = None):
    """Random windows: x, y (B, T) int64 with y the next token of x. Pure in (seed, step).

    rows: only these rows of the batch (a rank's share in data parallel), the same windows as
    the whole batch has there.
    """
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(tokens) - context, size=batch)
    if rows is not None:
        starts = starts[rows]
    w = np.stack([np.asarray(tokens[s:s + context + 1]) for s in starts]).astype(np.int64)
    return w[:, :-1], w[:, 1:]


def _picked_windows(tokens: np.ndarray, context: int, max_tokens: int):
    """(start, end) of the non-overlapping windows of targets that eval_windows scores: all of them,
    or max_tokens // context of them evenly spread."""
    n = len(tokens) - 1
    n_win = (n + context - 1) // context
    keep = max(1, min(n_win, max_tokens // context))
    picks = np.linspace(0, n_win - 1, keep).round().astype(int) if keep < n_win else range(n_win)
    for w in picks:
        s = int(w) * context
        yield s, min(n, s + context)


def eval_windows(tokens: np.ndarray, context: int, max_tokens: int):
    """Non-overlapping windows over (at most max_tokens of) the stream, evenly spread.

    Yields (x, y) of shape (1, t) with t <= context; every target is scored exactly once.
    """
    for s, e in _picked_windows(tokens, context, max_tokens):
        chunk = np.asarray(tokens[s:e + 1]).astype(np.int64)
        yield chunk[None, :-1], chunk[None, 1:]


def overlapped_windows(tokens: np.ndarray, context: int, max_tokens: int):
    """The targets eval_windows(tokens, context, max_tokens) scores, each read as `bytemodel score`
    reads a file (decode/score.py: windows overlapping by half), so that every target has at least
    context // 2 tokens before it where the stream has them, not on average half a window.

    Yields (x, y, k): x, y (L,) int64 with L <= context, y[k:] the targets scored; about twice the
    tokens of eval_windows' windows."""
    half = context // 2
    for s, e in _picked_windows(tokens, context, max_tokens):
        start, done = max(0, s - half), s        # the window's first token; targets before done are scored
        while done < e:
            end = min(start + context, e)
            chunk = np.asarray(tokens[start:end + 1]).astype(np.int64)
            yield chunk[:-1], chunk[1:], done - start
            done, start = end, end - half


def score_tokens(nll, tokens: np.ndarray, tokenizer: Tokenizer, context: int, max_tokens: int,
                 batch: int = 16) -> tuple[float, float, float]:
    """(bits per byte, nats per token, standard error of the bits per byte) on non-overlapping
    windows of `tokens` (max_tokens 0: all of them); nll(x, y, None) -> each window's summed nats
    (host, float64), `batch` full windows a call (the short last window alone).
    The standard error takes the windows as the sample (a ratio estimate: sum of bits / sum of
    bytes over windows; nan with fewer than two windows)."""
    win_nll, win_tok, win_bytes = [], [], []
    full_x, full_y = [], []

    def run(xs, ys):
        x, y = np.concatenate(xs), np.concatenate(ys)
        win_nll.extend(np.asarray(nll(x, y, None), dtype=np.float64).reshape(y.shape[0]))
        win_tok.extend([y.shape[1]] * y.shape[0])
        win_bytes.extend(tokenizer.token_lengths[y].sum(axis=1))

    for x, y in eval_windows(tokens, context, max_tokens or len(tokens) + context):   # 0: every window
        if x.shape[1] == context:
            full_x.append(x)
            full_y.append(y)
            if len(full_x) == batch:
                run(full_x, full_y)
                full_x, full_y = [], []
        else:
            run([x], [y])
    if full_x:
        run(full_x, full_y)
    nll, b = np.array(win_nll), np.array(win_bytes, dtype=np.float64)
    bpb = nll.sum() / LN2 / max(b.sum(), 1)
    n = len(nll)
    se = float("nan")
    if n > 1 and b.sum() > 0:   # delta-method variance of a ratio of means
        resid = nll / LN2 - bpb * b
        se = float(np.sqrt((resid ** 2).sum() / (n * (n - 1))) / b.mean())
    return float(bpb), float(nll.sum() / max(sum(win_tok), 1)), se
