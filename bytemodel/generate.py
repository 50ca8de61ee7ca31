"""Generation with a KV cache, and scoring bytes under a model.

Sampling: logits divided by the temperature, then top-k, then top-p (nucleus), then one draw from a NumPy
Generator seeded by `seed`: the same seed gives the same bytes. Temperature 0 is greedy.

When the cache is full (context tokens), the last context/2 tokens are re-read into a fresh cache
(positions restart at 0), so the model always sees windows like those it was trained on.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import ConfigError
from .sampling import sample_next, sampling_probs  # noqa: F401  (part of this module's API)
from .model import Model
from .ops import numpy_ops
from .speculative import speculative_ids
from .tokenizer import Tokenizer

LN2 = math.log(2)


def _check_sampling(temperature, top_k, top_p):
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    if top_k < 0:
        raise ConfigError(f"top-k must be >= 0 (0 = off), got {top_k}")
    if not 0 < top_p <= 1:
        raise ConfigError(f"top-p must be in (0, 1], got {top_p}")


def plain_ids(model: Model, history: list, rng: np.random.Generator, temperature=1.0, top_k=0,
              top_p=1.0, vocab: int | None = None):
    """Yields ids sampled after `history` one at a time: one cached forward per token.

    When the cache is full, the recent half of the history is re-read into a fresh cache."""
    ops, T = model.ops, model.cfg.context
    V = vocab or model.cfg.vocab_size
    W = model.weights()  # once per call, not per token (a cast copy on some backends)
    history = list(history)

    def prefill(ids):
        cache = model.new_cache(1, T)
        logits = model.forward_cached(ops.asarray(np.array([ids], dtype=np.int64)), cache, 0, W)
        return cache, len(ids), ops.to_numpy(logits[0, -1, :V]).astype(np.float64)

    cache, pos, logits = prefill(history[-(T // 2 if len(history) > T else T):])
    while True:
        nxt = sample_next(logits, rng, temperature, top_k, top_p)
        history.append(nxt)
        yield nxt
        if pos >= T:  # cache full: re-read the recent half into a fresh cache
            cache, pos, logits = prefill(history[-(T // 2):])
            continue
        lg = model.forward_cached(ops.asarray(np.array([[nxt]], dtype=np.int64)), cache, pos, W)
        pos += 1
        logits = ops.to_numpy(lg[0, -1, :V]).astype(np.float64)


def generate(model: Model, tokenizer: Tokenizer, n_bytes: int, prompt: bytes = b"", temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop_at_doc_end: bool = False,
             on_bytes=None, speculative: bool = False, stats=None) -> bytes:
    """Sample until n_bytes bytes are produced (or a document ends, if asked). Returns the bytes.

    The prompt is not included in the output. An empty prompt starts a new document.
    on_bytes(chunk) is called with each produced chunk (for streaming output).
    speculative: draft with the model's multi-token heads and verify in blocks (speculative.py);
    the same distribution as plain sampling, fewer forward passes. stats: a SpecStats to fill.
    """
    if n_bytes < 0:
        raise ConfigError(f"bytes must be >= 0, got {n_bytes}")
    _check_sampling(temperature, top_k, top_p)
    rng = np.random.default_rng(seed)
    history = [tokenizer.doc_id] + [int(i) for i in tokenizer.encode(prompt)]
    out = bytearray()
    if n_bytes == 0:
        return b""
    if speculative:
        ids = speculative_ids(model, history, rng, temperature, top_k, top_p, stats, tokenizer.vocab_size)
    else:
        ids = plain_ids(model, history, rng, temperature, top_k, top_p, tokenizer.vocab_size)
    for nxt in ids:
        if nxt == tokenizer.doc_id and stop_at_doc_end:
            break
        chunk = tokenizer.vocab[nxt][: n_bytes - len(out)]
        out += chunk
        if on_bytes is not None and chunk:
            on_bytes(chunk)
        if len(out) >= n_bytes:
            break
    return bytes(out)


def score(model: Model, tokenizer: Tokenizer, data: bytes) -> dict:
    """Log-likelihood of `data` as a new document: total bits and bits per byte.

    Long inputs are scored in windows of the model's context that overlap by half, each token
    scored once, with at least context/2 tokens of history after the first window.
    """
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
        lp = numpy_ops.log_softmax(logits[:, :V].astype(np.float64))   # on the host, float64
        k = done - start
        nll -= lp[np.arange(k, len(y)), y[k:]].sum()
        done = end
        start = max(end - T // 2, 0) if end < n else end
    bits = nll / LN2
    return {"bytes": len(data), "tokens": n, "bits": bits, "bits_per_byte": bits / len(data)}
