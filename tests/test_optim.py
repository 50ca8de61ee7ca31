"""AdamW, the schedule and loss scaling, checked by hand."""
import math

import numpy as np

from bytemodel.config import ModelConfig
from bytemodel.model import Model
from bytemodel.training.optim import AdamW, LossScaler, lr_at
from bytemodel.ops import numpy_ops


def test_schedule_warmup_then_cosine():
    assert lr_at(0, 1.0, 10, 110) == 0.1
    assert lr_at(9, 1.0, 10, 110) == 1.0
    assert math.isclose(lr_at(60, 1.0, 10, 110), 0.1 + 0.9 * 0.5)   # half way down the cosine
    assert math.isclose(lr_at(110, 1.0, 10, 110), 0.1)              # floor: min_ratio * lr


def test_adamw_first_step_by_hand():
    cfg = ModelConfig(vocab_size=5, d_model=4, n_layers=1, n_heads=2, d_ff=6, context=4)
    m = Model(cfg, numpy_ops, dtype=np.float64)
    m.init_weights(0)
    p0 = m.params.copy()
    m.grads[:] = np.linspace(-1, 1, m.size)
    opt = AdamW(m, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt.step(lr=0.01)
    # step 1: m_hat = g, v_hat = g^2, so the update is sign(g) (|g| >> eps) plus decay on matrices
    g = np.linspace(-1, 1, m.size)
    mask = m.decay_mask()
    want = p0 - 0.01 * (g / (np.abs(g) + 1e-8) + 0.1 * mask * p0)
    np.testing.assert_allclose(m.params, want, rtol=1e-12, atol=1e-12)
    from bytemodel.model import views
    mv = views(mask, cfg)
    assert (mv["norm_f"] == 0).all() and (mv["layers.0.attn_norm"] == 0).all()   # gains: no decay
    assert (mv["wte"] == 1).all() and (mv["layers.0.wqkv"] == 1).all()           # matrices: decay


def test_global_norm():
    g = np.array([3.0, 4.0, 0.0], dtype=np.float32)
    assert float(numpy_ops.global_norm(g)) == 5.0
    assert math.isinf(float(numpy_ops.global_norm(np.array([1.0, np.inf]))))


def test_adamw_clips_by_the_norm_and_skips_a_non_finite_step():
    p = np.array([1.0, -2.0, 0.5])
    g = np.array([30.0, 40.0, 0.0])             # norm 50 at loss scale 10: 5 unscaled
    m, v, mask = np.zeros(3), np.zeros(3), np.ones(3)
    numpy_ops.adamw_step(p, g, m, v, mask, 0.1, 0.9, 0.95, 1e-8, 0.0, 1, grad_scale=0.1, clip=1.0,
                         norm=numpy_ops.global_norm(g))
    gc = g * 0.1 * (1.0 / (5.0 + 1e-6))          # unscaled, then clipped to norm 1
    np.testing.assert_allclose(m, 0.1 * gc, rtol=1e-12)
    np.testing.assert_allclose(v, 0.05 * gc * gc, rtol=1e-12)
    before = (p.copy(), m.copy(), v.copy())
    bad = np.array([1.0, np.nan, 0.0])
    numpy_ops.adamw_step(p, bad, m, v, mask, 0.1, 0.9, 0.95, 1e-8, 0.0, 2, clip=1.0,
                         norm=numpy_ops.global_norm(bad))
    assert all(np.array_equal(a, b) for a, b in zip((p, m, v), before))   # skipped: nothing changed


def test_loss_scaler_skips_on_overflow_and_recovers():
    s = LossScaler(enabled=True, init=1024.0, interval=3)
    assert s.update(finite=False) is False and s.scale == 512.0      # overflow: skip, halve
    assert s.update(finite=False) is False and s.scale == 256.0
    assert all(s.update(finite=True) for _ in range(3)) and s.scale == 512.0   # 3 good: double
    off = LossScaler(enabled=False)
    assert off.scale == 1.0 and off.update(False) is False and off.scale == 1.0


def test_compressor_baselines_by_hand():
    """Random bytes do not compress (about 8 bits/byte); a tail that repeats the head costs
    almost nothing once the compressor has seen the head, though the whole stream still does."""
    from bytemodel.baselines import compress_bpb
    rnd = np.random.default_rng(0).bytes(20000)
    r = compress_bpb(rnd, tail_fraction=0.5)
    assert 7.9 < r["zstd19"] < 8.2 and 7.9 < r["xz9"] < 8.2
    rep = compress_bpb(rnd + rnd, tail_fraction=0.5)      # tail = head, exactly
    assert rep["zstd19_tail"] < 0.5 and rep["xz9_tail"] < 0.5
    assert 3.8 < rep["zstd19"] < 4.3                      # whole: the first copy still costs 8 bits
