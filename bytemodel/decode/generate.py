"""Generation with a KV cache (scoring bytes under a model: decode/score.py).

Sampling: logits divided by the temperature, then top-k, then top-p (nucleus), then one draw from a NumPy
Generator seeded by `seed`: the same seed gives the same bytes. Temperature 0 is greedy.

When the cache is full (context tokens), the last context/2 tokens are re-read into a fresh cache
(positions restart at 0), so the model always sees windows like those it was trained on.

Several samples (samples=N) run as one batch: the prompt is read once and its cache copied to
every sample; sample i draws from np.random.default_rng(seed + i). On the GPU the step runs on
the device (ops/cuda_decode.py: sampling there too, a CUDA graph per step); the host only reads
the sampled ids, in chunks. One sample on the CPU steps through decode/cpu_step.py (the cached
forward's arithmetic for one token, bit for bit, in fewer NumPy calls: the same bytes).

allowed (V,) bool: the ids that may be drawn (the run's byte set, runinfo.RunData.allowed_ids);
the others get logit -inf before temperature, top-k and top-p, and so does <doc> unless generation
stops at a document's end (it gives no bytes, and under a mask it could win every draw; greedy
would then loop). On the GPU the device's sampler applies the mask (the same -inf logits).
"""
from __future__ import annotations

import math
from contextlib import closing

import numpy as np

from ..errors import ConfigError
from ..sampling import rng_words, sample_next
from ..validation import number, whole
from ..model import Model
from . import window
from .cpu_pair import Pair
from .cpu_step import BlasThreads, OneBlasThread, OneToken, pair_for
from .score import score  # noqa: F401  (scoring lives in decode/score.py; kept importable here)
from .speculative import speculative_ids
from ..tokenizer import Tokenizer

ONE_TOKEN_STEP = True   # one sample on the CPU: decode/cpu_step.OneToken (False: Model.forward_cached)
PAIR_STEP = False       # True: its large products on two threads when that is faster (decode/cpu_pair.py);
                        # off: on the 2-core VM it never won (benchmarks/README.md, fourth session)
TWO_BLAS_STEP = True    # the step's products at two BLAS threads when that times faster (cpu_step.BlasThreads;
                        # small on an idle 2-core VM: +3-14% in 4 runs of 5, the same bytes); prefills at one


def _check_sampling(temperature, top_k, top_p):
    for name, v, is_whole in (("temperature", temperature, False), ("top-k", top_k, True), ("top-p", top_p, False)):
        if not (whole(v) if is_whole else number(v)):
            # a str or None was a TypeError from a comparison; top_k=2.5 one from np.argpartition
            raise ConfigError(f"{name} must be a {'whole number' if is_whole else 'number'}, got {v!r}")
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    if top_k < 0:
        raise ConfigError(f"top-k must be >= 0 (0 = off), got {top_k}")
    if not 0 < top_p <= 1:
        raise ConfigError(f"top-p must be in (0, 1], got {top_p}")


class KeptCache:
    """A KV cache kept from one plain_ids call to the next (chat: one per conversation) and the ids
    whose keys and values its rows 0 .. len(ids) - 1 hold. A call whose history starts with some of
    them reads only the rest (each reply would otherwise read the whole conversation again)."""

    def __init__(self):
        self.cache, self.ids = None, []

    def common(self, ids: list) -> int:
        """How many leading ids of `ids` the cache holds (at most len(ids) - 1: one is read anew,
        for the logits after it)."""
        n = min(len(self.ids), len(ids) - 1)
        for i in range(n):
            if self.ids[i] != ids[i]:
                return i
        return max(n, 0)


