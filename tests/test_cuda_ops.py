"""Each CUDA op against its NumPy twin in float64, and the whole GPU model against the CPU model.

Skipped where CuPy or a GPU is absent (CI). Inputs are drawn fresh, rounded to the compute dtype,
and the reference runs in float64 on the SAME rounded inputs, so the error measured is the
kernel's own: fp32 accumulation plus one rounding of the output to the compute dtype.

Tolerances (norm-relative, ||gpu - ref|| / ||ref||), with their reasons:
    fp16   2e-3: one fp16 rounding of each output is 2^-11 ~ 4.9e-4 relative; products and sums
           are accumulated in fp32, so errors stay near that unit (measured ~3e-4 .. 6e-4).
    bf16   1.6e-2: the same argument with bf16's 2^-8 ~ 3.9e-3.
    fp32   1e-5: fp32 arithmetic against fp64, ~1e-7 per operation.
Whole model (fp16): 3e-2 per gradient tensor: roundings compound through 2 layers of fp16
activations (measured on the device, see benchmarks/README.md).
"""
import math

import numpy as np
import pytest

from conftest import cuda_backend, gpu_marks

cp = pytest.importorskip("cupy")
pytestmark = gpu_marks(cp)

from bytemodel.ops import numpy_ops as ref  # noqa: E402
from bytemodel.ops.host import rope_tables  # noqa: E402

TOL = {"fp16": 2e-3, "bf16": 1.6e-2, "fp32": 1e-5}


@pytest.fixture(scope="module", params=["fp16", "fp32", "bf16"])
def ops(request):
    return cuda_backend(request.param)


