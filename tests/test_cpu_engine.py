"""The compressor's CPU engine (bytemodel/compress/cpu_engine.py) against the model's own forward pass.

A small random model (the arithmetic does not depend on training): the engine's logits must match
lockstep.Lockstep (re-read policy) and a sliding-window reference built from Model.block (the
default policy) to float32 rounding; its quantiser must give valid frequencies; its softmax
shift must fall back per row when a row would underflow.
"""
from __future__ import annotations

import numpy as np
import pytest

from bytemodel.config import ModelConfig
from bytemodel.compress.cpu_engine import CpuLockstep, Folded, Quantiser, log_softmax_into
from bytemodel.errors import ConfigError
from bytemodel.decode.lockstep import Lockstep
from bytemodel.model import Model
from bytemodel.ops import numpy_ops

TOTAL = 1 << 24
# logits here are O(10); float32 products of width <= 64 carry relative errors ~1e-6, so two
# orderings of the same arithmetic agree to ~1e-5: 1e-4 leaves room and still catches any
# real mistake (a wrong rotation, head or mask moves logits by O(0.1) and more)
TOL = 1e-4


def _model(n_kv_heads=0, tie=False, seed=0):
    cfg = ModelConfig(vocab_size=257, d_model=32, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, d_ff=64,
                      context=16, tie_embeddings=tie)
    m = Model(cfg, numpy_ops)
    m.init_weights(seed)
    rng = np.random.default_rng(seed + 1)
    for name, v in m.p.items():                       # gains away from 1, so folding them is tested
        if name.endswith("norm") or name.endswith("norm_f"):
            v[...] = rng.uniform(0.5, 1.5, v.shape)
    return m


