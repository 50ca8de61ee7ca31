"""The TMA-fed Hopper forward (gpu/flash_tma.cu's flash_fwd_w: a producer warp issues every copy
as a bulk tensor copy completing on mbarriers, the math warpgroups never load; issue 28) against
the float64 reference, with test_flash_attention's tolerances (out 4e-3, lse 2e-4 absolute; bf16 8x),
and against the wgmma forward it replaced: at the same key tile (BN) the arithmetic of a row is the
same, so the bits must be too. Grouped-query heads, S > T (queries at the end of a longer key
range), rows past a query tile and keys past a key tile, strided q/k/v views of one buffer, a
slice of a longer cache, and a launch in slices of the batch. Skipped without a Hopper GPU."""
import numpy as np
import pytest

from conftest import cuda_backend, gpu_marks

cp = pytest.importorskip("cupy")
pytestmark = gpu_marks(cp)

from bytemodel.ops import numpy_ops as ref  # noqa: E402
from bytemodel.ops import cuda_ops  # noqa: E402
from test_flash_attention import host, rel  # noqa: E402

KERNELS = sorted(cuda_ops.TMA_FWD_KERNELS)


def _hopper_or_skip(precision):
    ops = cuda_backend(precision, hopper=True)     # skipped off compute capability 9.x
    return ops


def _views(ops, rng, B, H, K, T, S, D):
    x = rng.standard_normal((B, S, H + 2 * K, D)).astype(ops.act_dtype)
    buf = cp.asarray(x)
    return (buf[:, S - T:, :H].transpose(0, 2, 1, 3), buf[:, :, H:H + K].transpose(0, 2, 1, 3),
            buf[:, :, H + K:].transpose(0, 2, 1, 3))


def _tma_forward(ops, name, q, k, v):
    B, H, T, D = q.shape
    q, qs = ops._bhtd(q)
    k, ks = ops._bhtd(k)
    v, vs = ops._bhtd(v)
    obuf = ops._empty((B, T, H, D))
    out = obuf.transpose(0, 2, 1, 3)
    lse = cp.empty((B, H, T), dtype=cp.float32)
    ops._attention_forward_tma(ops._tma_kernel(name), q, qs, k, ks, v, vs, out, ops._strides(out), lse)
    return out, lse


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("T,S", [(1, 1), (100, 100), (129, 300), (300, 429), (1000, 1000)])
def test_tma_forward_against_the_reference_and_the_wgmma_forward(precision, name, T, S, monkeypatch):
    ops = _hopper_or_skip(precision)
    D, BM, BN = cuda_ops.TMA_FWD_KERNELS[name][:3]
    f = 1.0 if precision == "fp16" else 8.0
    rng = np.random.default_rng(T * 7 + S + D)
    q, k, v = _views(ops, rng, 2, 6, 2, T, S, D)
    out, lse = _tma_forward(ops, name, q, k, v)
    cp.cuda.Device().synchronize()
    o_ref, l_ref = ref.attention_forward(host(q), host(k), host(v))
    assert rel(host(out), o_ref) < 4e-3 * f
    assert float(np.max(np.abs(host(lse) - l_ref))) < 2e-4 * f
    wgmma = cuda_ops.FLASH_FWD_HOPPER[D]
    monkeypatch.setattr(cuda_ops, "FLASH_FWD_TMA", {})
    out2, lse2 = ops.attention_forward(q, k, v)      # the wgmma forward
    if cuda_ops.HOPPER_FWD_KERNELS[wgmma][2] == BN:   # the same key tile: the same arithmetic a row
        assert cp.array_equal(out, out2) and cp.array_equal(lse, lse2)


@pytest.mark.parametrize("name", KERNELS)
def test_tma_forward_on_a_cache_slice_and_in_batch_slices(name, monkeypatch):
    """k / v a slice of a longer cache (the map's rows end at S: the keys past it read as zeros
    and are masked), and more batch x heads than one grid holds (the maps name the whole tensor,
    each launch its first batch row)."""
    ops = _hopper_or_skip("fp16")
    D = cuda_ops.TMA_FWD_KERNELS[name][0]
    rng = np.random.default_rng(5)
    B, H, K, T, S, Smax = 2, 4, 2, 5, 133, 256
    q = cp.asarray(rng.standard_normal((B, H, T, D)).astype(np.float16))
    kc = cp.asarray(rng.standard_normal((B, K, Smax, D)).astype(np.float16) * 3)
    vc = cp.asarray(rng.standard_normal((B, K, Smax, D)).astype(np.float16))
    out, lse = _tma_forward(ops, name, q, kc[:, :, :S], vc[:, :, :S])
    o_ref, l_ref = ref.attention_forward(host(q), host(kc[:, :, :S]), host(vc[:, :, :S]))
    assert rel(host(out), o_ref) < 4e-3 and np.max(np.abs(host(lse) - l_ref)) < 2e-4
    monkeypatch.setattr(cuda_ops, "GRID_Y_MAX", 12)      # slices of 3 batch rows x 4 heads
    B = 7
    q = cp.asarray(rng.standard_normal((B, H, 70, D)).astype(np.float16))
    k = cp.asarray(rng.standard_normal((B, K, 70, D)).astype(np.float16))
    v = cp.asarray(rng.standard_normal((B, K, 70, D)).astype(np.float16))
    out, lse = _tma_forward(ops, name, q, k, v)
    o_ref, l_ref = ref.attention_forward(host(q), host(k), host(v))
    assert rel(host(out), o_ref) < 4e-3 and np.max(np.abs(host(lse) - l_ref)) < 2e-4