def plain_ids(model: Model, history: list, rng: np.random.Generator, temperature=1.0, top_k=0,
              top_p=1.0, vocab: int | None = None, bias=None, pair: bool = False, blas_libs=(),
              kept: KeptCache | None = None):
    """Yields ids sampled after `history` one at a time: one cached forward per token.

    When the cache is full, the recent half of the history is re-read into a fresh cache.
    kept: a KeptCache the first read starts from where its ids are a prefix of the history (the
    rest read at their positions; the figures then differ from a whole read by float rounding
    only), and which is left holding what this call read and fed.
    bias (V,) float64: added to the logits (0, or -inf for an id that may not be drawn).
    pair: the caller holds BLAS to one thread (cpu_step.OneBlasThread): the CPU step may run its
    large products on two threads (cpu_step.pair_for; the same bits). blas_libs: that hold's
    BLAS libraries, whose thread count the step may raise to two while it runs (BlasThreads;
    the same bits), every prefill back at one."""
    ops, T = model.ops, model.cfg.context
    V = vocab or model.cfg.vocab_size
    W = model.weights()  # once per call, not per token (a cast copy on some backends)
    history = list(history)
    from ..ops import numpy_ops
    step = None
    if ONE_TOKEN_STEP and ops is numpy_ops and isinstance(model, Model):
        two = pair and pair_for(model.cfg)
        threads = BlasThreads(blas_libs) if two and TWO_BLAS_STEP and not PAIR_STEP and blas_libs else None
        step = OneToken(model, None, W, Pair() if two and PAIR_STEP else None, threads)

    def prefill(ids, reuse=False):
        if step is not None and step.threads is not None:
            step.threads.one()      # a prefill's products split by thread count: at one, as held
        c = kept.common(ids) if reuse and kept is not None and kept.cache is not None else 0
        if c:
            cache = kept.cache
            del kept.ids[c:]        # rows c.. are rewritten now: held by nothing until this read ends
        else:
            cache = model.new_cache(1, T)
        logits = model.forward_cached(ops.asarray(np.array([ids[c:]], dtype=np.int64)), cache, c, W)
        if kept is not None:
            kept.cache, kept.ids = cache, list(ids)
        return cache, len(ids), masked(logits[0, -1, :V])

    def masked(row):
        z = ops.to_numpy(row).astype(np.float64)
        return z if bias is None else z + bias

    try:
        cache, pos, logits = prefill(window.start(history, T), reuse=True)
        while True:
            nxt = sample_next(logits, rng, temperature, top_k, top_p)
            history.append(nxt)
            yield nxt
            if pos >= T:  # cache full: re-read the recent half into a fresh cache
                cache, pos, logits = prefill(window.reread(history, T))
                continue
            if step is not None:
                if step.cache is not cache:     # a new one after each prefill (the setter makes its views)
                    step.cache = cache
                row = step(nxt, pos)
            else:
                row = model.forward_cached(ops.asarray(np.array([[nxt]], dtype=np.int64)), cache, pos, W)[0, -1]
            pos += 1
            if kept is not None:
                kept.ids.append(nxt)
            logits = masked(row[:V])
    finally:
        if step is not None:
            step.close()    # the pair's helper thread, if any


def on_device(model: Model, vocab: int):
    """The on-device decoder's module (ops/cuda_decode.py) when the model's backend has one whose
    kernels take this model and vocabulary (a GPU), else None: generation, chat and the CLI ask here."""
    from ..ops import device_decoder
    dec = device_decoder(model.ops)
    return dec if dec is not None and dec.supports(model.cfg, vocab) is None else None


def _prefill(d, model: Model, rows: list, W) -> int:
    """Read rows (one prompt per sequence of the on-device decoder d, or one prompt for all of them:
    run once, its cache copied to every sequence) into d's cache with the backend's cached forward,
    and start a segment from their last logits. -> the cache position (the prompt's length)."""
    ids = model.ops.asarray(np.array(rows, dtype=np.int64))
    if len(rows) == d.B:
        lg = d.run_prefill(lambda: model.forward_cached(ids, d.cache, 0, W))
    else:
        def one():
            c1 = model.new_cache(1, model.cfg.context)
            out = model.forward_cached(ids, c1, 0, W)
            for (kb, vb), (k1, v1) in zip(d.cache, c1):
                kb[...] = k1
                vb[...] = v1
            return out
        lg = d.run_prefill(one)
    d.begin(lg[:, -1, :], len(rows[0]), W)
    return len(rows[0])


def _chunk(d, t: int, pos: int, k: int):
    """One chunk of the on-device decoder d: k steps from the cache position pos, or with the cache
    full (k <= 0) one more id from the last logits, not fed (the caller then re-reads the window).
    -> (the ids sampled, (B, n) from column t; n; the position after; whether the cache was full)."""
    full = k <= 0
    if full:
        d.sample_only()
        k = 1
    else:
        d.step(k)
        pos += k
    return d.tokens(t, t + k), k, pos, full