@pytest.mark.parametrize("kv,tie", [(0, False), (2, True)])
def test_reread_policy_matches_lockstep(kv, tie):
    m = _model(kv, tie)
    B, W = 5, 8
    a, b = Lockstep(m, B, W), CpuLockstep(m, B, W, reread=W // 2)
    rng = np.random.default_rng(3)
    for _ in range(30):                               # several re-reads (every 5 pushes)
        ids = rng.integers(0, 257, B)
        la = a.push(ids)
        lb = b.push(ids)
        assert np.abs(la - lb).max() < TOL
    assert np.abs(la).max() > 0.1                     # not a trivially zero model


@pytest.mark.parametrize("kv", [0, 2])
def test_sliding_window_matches_a_reference_built_from_model_block(kv):
    """Sliding policy: each token attends to the keys of the last W tokens, each key rotated at
    its own absolute position. Reference: Model.block on caches kept in time order, shifted left
    by one when full."""
    m = _model(kv)
    cfg, Wt = m.cfg, m.weights()
    B, W = 3, 6
    step = CpuLockstep(m, B, W)
    K, D = cfg.n_kv_heads, cfg.head_dim
    caches = [(np.zeros((B, K, W, D), np.float32), np.zeros((B, K, W, D), np.float32)) for _ in range(cfg.n_layers)]
    rng = np.random.default_rng(5)
    for p in range(3 * W):
        ids = rng.integers(0, 257, B)
        if p >= W:
            for kc, vc in caches:
                kc[:, :, :-1] = kc[:, :, 1:].copy()
                vc[:, :, :-1] = vc[:, :, 1:].copy()
        cos, sin = m.rope(1, p)
        x = Wt["wte"][ids]
        for i in range(cfg.n_layers):
            x, _ = m.block(i, x, Wt, cos, sin, B, 1, caches[i], min(p, W - 1))
        hf, _ = numpy_ops.rmsnorm_forward(x, Wt["norm_f"], cfg.norm_eps)
        ref = hf @ m.head(Wt)[0]
        assert np.abs(step.push(ids) - ref).max() < TOL, p
    assert step.fallbacks == 0


def test_same_tokens_same_bits_and_lanes_do_not_mix():
    """Two engines fed the same tokens agree bit for bit; a stream's logits in a lane of 4 are
    within rounding of the same stream alone (the lane shares only the softmax shift)."""
    m = _model()
    f = Folded(m)
    a, b, one = CpuLockstep(m, 4, 8, folded=f), CpuLockstep(m, 4, 8), CpuLockstep(m, 1, 8)
    rng = np.random.default_rng(7)
    for _ in range(20):
        ids = rng.integers(0, 257, 4)
        la, lb, l1 = a.push(ids), b.push(ids), one.push(ids[2:3])
        assert np.array_equal(la, lb)
        assert np.abs(la[2] - l1[0]).max() < TOL


def test_softmax_falls_back_to_each_rows_maximum():
    """A row whose scores all sit far below another row's would underflow under the lane's one
    shift: the engine recomputes with per-row maxima, and the result is the exact attention."""
    m = _model()
    L = CpuLockstep(m, 2, 8)
    B, K, G, D, S = 2, L.K, L.G, L.D, 5
    rng = np.random.default_rng(9)
    kc = rng.normal(0, 1, (B, 8, K, D)).astype(np.float32)
    vc = rng.normal(0, 1, (B, 8, K, D)).astype(np.float32)
    q = rng.normal(0, 1, (B, K, G, D)).astype(np.float32)
    q[0] *= 0.01
    kc[1, :S] += 20 * q[1, :, 0][None] / np.linalg.norm(q[1, :, 0], axis=-1, keepdims=True)   # stream 1: scores ~ +20|q|
    q[1] *= 8
    L._attend(q, kc, vc, S)
    assert L.fallbacks == 1
    keys = kc[:, :S].transpose(0, 2, 1, 3).astype(np.float64)            # (B, K, S, D)
    vals = vc[:, :S].transpose(0, 2, 1, 3).astype(np.float64)
    s = np.einsum("bkgd,bksd->bkgs", q.astype(np.float64), keys)
    assert s[1].min() - s[0].max() > 100                                  # the lane's shift would underflow row 0
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    ref = np.einsum("bkgs,bksd->bkgd", p / p.sum(-1, keepdims=True), vals)
    assert np.abs(L.att - ref).max() < 1e-4


def test_quantiser_frequencies_are_valid_and_near_the_probabilities():
    rng = np.random.default_rng(0)
    A = 256
    Q = Quantiser(64, A, TOTAL)
    out = np.empty((64, A), np.float32)
    for scale in (0.0, 0.1, 3.0, 30.0, 1e4):
        lg = (rng.normal(0, 1, (64, A + 1)) * scale).astype(np.float32)
        Q(lg, out)
        assert out.min() >= 1 and np.array_equal(out, np.floor(out))
        assert (out.astype(np.float64).sum(axis=1) == TOTAL).all()
        z = lg[:, :A].astype(np.float64)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        # floor and +1 move a frequency by <= 1 count, float32 by a few more, the remainder
        # (<= A, or a few hundred below 0) lands on one symbol
        assert np.abs(out - p * TOTAL).max() <= 2 * A + 16
    certain = np.full((1, A + 1), -1e4, np.float32)
    certain[0, 7] = 0.0
    Q(certain, out[:1])
    assert out[0, 7] == TOTAL - (A - 1) and (np.delete(out[0], 7) == 1).all()


def test_log_softmax_into_matches_the_reference():
    rng = np.random.default_rng(1)
    lg = (rng.normal(0, 5, (7, 257))).astype(np.float32)
    out = np.empty((7, 257))
    log_softmax_into(lg, out)
    assert np.abs(out - numpy_ops.log_softmax(lg.astype(np.float64))).max() < 1e-5


def test_bad_settings_are_refused():
    m = _model()
    with pytest.raises(ConfigError):
        CpuLockstep(m, 2, 8, reread=8)           # must keep fewer than the window
    with pytest.raises(ConfigError):
        CpuLockstep(m, 2, 7)                     # odd window
    with pytest.raises(ConfigError):
        CpuLockstep(m, 0, 8)


@pytest.mark.parametrize("kv", [0, 2])
def test_lockstep_slide_matches_the_cpu_engine_and_a_fresh_window(kv):
    """lockstep.Lockstep(slide=True), the GPU's default policy, through Model.block's ring cache:
    the same logits as the CPU engine's sliding window (checked above against a reference built
    from Model.block on time-ordered caches), also past the model's context (positions keep
    counting; RoPE's scores depend only on distances). Not the same as re-reading: a re-read
    recomputes the kept keys from a shorter past, a ring keeps the keys as first computed."""
    m = _model(kv)
    B, W = 3, 6
    ring, engine, reread = Lockstep(m, B, W, slide=True), CpuLockstep(m, B, W), Lockstep(m, B, W)
    rng = np.random.default_rng(8)
    seq = rng.integers(0, 257, (B, 4 * W))
    apart = 0.0
    for p in range(seq.shape[1]):
        got = ring.push(seq[:, p])
        assert np.abs(got - engine.push(seq[:, p])).max() < TOL, p
        apart = max(apart, float(np.abs(got - reread.push(seq[:, p])).max()))
    assert ring.pos == 4 * W > m.cfg.context
    assert apart > 100 * TOL                          # the policy did change what is computed
    assert np.abs(got).max() > 0.1