def test_attention_forward_runs_the_tma_kernel_when_chosen(monkeypatch):
    """FLASH_FWD_TMA (shipped at head dims 64 and 128; BYTEMODEL_FWD_TMA) sends attention_forward
    through the TMA kernel of that head dim (its cached function is there afterwards, the wgmma
    forward's is not), and attention dropout through the wgmma kernels (no TMA twin)."""
    ops = _hopper_or_skip("fp16")
    monkeypatch.setattr(cuda_ops, "FLASH_FWD_TMA", {64: "flash_fwd_w64_m192"})
    rng = np.random.default_rng(2)
    q, k, v = _views(ops, rng, 1, 4, 4, 64, 64, 64)
    out, _ = ops.attention_forward(q, k, v)
    assert ("flash_hopper.cu", "flash_fwd_w64_m192") in ops._fns
    assert ("flash_hopper.cu", cuda_ops.FLASH_FWD_HOPPER[64]) not in ops._fns
    o_ref, _ = ref.attention_forward(host(q), host(k), host(v))
    assert rel(host(out), o_ref) < 4e-3
    ops.attention_forward(q, k, v, drop=(0.1, (7, 9), 0))
    assert ("flash_hopper.cu", cuda_ops.FLASH_FWD_HOPPER[64] + "_drop") in ops._fns


def test_a_tma_forward_that_cannot_run_falls_back_to_the_wgmma_forward(monkeypatch, capsys):
    """Where the tensor map cannot be made (an older driver), the forward says so once and runs the
    wgmma kernel: the same result, and the Hopper backward stays on."""
    ops = _hopper_or_skip("fp16")

    def refuse(*a, **k):
        raise RuntimeError("cuTensorMapEncodeTiled failed (1)")
    monkeypatch.setattr(cuda_ops, "_tma_map", refuse)
    rng = np.random.default_rng(4)
    q, k, v = _views(ops, rng, 1, 4, 4, 70, 70, 64)
    out, _ = ops.attention_forward(q, k, v)
    o_ref, _ = ref.attention_forward(host(q), host(k), host(v))
    assert rel(host(out), o_ref) < 4e-3
    assert not ops.tma and ops.hopper and ("flash_hopper.cu", cuda_ops.FLASH_FWD_HOPPER[64]) in ops._fns
    ops.attention_forward(q, k, v)
    assert capsys.readouterr().err.count("TMA attention forward is unavailable") == 1


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("T,S", [(100, 100), (129, 300), (1000, 1000)])
def test_tma_dropout_twin_gives_the_wgmma_dropout_bytes(precision, D, T, S, monkeypatch):
    """With attention dropout (TMA_DROP, off until this passes on a GPU) the TMA forward draws the
    wgmma _drop forward's mask and gives its bytes (the same key tile, the same arithmetic a row),
    also in slices of the batch (the mask's counter moved to each slice's first row)."""
    ops = _hopper_or_skip(precision)
    rng = np.random.default_rng(T + S + D)
    q, k, v = _views(ops, rng, 3, 4, 2, T, S, D)
    drop = (0.2, (123, 456), 789)
    monkeypatch.setattr(cuda_ops, "TMA_DROP", True)
    monkeypatch.setattr(cuda_ops, "FLASH_FWD_TMA", {64: "flash_fwd_w64", 128: "flash_fwd_w128"})
    out, lse = ops.attention_forward(q, k, v, drop=drop)
    assert ("flash_hopper.cu", cuda_ops.FLASH_FWD_TMA[D] + "_drop") in ops._fns
    monkeypatch.setattr(cuda_ops, "FLASH_FWD_TMA", {})
    out2, lse2 = ops.attention_forward(q, k, v, drop=drop)
    assert cp.array_equal(out, out2) and cp.array_equal(lse, lse2)
    monkeypatch.setattr(cuda_ops, "FLASH_FWD_TMA", {D: {64: "flash_fwd_w64", 128: "flash_fwd_w128"}[D]})
    monkeypatch.setattr(cuda_ops, "GRID_Y_MAX", 4)                  # one batch row a launch
    out3, _ = ops.attention_forward(q, k, v, drop=drop)
    assert cp.array_equal(out, out3)
