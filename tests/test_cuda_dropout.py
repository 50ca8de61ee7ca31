"""gpu/dropout.cu against the NumPy reference: the same mask bit for bit, the same values to the
compute dtype's rounding, and the GPU model's dropout gradients against the CPU model's.
Skipped where CuPy or a GPU is absent (CI).

Tolerances: the mask must agree exactly (both draw the same integer hash). Values: the kernel
computes x * scale (+ residual) in fp32 from activations rounded to the compute dtype and rounds
once, so it is within one rounding unit of the float64 reference on the same rounded inputs:
2^-11 (fp16), 2^-8 (bf16) relative per element, 1e-6 for fp32 (one fp32 product and sum).
"""
import numpy as np
import pytest

from conftest import cuda_backend, gpu_marks

cp = pytest.importorskip("cupy")
pytestmark = gpu_marks(cp)

from bytemodel.model import Dropout, Model, dropout_key  # noqa: E402
from bytemodel.ops import numpy_ops as ref  # noqa: E402

UNIT = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "fp32": 1e-6}


@pytest.fixture(scope="module", params=["fp16", "bf16", "fp32"])
def ops(request):
    return cuda_backend(request.param)


@pytest.mark.parametrize("shape,offset", [((37, 130), 0), ((64, 96), 123456), ((16, 8), 6), ((3, 2), 10 ** 9 + 1)])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_mask_and_values_match_numpy(ops, shape, offset, p):
    """Odd row counts; sizes and offsets that take the 8-wide kernel (size % 8 == 0, offset % 4
    == 0) and the one-element kernel (the rest: an odd size, an offset inside a hash word)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(ops.act_dtype)
    r = rng.standard_normal(shape).astype(ops.act_dtype)
    key = dropout_key(7, 3, 5)
    want, cache = ref.dropout_forward(x.astype(np.float64), p, key, offset, residual=r.astype(np.float64))
    got, gcache = ops.dropout_forward(cp.asarray(x), p, key, offset, residual=cp.asarray(r))
    got = cp.asnumpy(got).astype(np.float64)
    # the mask, bit for bit: where the reference dropped, the GPU's output is the residual exactly
    keep = cache[0]
    np.testing.assert_array_equal(got[~keep], r.astype(np.float64)[~keep])
    u = UNIT[ops.precision]   # one rounding of the result, plus fp32's on the product and the sum
    terms = np.abs(x.astype(np.float64)) * cache[1] + np.abs(r.astype(np.float64))
    assert np.all(np.abs(got - want) <= u * np.abs(want) + 1e-6 * terms), np.max(np.abs(got - want))
    # the backward draws the same mask again: exact zeros where dropped, dout * scale elsewhere
    d = rng.standard_normal(shape).astype(ops.act_dtype)
    gd = cp.asnumpy(ops.dropout_backward(cp.asarray(d), gcache)).astype(np.float64)
    wd = ref.dropout_backward(d.astype(np.float64), cache)
    assert np.array_equal(gd == 0, ~keep | (d == 0))
    assert np.all(np.abs(gd - wd) <= u * np.abs(wd))
    # without the residual: the embedding's form
    g2 = cp.asnumpy(ops.dropout_forward(cp.asarray(x), p, key, offset)[0]).astype(np.float64)
    assert np.array_equal(g2 == 0, ~keep | (x == 0))


def test_gpu_model_dropout_gradients_match_cpu():
    """fp32 GPU model against the float64 CPU model, same weights, batch and masks: the
    gradients agree to fp32 precision (1e-4 per tensor, norm-relative; without the same masks
    they differ by order 1, checked too)."""
    from bytemodel.config import ModelConfig
    from bytemodel.model import views
    from bytemodel.ops.cuda_ops import CudaBackend
    cfg = ModelConfig(vocab_size=50, d_model=64, n_layers=2, n_heads=2, d_ff=96, context=32, dropout=0.3)
    cpu = Model(cfg, ref, dtype=np.float64)
    cpu.init_weights(0)
    gpu = Model(cfg, CudaBackend("fp32"))
    gpu.load_flat(cpu.params.astype(np.float32))
    idx = np.random.default_rng(2).integers(0, 50, size=(3, 32))
    cpu.loss_and_grad(idx, idx, 1 / idx.size, drop=Dropout(1, 9))
    gpu.loss_and_grad(cp.asarray(idx), cp.asarray(idx), 1 / idx.size, drop=Dropout(1, 9))
    g = views(cp.asnumpy(gpu.grads).astype(np.float64), cfg)
    for name, a in views(cpu.grads, cfg).items():
        err = np.linalg.norm(g[name] - a) / (np.linalg.norm(a) + 1e-30)
        assert err < 1e-4, (name, err)
    other = Model(cfg, ref, dtype=np.float64)
    other.load_flat(cpu.params)
    other.loss_and_grad(idx, idx, 1 / idx.size, drop=Dropout(1, 10))
    assert np.linalg.norm(other.grads - cpu.grads) > 1e-2 * np.linalg.norm(cpu.grads)


@pytest.mark.parametrize("shape,offset", [((70, 768), 0), ((33, 384), 4 * 999), ((20, 768), 6), ((9, 100), 0)])
def test_rmsnorm_backward_hands_on_the_dropped_gradient(ops, shape, offset):
    """rmsnorm_backward(..., drop=cache) -> (dx, dy): the same bytes as rmsnorm_backward, then
    dropout_backward on its dx (the two calls the model made before the fused pass), and dg
    unchanged. The fused pass runs where C % 8 == 0, C <= 1024 and the offset is a multiple of 4;
    the other two cases (an offset inside a hash word, C = 100) take the two calls."""
    rng = np.random.default_rng(offset + shape[1])
    N, C = shape
    x, d, r = (cp.asarray(rng.standard_normal(shape).astype(ops.act_dtype)) for _ in range(3))
    g = cp.asarray((1 + 0.1 * rng.standard_normal(C)).astype(ops.act_dtype))
    _, cache = ops.rmsnorm_forward(x, g, 1e-5)
    _, drop = ops.dropout_forward(x, 0.3, dropout_key(4, 5, 6), offset)
    dg1, dg2 = cp.zeros(C, dtype=cp.float32), cp.zeros(C, dtype=cp.float32)
    dx1 = ops.rmsnorm_backward(d, cache, dg1, residual=r)
    dy1 = ops.dropout_backward(dx1, drop)
    dx2, dy2 = ops.rmsnorm_backward(d, cache, dg2, residual=r, drop=drop)
    for a, b in ((dx1, dx2), (dy1, dy2), (dg1, dg2)):
        assert cp.asnumpy(a).tobytes() == cp.asnumpy(b).tobytes()
    assert 0.2 < float(cp.mean(dy2 == 0)) < 0.4     # the mask was applied (p = 0.3)
