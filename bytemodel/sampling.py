"""Turning next-token logits into a draw: temperature, top-k, top-p, greedy.

Logits are divided by the temperature, then top-k, then top-p (nucleus) keep the likeliest ids,
then one draw from a NumPy Generator: the same seed gives the same ids. Temperature 0 is greedy.
"""
from __future__ import annotations

import numpy as np


def sampling_probs(logits: np.ndarray, temperature=1.0, top_k=0, top_p=1.0) -> np.ndarray:
    """logits (V,) float64 -> the distribution sampling draws from (float64, sums to 1).

    Temperature 0 is greedy: all mass on the arg-max."""
    if temperature == 0:
        p = np.zeros(logits.size)
        p[int(np.argmax(logits))] = 1.0
        return p
    z = logits / temperature if temperature != 1.0 else logits   # x / 1.0 is x: one pass saved
    if 0 < top_k < z.size:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z >= kth, z, -np.inf)
    z = z - z.max()
    p = np.exp(z)
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        c = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(c, top_p) + 1)]
        q = np.zeros_like(p)
        q[keep] = p[keep]
        p = q / q.sum()
    return p


def sample_next(logits: np.ndarray, rng: np.random.Generator, temperature=1.0, top_k=0, top_p=1.0) -> int:
    """logits (V,) float64 over the real vocabulary -> one id.

    The draw of Generator.choice(V, p=p), written out (without its checks of p, a third of a
    token's time at the tiny preset): u = rng.random() (one double), then the first id whose
    normalised cumulative probability exceeds u (tests/test_generate.py holds it to choice). The GPU
    sampler (gpu/decode.cu) does the same from the same PCG64 state, so both devices share the
    seed semantics."""
    if temperature == 0:
        return int(np.argmax(logits))
    cdf = np.cumsum(sampling_probs(logits, temperature, top_k, top_p))
    cdf /= cdf[-1]
    return int(cdf.searchsorted(rng.random(), side="right"))


def rng_states(seed: int, n: int) -> np.ndarray:
    """(n, 4) uint64: the PCG64 state of np.random.default_rng(seed + i), as [state hi, state lo,
    increment hi, increment lo]: where the GPU sampler's streams start (the CPU's generators)."""
    out = np.empty((n, 4), dtype=np.uint64)
    for i in range(n):
        out[i] = rng_words(np.random.default_rng(seed + i))
    return out


def rng_words(rng: np.random.Generator) -> np.ndarray:
    """(4,) uint64: a PCG64 generator's state now, as rng_states writes it (a GPU sampler stream
    that goes on from where the host's generator stands)."""
    st = rng.bit_generator.state
    if st.get("bit_generator") != "PCG64":
        raise ValueError(f"the GPU sampler follows PCG64 streams, not {st.get('bit_generator')}")
    s, inc, m64 = st["state"]["state"], st["state"]["inc"], (1 << 64) - 1
    return np.array([s >> 64, s & m64, inc >> 64, inc & m64], dtype=np.uint64)
