"""FlashAttention-2 forward/backward (gpu/flash_attn.cu) against the NumPy float64
reference on fresh random inputs. Skipped without CuPy and a GPU.

Inputs are fp16 (bf16) values; the reference runs in float64 on the same values. Tolerances
(norm-relative):
    out         4e-3 (fp16): P is rounded to fp16 before P @ V (2^-11 relative per element) and
                O once more at the end; errors measured ~1e-3.
    lse         2e-4 absolute: fp32 statistics over fp32-accumulated scores.
    dq, dk, dv  1e-2 (fp16): P and dS are rounded to fp16 before their products, dQ sums fp32
                partials from many key tiles; errors measured ~2e-3 .. 4e-3.
bf16 gets 8x these (its unit roundoff is 8x fp16's).
"""
import math

import numpy as np
import pytest

from conftest import cuda_backend, cuda_backends, gpu_marks

cp = pytest.importorskip("cupy")
pytestmark = gpu_marks(cp)

from bytemodel.ops import numpy_ops as ref  # noqa: E402

backend = cuda_backends()


def rel(a, b):
    """||a - b|| / ||b||, with ||b|| floored at an RMS of 1e-2 per element: at T = 1 the exact dq
    and dk are zero (softmax over one key) and the kernel's rounding noise is all there is."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape
    assert np.all(np.isfinite(a)), "non-finite output"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-2 * math.sqrt(b.size)))


def host(a):
    return cp.asnumpy(a).astype(np.float64)


def check(precision, B, H, K, T, S, D, seed, strided_dout=False):
    ops = backend(precision)
    f = 1.0 if precision == "fp16" else 8.0
    rng = np.random.default_rng(seed)
    dt = ops.act_dtype

    def r(shape):
        x = rng.standard_normal(shape).astype(dt)
        return x.astype(np.float64), cp.asarray(x)

    q, qd = r((B, H, T, D))
    k, kd = r((B, K, S, D))
    v, vd = r((B, K, S, D))
    out, lse = ops.attention_forward(qd, kd, vd)
    o_ref, l_ref = ref.attention_forward(q, k, v)
    e_o = rel(host(out), o_ref)
    e_l = float(np.max(np.abs(host(lse) - l_ref)))
    assert e_o < 4e-3 * f, f"out rel err {e_o:.2e}"
    assert e_l < 2e-4 * f, f"lse abs err {e_l:.2e}"
    d, dd = r((B, H, T, D))
    if strided_dout:   # the layout merge_heads_backward hands over: (B, T, H, D) seen as (B, H, T, D)
        buf = cp.ascontiguousarray(dd.transpose(0, 2, 1, 3))
        dd = buf.transpose(0, 2, 1, 3)
    if strided_dout:   # and q, k, v as qkv_rope_forward hands them over: views of one buffer
        qkv = cp.concatenate([x.transpose(0, 2, 1, 3).reshape(B, T, -1, D) for x in (qd, kd, vd)], axis=2)
        qd = qkv[:, :, :H].transpose(0, 2, 1, 3)
        kd = qkv[:, :, H:H + K].transpose(0, 2, 1, 3)
        vd = qkv[:, :, H + K:].transpose(0, 2, 1, 3)
    dq, dk, dv = ops.attention_backward(dd, qd, kd, vd, out, lse)
    refs = ref.attention_backward(d, q, k, v, host(out), host(lse))
    errs = [rel(host(a), b) for a, b in zip((dq, dk, dv), refs)]
    assert max(errs) < 1e-2 * f, f"grad rel errs {errs}"
    return e_o, e_l, errs


@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("T", [1, 17, 128, 1000])
def test_flash_fp16(T, D):
    # grouped-query: 4 query heads on 2 kv heads
    check("fp16", 2, 4, 2, T, T, D, seed=T * 1000 + D)


def test_flash_covers_every_shipped_head_dim():
    from bytemodel.ops.cuda_ops import FLASH_BWD, FLASH_FWD
    assert set(FLASH_FWD) == set(FLASH_BWD) == {32, 64, 128}    # the D test_flash_fp16 checks


@pytest.mark.slow
@pytest.mark.parametrize("D", [64, 128])
def test_flash_fp16_long(D):
    check("fp16", 1, 2, 1, 4096, 4096, D, seed=D)


@pytest.mark.parametrize("D", [64, 128])
def test_flash_strided_dout(D):
    check("fp16", 2, 3, 3, 77, 77, D, seed=5 + D, strided_dout=True)


@pytest.mark.parametrize("T,S", [(1, 70), (5, 133), (64, 200)])
def test_flash_kv_cache(T, S):
    """S > T (generation with a KV cache); k/v are slices of a longer cache buffer."""
    ops = backend("fp16")
    rng = np.random.default_rng(S)
    B, H, K, D, Smax = 2, 4, 2, 64, 256
    q = rng.standard_normal((B, H, T, D)).astype(np.float16)
    kc = rng.standard_normal((B, K, Smax, D)).astype(np.float16)
    vc = rng.standard_normal((B, K, Smax, D)).astype(np.float16)
    kcd, vcd = cp.asarray(kc), cp.asarray(vc)
    out, lse = ops.attention_forward(cp.asarray(q), kcd[:, :, :S], vcd[:, :, :S])
    o_ref, l_ref = ref.attention_forward(q.astype(np.float64), kc[:, :, :S].astype(np.float64),
                                         vc[:, :, :S].astype(np.float64))
    assert rel(host(out), o_ref) < 4e-3
    assert np.max(np.abs(host(lse) - l_ref)) < 2e-4


def test_flash_more_streams_than_one_grid_holds():
    """Batch x heads above CUDA's 65,535 grid rows (a compressor's thousands of streams, one token
    each): the forward is launched in slices of the batch; rows in every slice, the first and the
    last, match the reference."""
    from bytemodel.ops.cuda_ops import GRID_Y_MAX
    ops = backend("fp16")
    rng = np.random.default_rng(3)
    H, K, T, S, D = 12, 12, 1, 40, 64
    B = GRID_Y_MAX // H * 2 + 3                      # three slices, the last of 3 streams
    q = cp.asarray(rng.standard_normal((B, H, T, D)).astype(np.float16))
    k = cp.asarray(rng.standard_normal((B, K, S, D)).astype(np.float16))
    v = cp.asarray(rng.standard_normal((B, K, S, D)).astype(np.float16))
    out, lse = ops.attention_forward(q, k, v)
    rows = np.r_[0:4, GRID_Y_MAX // H - 2:GRID_Y_MAX // H + 2, B - 5:B]
    o_ref, l_ref = ref.attention_forward(*(host(x[rows]) for x in (q, k, v)))
    assert rel(host(out[rows]), o_ref) < 4e-3
    assert np.max(np.abs(host(lse[rows]) - l_ref)) < 2e-4


@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("n", [1, 37, 128])
def test_attention_decode(D, n):
    """One query per sequence against the first n keys of a cache (gpu/decode.cu's kernel), with
    grouped-query heads, against the float64 reference; the same bits on a second call (no atomics),
    and the FlashAttention path it replaces agrees within the same tolerance."""
    ops = backend("fp16")
    rng = np.random.default_rng(100 * D + n)
    B, H, K, Smax = 300, 4, 2, 128
    q = rng.standard_normal((B, H, 1, D)).astype(np.float16)
    kc = rng.standard_normal((B, K, Smax, D)).astype(np.float16)
    vc = rng.standard_normal((B, K, Smax, D)).astype(np.float16)
    qd, kcd, vcd = cp.asarray(q), cp.asarray(kc), cp.asarray(vc)
    out = ops.attention_decode(qd, kcd, vcd, n)
    o_ref, _ = ref.attention_forward(q.astype(np.float64), kc[:, :, :n].astype(np.float64),
                                     vc[:, :, :n].astype(np.float64))
    assert out.shape == (B, H, 1, D)
    assert rel(host(out), o_ref) < 4e-3
    assert cp.array_equal(out, ops.attention_decode(qd, kcd, vcd, n))
    flash, _ = ops.attention_forward(qd, kcd[:, :, :n], vcd[:, :, :n])
    assert rel(host(flash), o_ref) < 4e-3


def test_attention_decode_strided_query():
    """The query as qkv_rope_forward hands it over (a view into one qkv buffer)."""
    ops = backend("fp16")
    rng = np.random.default_rng(9)
    B, H, K, D, Smax, n = 5, 4, 4, 64, 16, 9
    qkv = cp.asarray(rng.standard_normal((B, 1, H + 2 * K, D)).astype(np.float16))
    q = qkv[:, :, :H].transpose(0, 2, 1, 3)                     # (B, H, 1, D), not contiguous
    kc = cp.asarray(rng.standard_normal((B, K, Smax, D)).astype(np.float16))
    vc = cp.asarray(rng.standard_normal((B, K, Smax, D)).astype(np.float16))
    o_ref, _ = ref.attention_forward(host(q), host(kc)[:, :, :n], host(vc)[:, :, :n])
    assert rel(host(ops.attention_decode(q, kc, vc, n)), o_ref) < 4e-3


@pytest.mark.parametrize("T,D", [(17, 64), (300, 128)])
def test_flash_bf16(T, D):
    check("bf16", 2, 4, 1, T, T, D, seed=7 * T + D)


def test_flash_matches_simple_path():
    """The two GPU attention paths agree (fp16 flash vs fp32 cuBLAS + softmax)."""
    ops = backend("fp16")
    rng = np.random.default_rng(0)
    q, k, v = (cp.asarray(rng.standard_normal((2, 4, 200, 64)).astype(np.float16)) for _ in range(3))
    o1, l1 = ops.attention_forward(q, k, v)
    o2, l2 = ops._attention_forward_ref(q, k, v)
    assert rel(host(o1), host(o2)) < 4e-3
    assert float(cp.max(cp.abs(l1 - l2))) < 2e-4


def hopper_gpu():
    return int(cp.cuda.Device().compute_capability) // 10 == 9


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("hopper", [True, False])
@pytest.mark.parametrize("T,S", [(1, 1), (100, 100), (129, 300), (1000, 1000)])
def test_forward_on_both_paths(precision, D, hopper, T, S):
    """The wgmma forward (gpu/flash_hopper.cu, chosen on compute capability 9.x) and the
    FlashAttention-2 forward it replaces there, each against the float64 reference: grouped-query
    heads, S > T (a query block starting mid-cache), rows past a 128-row tile and keys past a key
    tile, strided q/k/v views of one buffer, the tolerances of `check`. The Hopper kernel must be
    the one that ran (its cached function), so a silent fall-back to FA2 fails."""
    ops = cuda_backend(precision, hopper)
    f = 1.0 if precision == "fp16" else 8.0
    rng = np.random.default_rng(T * 7 + S + D)
    B, H, K = 2, 6, 2
    x = rng.standard_normal((B, S, H + 2 * K, D)).astype(ops.act_dtype)
    buf = cp.asarray(x)
    qd = buf[:, S - T:, :H].transpose(0, 2, 1, 3)
    kd = buf[:, :, H:H + K].transpose(0, 2, 1, 3)
    vd = buf[:, :, H + K:].transpose(0, 2, 1, 3)
    out, lse = ops.attention_forward(qd, kd, vd)
    o_ref, l_ref = ref.attention_forward(host(qd), host(kd), host(vd))
    assert rel(host(out), o_ref) < 4e-3 * f
    assert float(np.max(np.abs(host(lse) - l_ref))) < 2e-4 * f
    from bytemodel.ops.cuda_ops import FLASH_FWD_HOPPER, FLASH_FWD_TMA   # the TMA forward where shipped
    assert (("flash_hopper.cu", FLASH_FWD_TMA.get(D, FLASH_FWD_HOPPER[D])) in ops._fns) == hopper


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("hopper", [True, False])
@pytest.mark.parametrize("T,S", [(1, 1), (100, 100), (129, 300), (300, 129 + 300), (1000, 1000)])
def test_backward_on_both_paths(precision, D, hopper, T, S):
    """The wgmma backward (gpu/flash_hopper.cu's flash_bwd_h*, chosen on compute capability 9.x)
    and FlashAttention-2's, each against the float64 reference with `check`'s tolerances:
    grouped-query heads, S > T (query tiles that start inside a key block), a partial last key
    block and query tile, q/k/v strided views of one buffer, dO
    strided as merge_heads_backward hands it over. The Hopper kernel must be the one that ran."""
    from bytemodel.ops.cuda_ops import FLASH_BWD_HOPPER
    ops = cuda_backend(precision, hopper)
    f = 1.0 if precision == "fp16" else 8.0
    rng = np.random.default_rng(T * 7 + S + D + 1)
    B, H, K = 2, 6, 2
    buf = cp.asarray(rng.standard_normal((B, S, H + 2 * K, D)).astype(ops.act_dtype))
    qd = buf[:, S - T:, :H].transpose(0, 2, 1, 3)
    kd = buf[:, :, H:H + K].transpose(0, 2, 1, 3)
    vd = buf[:, :, H + K:].transpose(0, 2, 1, 3)
    out, lse = ops.attention_forward(qd, kd, vd)
    dbuf = cp.asarray(rng.standard_normal((B, T, H, D)).astype(ops.act_dtype))
    dd = dbuf.transpose(0, 2, 1, 3)
    dq, dk, dv = ops.attention_backward(dd, qd, kd, vd, out, lse)
    refs = ref.attention_backward(host(dd), host(qd), host(kd), host(vd), host(out), host(lse))
    errs = [rel(host(a), r) for a, r in zip((dq, dk, dv), refs)]
    assert max(errs) < 1e-2 * f, f"grad rel errs {errs}"
    assert (("flash_hopper.cu", FLASH_BWD_HOPPER[D][0]) in ops._fns) == hopper


def test_hopper_forward_falls_back_to_fa2(monkeypatch, capsys):
    """Where the sm_90a module cannot be built (an NVRTC or CuPy without what it uses), the
    forward says so once and runs FlashAttention-2, with the same results."""
    from bytemodel.ops import cuda_ops
    if not hopper_gpu():
        pytest.skip("the wgmma forward needs compute capability 9.x")

    def broken(*a, **k):
        raise RuntimeError("flash_hopper.cu did not compile: (planted)")
    monkeypatch.setattr(cuda_ops, "_hopper_module", broken)
    ops = cuda_ops.CudaBackend("fp16", hopper=True)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 100, 64)).astype(np.float16) for _ in range(3))
    out, _ = ops.attention_forward(cp.asarray(q), cp.asarray(k), cp.asarray(v))
    o_ref, _ = ref.attention_forward(*(x.astype(np.float64) for x in (q, k, v)))
    assert rel(host(out), o_ref) < 4e-3
    assert ops.hopper is False
    assert "Hopper attention kernels are unavailable" in capsys.readouterr().err
