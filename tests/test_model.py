"""The whole model: gradients of every parameter tensor against finite differences (float64),
the flat-buffer layout, and the KV-cache path against the full forward pass."""
import numpy as np
import pytest

from bytemodel.config import ModelConfig, preset
from bytemodel.errors import ConfigError
from bytemodel.gradcheck import BOUND, check_model, tiny_config
from bytemodel.model import Model, layout, n_params, views
from bytemodel.ops import numpy_ops


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": True, "n_kv_heads": 4}, {"n_kv_heads": 1}])
def test_every_tensor_matches_finite_differences(overrides):
    rows = check_model(tiny_config(**overrides), per_tensor=10, seed=3)
    names = {r.name for r in rows}
    assert {"wte", "norm_f", "layers.1.wqkv", "layers.0.w_gateup"} <= names
    assert ("lm_head" in names) == (not overrides.get("tie_embeddings", False))
    bad = [(r.name, r.max_rel_error) for r in rows if r.max_rel_error > BOUND]
    assert not bad, bad


def test_gradcheck_catches_a_wrong_gradient(monkeypatch):
    """The check itself must be able to fail: break one backward and it reports that tensor."""
    from bytemodel.ops import numpy_ops
    real = numpy_ops.rmsnorm_backward

    def wrong(dout, cache, dg, residual=None):
        dx = real(dout, cache, dg, residual)
        dg *= 1.01
        return dx
    monkeypatch.setattr(numpy_ops, "rmsnorm_backward", wrong)
    rows = check_model(tiny_config(), per_tensor=4)
    bad = {r.name for r in rows if not r.ok}
    assert "norm_f" in bad and "layers.0.attn_norm" in bad and "wte" not in bad


def test_layout_is_one_aligned_flat_buffer():
    cfg = preset("tiny")
    lay = layout(cfg)
    assert all(off % 64 == 0 for _, _, off in lay)
    m = Model(cfg, numpy_ops)
    m.init_weights(0)
    v = views(m.params, cfg)
    assert all(np.shares_memory(t, m.params) for t in v.values())
    assert m.p["layers.0.wqkv"].shape == (128, 3 * 128)
    # by hand: embedding + head 2*257*128 (256 bytes + the separator), per layer 4*128^2 (q,k,v,o) + 3*128*384 (SwiGLU) + 2*128 gains
    assert n_params(cfg) == 2 * 257 * 128 + 4 * (4 * 128 * 128 + 3 * 128 * 384 + 2 * 128) + 128


def test_presets_and_validation():
    assert preset("small").d_model == 384 and preset("base").n_layers == 12
    assert preset("tiny", d_model=64, n_heads=2).head_dim == 32
    with pytest.raises(ConfigError):
        preset("huge")
    with pytest.raises(ConfigError):
        ModelConfig(d_model=130, n_heads=4)
    with pytest.raises(ConfigError):
        ModelConfig.from_dict({"d_model": 128, "droupout": 0.1})
    with pytest.raises(ConfigError):
        ModelConfig.from_dict({"d_model": "128"})


def test_kv_cache_matches_full_forward():
    cfg = tiny_config(context=12)
    m = Model(cfg, numpy_ops, dtype=np.float64)
    m.init_weights(0)
    m.params[:] += np.random.default_rng(0).standard_normal(m.size) * 0.1
    idx = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(2, 12))
    full = m.forward_cached(idx, m.new_cache(2, 12), 0)
    cache = m.new_cache(2, 12)
    part = [m.forward_cached(idx[:, :5], cache, 0)]
    for t in range(5, 12):
        part.append(m.forward_cached(idx[:, t:t + 1], cache, t))
    np.testing.assert_allclose(np.concatenate(part, axis=1), full, rtol=1e-10, atol=1e-10)
    # and the training forward's loss agrees with the cached path's logits
    tgt = np.roll(idx, -1, axis=1)
    losses = m.forward(idx, tgt)
    lp = full - np.log(np.exp(full).sum(-1, keepdims=True))
    want = -np.take_along_axis(lp, tgt[..., None], -1).reshape(-1)
    np.testing.assert_allclose(losses, want, rtol=1e-10)


def test_core_parallel_matches_serial():
    """Batch slices on threads give the same losses and (to float32 rounding) the same gradients
    (validation runs through ops/scorer.py instead: tests/test_validation_score.py)."""
    from bytemodel.training.runner import CoreParallel
    cfg = tiny_config(context=16)
    m = Model(cfg, numpy_ops)
    m.init_weights(0)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, cfg.vocab_size, (5, 16)), rng.integers(0, cfg.vocab_size, (5, 16))
    a = m.loss_and_grad(x, y, 2.0 / x.size)   # twice the mean
    ga = m.grads.copy()
    m.grads[:] = 0
    cp = CoreParallel(m, workers=3)
    b = cp.loss_and_grad(x, y, 2.0 / x.size)
    np.testing.assert_allclose(b, a, rtol=1e-5)
    # float32 sums in another order: relative 1e-5 of the largest entry is ~100x float32 epsilon
    np.testing.assert_allclose(m.grads, ga, atol=1e-5 * np.abs(ga).max())
    assert all(not r.grads.any() for r in cp.replicas[1:])  # replicas hand their gradients over
    cp.close()
