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


def test_a_resume_to_more_steps_goes_on_from_the_rate_it_had():
    """Issue 22: resuming a finished 60-step run to 120 made the rate jump 7.5x (cosine over the new
    total). extend_schedule keeps it continuous: from the rate at the resume step, by cosine down to
    the floor at the new total. The settings stay as they were (frozen); the extension is the
    loop's state."""
    from bytemodel.config import TrainConfig
    from bytemodel.training.optim import extend_schedule
    tc = TrainConfig(steps=60, lr=2e-3, warmup=10).freeze()

    def rate(s, total, lf, t=tc):
        return lr_at(s, t.lr, t.warmup, total, t.min_lr_ratio, lf)
    before = [rate(s, 60, []) for s in range(60)]
    lf, note = extend_schedule(tc, 60, 60, 120)
    after = [rate(s, 120, lf) for s in range(60, 120)]
    assert "schedule: 60 -> 120 steps" in note and lf
    assert math.isclose(after[0], lr_at(60, 2e-3, 10, 60))            # where the old one was
    assert after[0] <= before[-1] * 1.001                              # no jump (it was 7.5x)
    assert all(b <= a + 1e-12 for a, b in zip(after, after[1:]))       # and it never rises
    assert extend_schedule(tc, 60, 120, 120, lf) == (lf, "")            # the same plan: nothing changes
    # a resume in the middle of a run: the rate goes on from its value there, down to the floor
    mid = TrainConfig(steps=100, lr=1.0, warmup=10, min_lr_ratio=0.1)
    was = rate(50, 100, [], mid)
    lf, _ = extend_schedule(mid, 50, 100, 200)
    assert math.isclose(rate(50, 200, lf, mid), was) and math.isclose(rate(200, 200, lf, mid), 0.1)
    assert rate(51, 200, lf, mid) < was and rate(51, 200, lf, mid) > was - 0.01   # smooth: a small step down
    # extended twice: the second goes on from the first's rate
    was2 = rate(150, 200, lf, mid)
    lf2, _ = extend_schedule(mid, 150, 200, 300, lf)
    assert math.isclose(rate(150, 300, lf2, mid), was2) and rate(151, 300, lf2, mid) < was2
    # inside the warmup the ramp goes on, then the cosine spans the new total
    w = TrainConfig(steps=40, lr=1.0, warmup=20)
    lf, note = extend_schedule(w, 5, 40, 80)
    assert "warmup goes on" in note and not lf
    assert rate(19, 80, lf, w) == 1.0 and math.isclose(rate(80, 80, lf, w), 0.1)


def test_a_warmup_not_shorter_than_the_run_is_scaled():
    from bytemodel.config import TrainConfig
    from bytemodel.training.optim import fit_warmup
    tc = TrainConfig(steps=30, lr=1.0, warmup=50)
    note = fit_warmup(tc)
    assert tc.warmup == 3 and "scaled to 3" in note
    assert lr_at(29, tc.lr, tc.warmup, tc.steps, tc.min_lr_ratio) < 0.2   # it decays by the end
    assert fit_warmup(TrainConfig(steps=30, warmup=29)) == ""