def device_ids(dec, model: Model, history: list, rng: np.random.Generator, temperature=1.0, top_k=0, top_p=1.0,
               vocab: int | None = None, allowed=None, max_chunk: int = 64):
    """plain_ids on the on-device decoder (dec: ops.device_decoder's module), one sequence: yields ids
    sampled after `history`, drawn from rng's own PCG64 stream (the device's sampler goes on from
    where rng stands), with plain_ids' window rule, so where the logits agree (fp32) the ids are
    plain_ids'. The decoder samples ahead in chunks (8, doubling up to max_chunk); when the caller
    stops after k ids, rng is left where k draws on the host leave it (greedy draws nothing).
    allowed: None, or bool (V,), the ids that may be drawn."""
    T = model.cfg.context
    V = vocab or model.cfg.vocab_size
    W = model.weights()
    start = rng.bit_generator.state
    d = dec.Decoder(model, 1, V, 0, temperature, top_k, top_p, allowed=allowed, streams=rng_words(rng)[None])
    history, drawn = list(history), 0
    try:
        pos = _prefill(d, model, [window.start(history, T)], W)
        t, chunk = 0, 8
        while True:
            toks, k, pos, full = _chunk(d, t, pos, min(chunk, T - pos))
            t += k
            chunk = min(2 * chunk, max_chunk)
            for j in range(k):
                nxt = int(toks[0, j])
                history.append(nxt)
                drawn += 1
                yield nxt
            if full:
                pos = _prefill(d, model, [window.reread(history, T)], W)
                t = 0
    finally:
        rng.bit_generator.state = start
        if temperature != 0 and drawn:
            rng.random(drawn)


# draws in a row that give no bytes (<doc> when not stopping there, a chat special) after which a
# sample ends short: a model whose likeliest id is always <doc> would otherwise loop for ever
# (greedy on a barely trained model does). A real stream has a byte-giving id far sooner.
MAX_EMPTY_DRAWS = 256


class _Outputs:
    """Per-sample bytes, fed histories and the stop rules, shared by the host and device loops."""

    def __init__(self, tokenizer, n: int, n_bytes: int, history: list[int], stop_at_doc_end: bool, on_bytes):
        self.tok, self.n_bytes, self.stop, self.on_bytes = tokenizer, n_bytes, stop_at_doc_end, on_bytes
        self.out = [bytearray() for _ in range(n)]
        self.hist = [list(history) for _ in range(n)]   # every id fed to the model, per sample
        self.done = [n_bytes == 0] * n
        self.empty = [0] * n                            # draws in a row that gave no bytes

    def take(self, i: int, tok: int) -> None:
        self.hist[i].append(tok)
        if self.done[i]:
            return
        if tok == self.tok.doc_id and self.stop:
            self.done[i] = True
            return
        out = self.out[i]
        chunk = self.tok.vocab[tok][: self.n_bytes - len(out)]
        out += chunk
        self.empty[i] = 0 if chunk else self.empty[i] + 1
        if self.on_bytes is not None and chunk:
            self.on_bytes(chunk)
        if len(out) >= self.n_bytes or self.empty[i] >= MAX_EMPTY_DRAWS:
            self.done[i] = True

    def need(self) -> int:
        """At most this many more tokens are needed by any sample (a token is >= 1 byte, and
        one more for a document separator that gives none)."""
        return max((self.n_bytes - len(o) for o, d in zip(self.out, self.done) if not d), default=0) + 1

    def result(self, samples: int):
        return bytes(self.out[0]) if samples == 1 else [bytes(o) for o in self.out]


