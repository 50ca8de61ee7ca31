"""Many token streams advanced together, one token per stream per step, through one batched KV cache.

    L = Lockstep(model, B, window)      # B streams, at most `window` tokens of context each
    logits = L.push(ids)                # ids (B,) int: the next token of every stream
                                        # -> logits (B, V) for the token after it

Every stream starts empty; the first push is usually the document separator <doc>, as a new
document starts in training. All streams are at the same position at every step (lockstep), so a
step is one call of Model.forward_cached on a (B, 1) batch, and the matrix products run at batch
width instead of one row at a time.

Window policy (the same as generation's): the cache holds at most `window` tokens. When a push
finds it full, the most recent window/2 tokens of every stream, the pushed one included, are
re-read into the cache from position 0 (one (B, window/2) forward pass), and the streams go on
from there. So a token is always predicted from between window/2 and window tokens of its own
stream's past (fewer only at the start), in windows like those the model was trained on.
With slide=True the window slides instead: once full, the cache is a ring (Model.block) and
every token is predicted from the `window` - 1 tokens before it, with no re-read; positions keep
counting past the context, which RoPE allows because a score depends only on the distance
between query and key (at most window - 1, as in training).

Determinism: what a push computes depends only on the pushed tokens, the weights, the backend and
the shapes (B, window), never on the data of other calls or on the wall clock. Two Lockstep
objects with the same B and window fed the same tokens return bit-identical logits on the same
backend and machine, which is what lets a compressor and its decompressor agree
(bytemodel/compress/driver.py).

Memory (`size`): on the CPU the cache starts with room for `size` tokens (the most the caller
expects: a compressor's steps, generation's prompt and bytes) and grows by doubling up to the
window when a push finds it full, so B streams of a few tokens hold a few tokens' keys each, not
a window's. Its capacity changes no bit: every read is of slots 0..S-1, each (S, D) matrix with
the same strides whatever the capacity (only the distance between streams differs), and the
window policy follows `window`, never the capacity (tests/test_memory_bounds.py). Other backends
keep the whole window from the start.

Shapes: B streams, W window, V vocabulary (the model's), K kv heads, D head dim.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..model import Model
from . import window


def check_window(window: int, context: int) -> None:
    if not (2 <= window <= context and window % 2 == 0):
        raise ConfigError(f"window must be an even number in 2..{context} (the model's context), got {window}")


class Lockstep:
    """B streams in lockstep over one (B, K, W, D) KV cache per layer."""

    def __init__(self, model: Model, batch: int, window: int | None = None, weights=None, slide: bool = False,
                 size: int | None = None):
        W = model.cfg.context if window is None else int(window)
        check_window(W, model.cfg.context)
        if batch < 1:
            raise ConfigError(f"need at least one stream, got {batch}")
        self.model, self.B, self.W, self.slide = model, int(batch), W, bool(slide)
        # the cache's slots: `size` (at least 1) on the CPU, growing on demand; the window elsewhere
        cap = W if size is None or model.xp is not np else min(W, max(1, int(size)))
        self.cache = model.new_cache(self.B, cap)
        self.weights = model.weights() if weights is None else weights
        self.recent = np.zeros((self.B, cap), dtype=np.int64)   # the tokens in the cache, by position
        self.pos = 0                                            # tokens in the cache

    @property
    def capacity(self) -> int:
        """Tokens the cache has room for now (the window once grown to it)."""
        return self.recent.shape[1]

    def _reserve(self, n: int) -> None:
        """Room for n tokens (n <= window): a cache of min(window, max(n, twice the capacity)) slots
        with the filled ones copied over (the same values; the old cache freed)."""
        cap = self.capacity
        if n <= cap:
            return
        new = min(self.W, max(n, 2 * cap))
        cache = self.model.new_cache(self.B, new)
        for (kn, vn), (ko, vo) in zip(cache, self.cache):
            kn[:, :, :self.pos] = ko[:, :, :self.pos]
            vn[:, :, :self.pos] = vo[:, :, :self.pos]
        recent = np.zeros((self.B, new), dtype=np.int64)
        recent[:, :self.pos] = self.recent[:, :self.pos]
        self.cache, self.recent = cache, recent

    def start(self, ids):
        """Begin every stream with the same tokens ids (n <= window, n >= 1), read in one forward
        pass and its cache copied to every stream (generation's prompt). -> logits (B, V)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = ids.size
        if not 1 <= n <= self.W:
            raise ConfigError(f"a start of {n} tokens does not fit the window of {self.W}")
        m, o = self.model, self.model.ops
        self.pos = 0
        self._reserve(n)
        one = m.new_cache(1, self.W)
        logits = m.forward_cached(o.asarray(ids[None]), one, 0, self.weights)            # (1, n, V)
        for (kb, vb), (k1, v1) in zip(self.cache, one):
            kb[:, :, :n] = k1[:, :, :n]
            vb[:, :, :n] = v1[:, :, :n]
        self.recent[:, :n] = ids
        self.pos = n
        return o.xp.broadcast_to(logits[:, -1], (self.B, logits.shape[-1]))

    def push(self, ids):
        """ids (B,) ints -> logits (B, V) on the backend's device, predicting each stream's next token."""
        ids = np.asarray(ids, dtype=np.int64).reshape(self.B)
        m, o, W = self.model, self.model.ops, self.W
        if self.pos == W and not self.slide:  # full: re-read the newest W/2 tokens (the pushed one last) from 0
            keep = window.keep(W)
            self.recent[:, :keep - 1] = self.recent[:, W - keep + 1:]
            self.recent[:, keep - 1] = ids
            x = np.ascontiguousarray(self.recent[:, :keep])
            logits = m.forward_cached(o.asarray(x), self.cache, 0, self.weights)     # (B, W/2, V)
            self.pos = keep
            return logits[:, -1]
        if self.pos < W:                      # (sliding past W: the cache is a ring, see Model.block)
            self._reserve(self.pos + 1)
            self.recent[:, self.pos] = ids
        logits = m.forward_cached(o.asarray(ids[:, None]), self.cache, self.pos, self.weights)  # (B, 1, V)
        self.pos += 1
        return logits[:, -1]
