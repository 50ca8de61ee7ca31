"""Self-speculative decoding with the model's own multi-token (MTP) heads: no second model.

One step, with t0 the next token (already decided, not yet in the KV cache) and h the trunk's
last residual at the last cached position:

  1. draft d_2..d_K, d_k ~ q_k = the sampling distribution of MTP head k at h (head k predicts
     the token k positions after the last cached one, i.e. t0's successors);
  2. verify: one forward pass over the block [t0, d_2, .., d_K] gives the main head's
     distribution p_k for the position of each d_k (and p_{K+1} after the block);
  3. accept d_k with probability min(1, p_k(d_k) / q_k(d_k)), in order; at the first rejection
     draw the replacement from norm(max(p_k - q_k, 0)) and stop; if all are accepted, draw the
     next token from p_{K+1}. The cache keeps the accepted prefix (later writes overwrite the rest).

This is the standard speculative-sampling rule (Leviathan et al. 2023; Chen et al. 2023): each
emitted token is distributed exactly as ordinary sampling from p with the same temperature,
top-k and top-p, whatever the drafts are; the drafts only change how many tokens a forward pass
yields. Greedy (temperature 0) emits exactly the tokens of ordinary greedy decoding, up to the
rounding of a block forward against one-token forwards.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, named
from ..sampling import sampling_probs
from . import window


@dataclass
class SpecStats:
    steps: int = 0       # verification forward passes
    drafted: int = 0     # draft tokens proposed
    accepted: int = 0    # draft tokens accepted

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0


def _accept(p_d: float, q_d: float, u: float) -> bool:
    """The acceptance rule: keep draft d with probability min(1, p(d) / q(d))."""
    return u * q_d < p_d


def _draw(p: np.ndarray, rng, greedy: bool) -> int:
    return int(np.argmax(p)) if greedy else int(rng.choice(p.size, p=p))


def speculative_ids(model, history: list, rng: np.random.Generator, temperature=1.0, top_k=0,
                    top_p=1.0, stats: SpecStats | None = None, vocab: int | None = None, bias=None):
    """Yields token ids sampled after `history` (a non-empty list of ids), one at a time.

    The model must have MTP heads (cfg.mtp >= 2). The caller stops the iteration when it has
    enough. Greedy when temperature == 0. bias (V,) float64: added to every row of logits (0 or
    -inf: the ids generation may not sample), for the target and the drafts alike.
    """
    cfg, ops = model.cfg, model.ops
    if cfg.mtp < 2:
        raise ConfigError(f"speculative decoding needs a model trained with multi-token heads "
                          f"({named('--mtp 2', 'mtp=2')} or more)")
    stats = stats if stats is not None else SpecStats()
    K, T, V = cfg.mtp, cfg.context, vocab or cfg.vocab_size
    greedy = temperature == 0
    W = model.weights()
    history = list(history)

    def probs(row) -> np.ndarray:
        z = ops.to_numpy(row)[:V].astype(np.float64)
        return sampling_probs(z if bias is None else z + bias, temperature, top_k, top_p)

    def prefill(ids):
        cache = model.new_cache(1, T)
        lg, x = model.forward_cached(ops.asarray(np.array([ids], dtype=np.int64)), cache, 0, W, hidden=True)
        return cache, len(ids), lg[0, -1], x[-1:]

    cache, pos, last_logits, h = prefill(window.start(history, T))
    t0 = _draw(probs(last_logits), rng, greedy)
    while True:
        history.append(t0)
        yield t0
        if pos + K > T:      # no room for a block: re-read the recent half (t0 stays pending)
            cache, pos, _, h = prefill(window.reread(history[:-1], T))
        q = [probs(lg[0]) for lg in model.draft_logits(h, W)]        # K-1 draft distributions
        drafts = [_draw(qk, rng, greedy) for qk in q]
        block = np.array([[t0] + drafts], dtype=np.int64)            # (1, K)
        lg, x = model.forward_cached(ops.asarray(block), cache, pos, W, hidden=True)
        stats.steps += 1
        stats.drafted += len(drafts)
        nxt = None
        for i, d in enumerate(drafts, start=1):   # block[i] = d, judged by p at row i-1
            p = probs(lg[0, i - 1])
            if _accept(p[d], q[i - 1][d], 0.0 if greedy else rng.random()):
                stats.accepted += 1
                history.append(d)
                yield d
                continue
            r = np.maximum(p - q[i - 1], 0.0)
            nxt = _draw(r / r.sum(), rng, greedy)  # the replacement for the rejected draft
            pos, h = pos + i, x[i - 1:i]
            break
        if nxt is None:                            # every draft accepted: one more from p_{K+1}
            nxt = _draw(probs(lg[0, K - 1]), rng, greedy)
            pos, h = pos + K, x[K - 1:K]
        t0 = nxt