def generate(model: Model, tokenizer: Tokenizer, n_bytes: int, prompt: bytes = b"", temperature: float = 1.0,
             top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop_at_doc_end: bool = False,
             on_bytes=None, speculative: bool = False, stats=None, samples: int = 1, engine: str = "auto",
             allowed: np.ndarray | None = None):
    """Sample until n_bytes bytes are produced (or a document ends, if asked). Returns the bytes,
    or with samples > 1 a list of that many independent samples drawn in one batched pass.
    A sample that draws MAX_EMPTY_DRAWS ids in a row that give no bytes ends there, short.

    The prompt is not included in the output. An empty prompt starts a new document.
    on_bytes(chunk) is called with each produced chunk (for streaming output; one sample only).
    Sample i draws from np.random.default_rng(seed + i), on the CPU and the GPU alike.
    speculative: draft with the model's multi-token heads and verify in blocks (decode/speculative.py);
    the same distribution as plain sampling, fewer forward passes. stats: a SpecStats to fill.
    engine: "auto" (the backend's on-device decoder where it has one that takes the model: the
    GPU, gpu/decode.cu), "host" (the cached forward, sampling on the host), "device".
    allowed: bool (V,) over the vocabulary, the ids that may be drawn (None: all).
    """
    if not whole(n_bytes):   # 3.5: a TypeError in a slice
        raise ConfigError(f"bytes must be a whole number, got {n_bytes!r}")
    if n_bytes < 0:
        raise ConfigError(f"bytes must be >= 0, got {n_bytes}")
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
        raise ConfigError(f"samples must be a positive integer, got {samples!r}")
    if samples > 1 and (on_bytes is not None or speculative):
        raise ConfigError("streaming output and speculative decoding take one sample at a time")
    if engine not in ("auto", "host", "device"):
        raise ConfigError(f"unknown engine {engine!r}; choose auto, host or device")
    _check_sampling(temperature, top_k, top_p)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    bias = None
    if allowed is not None:
        allowed = np.asarray(allowed, dtype=bool)
        if allowed.shape != (tokenizer.vocab_size,) or not allowed.any():
            raise ConfigError(f"allowed must be {tokenizer.vocab_size} booleans with at least one true")
        bias = None if allowed.all() else np.where(allowed, 0.0, -np.inf)
        if bias is not None and not stop_at_doc_end and allowed.sum() > 1:
            # <doc> gives no bytes: with a mask that has cut the likeliest bytes it can win every
            # draw (greedy: forever); the output is one stream, so documents do not end in it
            bias[tokenizer.doc_id] = -np.inf
    history = [tokenizer.doc_id] + [int(i) for i in tokenizer.encode(prompt)]
    outs = _Outputs(tokenizer, samples, n_bytes, history, stop_at_doc_end, on_bytes)
    if n_bytes == 0:
        return outs.result(samples)
    dec = on_device(model, tokenizer.vocab_size) if engine != "host" and not speculative else None
    if dec is not None:
        _generate_device(dec, model, tokenizer, outs, samples, temperature, top_k, top_p, seed,
                         None if bias is None else np.isfinite(bias))
        return outs.result(samples)
    if engine == "device":
        raise ConfigError("no on-device decoder for this backend or model")
    if samples > 1:
        _generate_host(model, tokenizer, outs, samples, temperature, top_k, top_p, seed, bias)
        return outs.result(samples)
    rng = np.random.default_rng(seed)
    blas = OneBlasThread(model, hold=not speculative)   # a small model: one BLAS thread, prefills too
    if speculative:
        ids = speculative_ids(model, history, rng, temperature, top_k, top_p, stats, tokenizer.vocab_size, bias)
    else:
        ids = plain_ids(model, history, rng, temperature, top_k, top_p, tokenizer.vocab_size, bias,
                        pair=bool(blas.libs), blas_libs=blas.libs)
    with blas, closing(ids):
        for nxt in ids:
            outs.take(0, nxt)
            if outs.done[0]:
                break
    return outs.result(1)


def _generate_host(model, tokenizer, outs, N, temperature, top_k, top_p, seed, bias=None):
    """N samples through the backend's batched cached forward (lockstep.Lockstep: the window
    policy above), sampling on the host, sample i from np.random.default_rng(seed + i).
    The cache starts with room for the prompt and one token a byte asked for (ids that give no
    bytes, such as <doc>, make it grow, up to the context): its memory follows the request, not
    the context (the same bytes)."""
    from .lockstep import Lockstep
    ops, V = model.ops, tokenizer.vocab_size
    rngs = [np.random.default_rng(seed + i) for i in range(N)]
    first = window.start(outs.hist[0], model.cfg.context)
    steps = Lockstep(model, N, model.cfg.context, size=len(first) + outs.need())
    def masked(rows):
        z = ops.to_numpy(rows[:, :V]).astype(np.float64)
        return z if bias is None else z + bias
    logits = masked(steps.start(first))
    while True:
        nxt = [sample_next(logits[i], rngs[i], temperature, top_k, top_p) if not outs.done[i] else 0
               for i in range(N)]
        for i in range(N):
            outs.take(i, nxt[i])
        if all(outs.done):
            return
        logits = masked(steps.push(nxt))


def _generate_device(dec, model, tokenizer, outs, N, temperature, top_k, top_p, seed, allowed=None):
    """The on-device decoder: sampling and the model step stay on the GPU (a CUDA graph per
    step for small batches); the host reads the sampled ids in chunks. allowed: None, or bool (V,),
    the byte mask, applied by the device's sampler."""
    T = model.cfg.context
    W = model.weights()
    d = dec.Decoder(model, N, tokenizer.vocab_size, seed, temperature, top_k, top_p, allowed=allowed)
    pos = _prefill(d, model, [window.start(outs.hist[0], T)], W)   # one shared prompt, copied to every sample
    t, chunk = 0, 8
    while True:
        toks, k, pos, full = _chunk(d, t, pos, min(chunk, T - pos, outs.need()))
        t += k
        chunk = min(2 * chunk, 256)
        for j in range(k):
            for i in range(N):
                outs.take(i, int(toks[i, j]))
        if all(outs.done):
            return
        if full:
            pos = _prefill(d, model, [window.reread(h, T) for h in outs.hist], W)
            t = 0