def rel(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.all(np.isfinite(a)), "non-finite output"
    return float(np.linalg.norm(a - b) / (np.linalg.norm(b) + 1e-30))


def rnd(ops, rng, shape, scale=1.0):
    """Fresh random array, rounded to the compute dtype; returns (float64 host, device)."""
    x = (rng.standard_normal(shape) * scale).astype(ops.act_dtype)
    return x.astype(np.float64), cp.asarray(x)


def host(a):
    return cp.asnumpy(a).astype(np.float64)


def tol(ops, factor=1.0):
    return TOL[ops.precision] * factor


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("V,C,B,T", [(67, 40, 3, 17), (320, 128, 2, 33), (67, 36, 2, 9), (9000, 16, 2, 33)])  # rows, rows, sorted (C % 8), sorted (V > 8192)
def test_embedding(ops, V, C, B, T):
    rng = np.random.default_rng(1)
    w, wd = rnd(ops, rng, (V, C))
    idx = rng.integers(0, V, size=(B, T))
    out, cache = ops.embedding_forward(wd, cp.asarray(idx))
    assert rel(host(out), w[idx]) == 0.0
    d, dd = rnd(ops, rng, (B, T, C))
    dw = cp.full((V, C), 0.5, dtype=cp.float32)        # accumulates into existing values
    ops.embedding_backward(dd, cache, dw)
    dw_ref = np.full((V, C), 0.5)
    ref.embedding_backward(d, idx, dw_ref)
    assert rel(host(dw), dw_ref) < 1e-6               # fp32 sums of exact fp16 values


@pytest.mark.parametrize("N,C", [(33, 40), (17, 37), (40, 384), (64, 768), (9, 1024), (9, 1032)])  # every bwd kernel
def test_rmsnorm(ops, N, C):
    rng = np.random.default_rng(2)
    x, xd = rnd(ops, rng, (N, C))
    g, gd = rnd(ops, rng, (C,))
    out, cache = ops.rmsnorm_forward(xd, gd, 1e-5)
    out_ref, cache_ref = ref.rmsnorm_forward(x, g, 1e-5)
    assert rel(host(out), out_ref) < tol(ops)
    d, dd = rnd(ops, rng, (N, C))
    dg = cp.ones((C,), dtype=cp.float32)
    dx = ops.rmsnorm_backward(dd, cache, dg)
    dg_ref = np.ones(C)
    dx_ref = ref.rmsnorm_backward(d, cache_ref, dg_ref)
    assert rel(host(dx), dx_ref) < tol(ops)
    assert rel(host(dg), dg_ref) < 1e-5 if ops.precision == "fp32" else rel(host(dg), dg_ref) < 1e-4
    r, rd = rnd(ops, rng, (N, C))            # the fused residual form: residual + dx
    dx2 = ops.rmsnorm_backward(dd, cache, cp.zeros((C,), dtype=cp.float32), residual=rd)
    assert rel(host(dx2), r + dx_ref) < tol(ops)


@pytest.mark.parametrize("N,Cin,Cout", [(33, 40, 24), (17, 7, 65), (128, 256, 320)])
def test_matmul(ops, N, Cin, Cout):
    rng = np.random.default_rng(3)
    x, xd = rnd(ops, rng, (N, Cin))
    w, wd = rnd(ops, rng, (Cin, Cout))
    out = ops.matmul_forward(xd, wd)
    assert rel(host(out), x @ w) < tol(ops)
    d, dd = rnd(ops, rng, (N, Cout))
    dw0 = rng.standard_normal((Cin, Cout))
    dw = cp.asarray(dw0.astype(np.float32))
    dx = ops.matmul_backward(dd, xd, wd, dw)
    dw_ref = dw0.astype(np.float32).astype(np.float64)
    dx_ref = ref.matmul_backward(d, x, w, dw_ref)
    assert rel(host(dx), dx_ref) < tol(ops)
    assert rel(host(dw), dw_ref) < 1e-5               # fp32 output, fp32 accumulation


def test_matmul_transposed_views(ops):
    """The tied LM head: w = wte.T and dw = dwte.T are column-major views."""
    rng = np.random.default_rng(4)
    N, C, V = 19, 48, 72
    x, xd = rnd(ops, rng, (N, C))
    wte, wted = rnd(ops, rng, (V, C))
    out = ops.matmul_forward(xd, wted.T)
    assert rel(host(out), x @ wte.T) < tol(ops)
    d, dd = rnd(ops, rng, (N, V))
    dwte = cp.zeros((V, C), dtype=cp.float32)
    dx = ops.matmul_backward(dd, xd, wted.T, dwte.T)
    dwte_ref = np.zeros((V, C))
    dx_ref = ref.matmul_backward(d, x, wte.T, dwte_ref.T)
    assert rel(host(dx), dx_ref) < tol(ops)
    assert rel(host(dwte), dwte_ref) < 1e-5


@pytest.mark.parametrize("B,T,H,K,D", [(2, 17, 4, 2, 16), (1, 5, 3, 3, 6), (2, 9, 2, 1, 12), (2, 33, 2, 1, 64)])
def test_qkv_rope(ops, B, T, H, K, D):
    rng = np.random.default_rng(5)
    qkv, qkvd = rnd(ops, rng, (B * T, (H + 2 * K) * D))
    cos, sin = rope_tables(np.arange(T), D, 10000.0, ops.act_dtype)
    cosd, sind = cp.asarray(cos), cp.asarray(sin)
    cos, sin = cos.astype(np.float64), sin.astype(np.float64)
    q, k, v = ops.qkv_rope_forward(qkvd, cosd, sind, B, T, H, K)
    qr, kr, vr = ref.qkv_rope_forward(qkv, cos, sin, B, T, H, K)
    for a, b in ((q, qr), (k, kr), (v, vr)):
        assert rel(host(a), b) < tol(ops)
    dq, dqd = rnd(ops, rng, (B, H, T, D))
    dk, dkd = rnd(ops, rng, (B, K, T, D))
    dv, dvd = rnd(ops, rng, (B, K, T, D))
    d = ops.qkv_rope_backward(dqd, dkd, dvd, cosd, sind)
    d_ref = ref.qkv_rope_backward(dq, dk, dv, cos, sin)
    assert rel(host(d), d_ref) < tol(ops)
    # dq in fp32, as the flash backward hands it over
    d32 = ops.qkv_rope_backward(dqd.astype(cp.float32), dkd, dvd, cosd, sind)
    assert rel(host(d32), d_ref) < tol(ops)


def test_add(ops):
    rng = np.random.default_rng(12)
    for shape in [(33, 40), (7, 5)]:
        a, ad = rnd(ops, rng, shape)
        b, bd = rnd(ops, rng, shape)
        assert rel(host(ops.add(ad, bd)), a + b) < tol(ops)


def test_merge_heads(ops):
    rng = np.random.default_rng(6)
    a, ad = rnd(ops, rng, (2, 3, 5, 8))
    assert rel(host(ops.merge_heads_forward(ad)), ref.merge_heads_forward(a)) == 0.0
    d, dd = rnd(ops, rng, (10, 24))
    assert rel(host(ops.merge_heads_backward(dd, 2, 3, 5, 8)), ref.merge_heads_backward(d, 2, 3, 5, 8)) == 0.0


@pytest.mark.parametrize("N,F", [(33, 40), (17, 13), (64, 1024)])
def test_swiglu(ops, N, F):
    rng = np.random.default_rng(7)
    h, hd = rnd(ops, rng, (N, 2 * F), 2.0)
    out, cache = ops.swiglu_forward(hd)
    out_ref, cache_ref = ref.swiglu_forward(h)
    assert rel(host(out), out_ref) < tol(ops)
    d, dd = rnd(ops, rng, (N, F))
    assert rel(host(ops.swiglu_backward(dd, cache)), ref.swiglu_backward(d, cache_ref)) < tol(ops)


@pytest.mark.parametrize("N,V", [(33, 67), (100, 320), (5, 1000)])
def test_cross_entropy(ops, N, V):
    rng = np.random.default_rng(8)
    x, xd = rnd(ops, rng, (N, V), 3.0)
    t = rng.integers(0, V, size=N)
    losses, cache = ops.cross_entropy_forward(xd, cp.asarray(t))
    l_ref, c_ref = ref.cross_entropy_forward(x, t)
    assert losses.dtype == cp.float32
    assert rel(host(losses), l_ref) < 1e-5            # fp32 math on exact inputs
    dl = rng.random(N) / N
    d = ops.cross_entropy_backward(cp.asarray(dl.astype(np.float32)), cache)
    assert rel(host(d), ref.cross_entropy_backward(dl.astype(np.float32).astype(np.float64), c_ref)) < tol(ops)


@pytest.mark.parametrize("N,V", [(33, 67), (100, 320), (5, 1000)])
def test_cross_entropy_masked(ops, N, V):
    """The masked kernels (gpu/cross_entropy.cu with a mask) against NumPy: kept rows as unmasked, masked rows loss
    0 and a gradient row of exact zeros even where dlosses is not 0."""
    rng = np.random.default_rng(10)
    x, xd = rnd(ops, rng, (N, V), 3.0)
    t = rng.integers(0, V, size=N)
    mask = (rng.random(N) < 0.6).astype(np.uint8)
    mask[0], mask[-1] = 0, 1                          # both kinds present at any N
    losses, cache = ops.cross_entropy_forward(xd, cp.asarray(t), cp.asarray(mask))
    l_ref, c_ref = ref.cross_entropy_forward(x, t, mask)
    assert rel(host(losses), l_ref) < 1e-5            # fp32 math on exact inputs, as unmasked
    assert (host(losses)[mask == 0] == 0).all()
    dl = (rng.random(N) + 0.5) / N                    # non-zero everywhere, masked rows included
    d = host(ops.cross_entropy_backward(cp.asarray(dl.astype(np.float32)), cache))
    d_ref = ref.cross_entropy_backward(dl.astype(np.float32).astype(np.float64), c_ref)
    assert rel(d, d_ref) < tol(ops)
    assert (d[mask == 0] == 0).all() and np.abs(d[mask == 1]).max() > 0


def test_masked_model_gradients_match_cpu():
    """The whole GPU model with a loss mask (fp16) against the CPU model in float64."""
    cfg, cpu, gpu, lay = _model_pair("fp16", vocab_size=261, d_model=128, n_layers=2, n_heads=2,
                                     n_kv_heads=1, d_ff=200, context=64)
    rng = np.random.default_rng(12)
    B, T = 2, 37
    idx = rng.integers(0, cfg.vocab_size, size=(B, T))
    tgt = rng.integers(0, cfg.vocab_size, size=(B, T))
    mask = (rng.random((B, T)) < 0.4).astype(np.uint8)
    cpu.grads[:] = 0
    cpu.loss_and_grad(idx, tgt, mask / mask.sum())
    gpu.grads[...] = 0
    gpu.loss_and_grad(cp.asarray(idx), cp.asarray(tgt), 1024.0 * mask / mask.sum())   # loss scale 1024 (fp16)
    from bytemodel.model import views
    gv, cv = views(cp.asnumpy(gpu.grads).astype(np.float64) / 1024.0, cfg), views(cpu.grads, cfg)
    for name, _, _ in lay:
        assert rel(gv[name], cv[name]) < 3e-2, name   # the unmasked test's fp16 bound


def test_attention_simple_path(ops):
    """The cuBLAS + softmax path (fp32 backend, odd head dims) against the reference."""
    rng = np.random.default_rng(9)
    B, H, K, T, S, D = 2, 4, 2, 19, 23, 16
    q, qd = rnd(ops, rng, (B, H, T, D))
    k, kd = rnd(ops, rng, (B, K, S, D))
    v, vd = rnd(ops, rng, (B, K, S, D))
    out, lse = ops._attention_forward_ref(qd, kd, vd)
    o_ref, l_ref = ref.attention_forward(q, k, v)
    assert rel(host(out), o_ref) < tol(ops, 2)
    assert np.max(np.abs(host(lse) - l_ref)) < 1e-4
    d, dd = rnd(ops, rng, (B, H, T, D))
    grads = ops._attention_backward_ref(dd, qd, kd, vd, out, lse)
    refs = ref.attention_backward(d, q, k, v, host(out), host(lse))
    for a, b in zip(grads, refs):
        assert rel(host(a), b) < tol(ops, 4)


# ------------------------------------------------------------------------------------------------
def test_flat_buffer_hooks(ops):
    rng = np.random.default_rng(10)
    n = 64 * 37
    p0 = rng.standard_normal(n).astype(np.float32)
    g0 = rng.standard_normal(n).astype(np.float32) * 3
    m0 = rng.standard_normal(n).astype(np.float32) * 0.1
    v0 = rng.random(n).astype(np.float32) * 0.1
    mask = (rng.random(n) < 0.7).astype(np.float32)
    # global norm
    nrm = ops.global_norm(cp.asarray(g0))
    assert abs(float(nrm) - np.linalg.norm(g0.astype(np.float64))) < 1e-5 * np.linalg.norm(g0)
    bad = g0.copy()
    bad[5] = np.inf
    assert not math.isfinite(float(ops.global_norm(cp.asarray(bad))))
    # adamw with loss scale 8 and clipping at 1.0
    p, g, m, v = (cp.asarray(a.copy()) for a in (p0, g0 * 8, m0, v0))
    lr, b1, b2, eps, wd, step = 1e-2, 0.9, 0.95, 1e-8, 0.1, 3
    nrm8 = ops.global_norm(g)
    ops.adamw_step(p, g, m, v, cp.asarray(mask), lr, b1, b2, eps, wd, step,
                   grad_scale=1 / 8, clip=1.0, norm=nrm8)
    # the reference AdamW (numpy_ops.adamw_step) in float64 on the same inputs
    P, G, M, Vv = (a.astype(np.float64) for a in (p0, g0 * 8, m0, v0))
    ref.adamw_step(P, G, M, Vv, mask.astype(np.float64), lr, b1, b2, eps, wd, step,
                   grad_scale=1 / 8, clip=1.0, norm=ref.global_norm(G))
    assert rel(host(p), P) < 1e-6 and rel(host(m), M) < 1e-5 and rel(host(v), Vv) < 1e-5
    if ops.precision != "fp32":   # the compute copy was refreshed by the step
        assert rel(host(ops.compute_weights(p)), host(p)) < tol(ops)
    # an overflowing step changes nothing
    p2 = p.copy()
    ops.adamw_step(p, cp.asarray(bad), m, v, cp.asarray(mask), lr, b1, b2, eps, wd, step + 1,
                   norm=ops.global_norm(cp.asarray(bad)))
    assert bool(cp.all(p == p2))
    # cast
    cw = ops.compute_weights(cp.asarray(p0))
    assert rel(host(cw), p0.astype(ops.act_dtype).astype(np.float64)) == 0.0


# ------------------------------------------------------------------------------------------------
# the whole model: GPU loss and every gradient tensor against the CPU model (float64)

def _model_pair(precision, **cfg_kw):
    from bytemodel.config import ModelConfig
    from bytemodel.model import Model, layout
    cfg = ModelConfig(**cfg_kw)
    cpu = Model(cfg, ref, dtype=np.float64)
    cpu.init_weights(seed=3)
    flat32 = cpu.params.astype(np.float32)
    cpu.load_flat(flat32)
    ops = cuda_backend(precision)
    gpu = Model(cfg, ops, dtype=np.float32)
    gpu.load_flat(flat32)
    return cfg, cpu, gpu, layout(cfg)


@pytest.mark.parametrize("precision,tol_g", [("fp16", 3e-2), ("fp32", 1e-4), ("bf16", 1.5e-1)])
@pytest.mark.parametrize("cfg_kw", [
    # head dim 64, grouped-query (2 query heads on 1 kv head): the flash kernels
    dict(vocab_size=320, d_model=128, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=200, context=64),
    # head dim 16 (simple attention path), odd d_ff (scalar SwiGLU), tied head
    dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=52, context=64, tie_embeddings=True),
])
def test_model_gradients_match_cpu(precision, tol_g, cfg_kw):
    cfg, cpu, gpu, lay = _model_pair(precision, **cfg_kw)
    rng = np.random.default_rng(11)
    B, T = 2, 37
    idx = rng.integers(0, cfg.vocab_size, size=(B, T))
    tgt = rng.integers(0, cfg.vocab_size, size=(B, T))
    N = B * T
    losses_c = cpu.forward(idx, tgt)
    cpu.backward(np.full(N, 1.0 / N))
    scale = 1024.0 if precision != "fp32" else 1.0       # loss scaling keeps fp16 grads normal
    losses_g = gpu.forward(cp.asarray(idx), cp.asarray(tgt))
    gpu.backward(cp.full(N, scale / N, dtype=cp.float32))
    assert abs(float(losses_g.mean()) - losses_c.mean()) < (2e-3 if precision != "bf16" else 2e-2)
    assert rel(host(losses_g), losses_c) < tol_g
    g_gpu = cp.asnumpy(gpu.grads).astype(np.float64) / scale
    from bytemodel.model import views
    gv, cv = views(g_gpu, cfg), views(cpu.grads, cfg)
    worst = []
    for name, _, _ in lay:
        e = rel(gv[name], cv[name])
        worst.append((e, name))
        assert e < tol_g, f"{name}: relative error {e:.2e} (tol {tol_g:.0e})"
    print(f"{precision}: worst gradient errors", sorted(worst)[-3:])


def test_kv_cache_forward_matches_cpu():
    """Generation's cached forward (prompt, then one token at a time) on the GPU against the CPU."""
    cfg, cpu, gpu, _ = _model_pair("fp16", vocab_size=257, d_model=128, n_layers=2, n_heads=2,
                                   n_kv_heads=1, d_ff=200, context=64)
    rng = np.random.default_rng(13)
    toks = rng.integers(0, cfg.vocab_size, size=(2, 9))
    cc, gc = cpu.new_cache(2, 16), gpu.new_cache(2, 16)
    pos = 0
    for chunk in (toks[:, :6], toks[:, 6:7], toks[:, 7:8], toks[:, 8:9]):
        lc = cpu.forward_cached(chunk, cc, pos)
        lg = gpu.forward_cached(cp.asarray(chunk), gc, pos)
        assert rel(host(lg), lc) < 2e-2, pos   # fp16 activations through 2 layers
        pos += chunk.shape[1]
