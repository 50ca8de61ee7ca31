"""Attention dropout on the GPU (flash_fwd_d*_drop / flash_bwd_d*_drop in gpu/flash_attn.cu, on
Hopper at head dims 64 and 128 flash_fwd_h*_drop / flash_bwd_h*_drop in gpu/flash_hopper.cu, and
the cuBLAS + softmax path of fp32 and other head dims) against the NumPy reference
(numpy_ops.attention_forward/backward with the same drop = (p, key, offset)). The mask and value
checks run on both flash paths where the GPU has both (`hopper` True: the wgmma kernels, asserted
to be the ones that ran; False: FlashAttention-2's). Skipped without CuPy and a GPU (CI).

What is checked and to what tolerance:
- The mask, bit for bit: read back through V (forward) and dO (backward) made of one-hot rows,
  so an output entry is exactly 0 where the probability was dropped (or is causally masked) and
  at least ~1/(4 S) where kept (inputs scaled so that no kept probability comes near fp16's
  or bf16's underflow); compared with numpy_ops.attn_keep over the whole (B, H, T, S) counter.
- Values: out, lse, dq, dk, dv against the float64 reference on the same rounded inputs, the
  tolerances of tests/test_flash_attention.py (out 4e-3, lse 2e-4 absolute, grads 1e-2, x8 for
  bf16, norm-relative), their reasons unchanged: the kept probabilities are scaled by
  256 / (256 - thr) <= 2 at p <= 0.5 before the same single rounding to fp16/bf16. fp32: 1e-4
  (fp32 products and sums against float64, as tests/test_cuda_dropout.py's model check). A wrong
  mask is off by order 1 (each value check also asserts the undropped output is > 5% away).
- p = 0 takes the kernels without dropout (the same bytes as drop=None), and the dropout kernels
  with threshold 0 (keep all, scale 1) give the same bytes as those: the mask is the only change
  (on each path: FA2's twins against FA2's kernels, the wgmma twins against the wgmma kernels).
- Determinism: the same call twice gives the same bytes; another key gives another output.
"""
import math

import numpy as np
import pytest

from conftest import cuda_backend, cuda_backends, gpu_marks

cp = pytest.importorskip("cupy")
pytestmark = gpu_marks(cp)

from bytemodel.model import dropout_key  # noqa: E402
from bytemodel.ops import cuda_ops  # noqa: E402
from bytemodel.ops import numpy_ops as ref  # noqa: E402

backend = cuda_backends()
_paths = {}


def path_backend(precision, hopper):
    """The backend on one flash path (conftest.cuda_backend's hopper), made once per module."""
    if (precision, hopper) not in _paths:
        _paths[precision, hopper] = cuda_backend(precision, hopper)
    return _paths[precision, hopper]


def ran_hopper_drop(ops, D):
    """Whether both wgmma dropout kernels of head dim D have run on this backend (none exist at
    other head dims)."""
    return D in cuda_ops.FLASH_FWD_HOPPER and (("flash_hopper.cu", cuda_ops.FLASH_FWD_HOPPER[D] + "_drop") in ops._fns
            and ("flash_hopper.cu", cuda_ops.FLASH_BWD_HOPPER[D][0] + "_drop") in ops._fns)


def host(a):
    return cp.asnumpy(a).astype(np.float64)


def rel(a, b):
    """||a - b|| / ||b|| (||b|| floored at an RMS of 1e-2, as tests/test_flash_attention.py)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape and np.all(np.isfinite(a))
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-2 * math.sqrt(b.size)))


def inputs(ops, shapes, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    out = []
    for shape in shapes:
        x = (rng.standard_normal(shape) * scale).astype(ops.act_dtype)
        out.append((x.astype(np.float64), cp.asarray(x)))
    return out


def whole_mask(drop, B, H, T, S):
    """The reference's mask of every probability (B, H, T, S), causal part True/False as drawn."""
    return ref.attn_keep(drop, B, H, T, S, 0, T, S)[0]


@pytest.mark.parametrize("hopper", [True, False])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("D,T,offset", [(64, 200, 0), (64, 77, 6), (128, 128, 1000), (128, 130, 8),
                                          (32, 52, 4), (32, 50, 3)])
def test_mask_bit_for_bit(precision, D, T, offset, hopper):
    """Forward: V one-hot on a block of D keys, so out[.., i, c] = P Z[i, key c] / l exactly 0
    where dropped. Backward: dO one-hot on a block of D queries, so dV[.., j, c] = (P Z)[query c, j]
    (K = H: no group sum). Aligned (offset and S multiples of 4: the shuffle path) and not."""
    if hopper and D not in cuda_ops.FLASH_FWD_HOPPER:
        pytest.skip("no wgmma kernels at this head dim")
    ops = path_backend(precision, hopper)
    B, H, S, p = 2, 3, T, 0.3
    drop = (p, dropout_key(11, 4, 7), offset)
    (q, qd), (k, kd) = inputs(ops, [(B, H, T, D), (B, H, S, D)], seed=D + T, scale=0.3)
    keep = whole_mask(drop, B, H, T, S)
    causal = np.tril(np.ones((T, S), dtype=bool), S - T)
    for c0 in range(0, S, D):                     # keys c0 .. c0 + D - 1 through the forward
        n = min(D, S - c0)
        v = np.zeros((B, H, S, D), dtype=ops.act_dtype)
        v[:, :, c0:c0 + n, :n] = np.eye(n)
        out, lse = ops.attention_forward(qd, kd, cp.asarray(v), drop=drop)
        got = host(out)[..., :n] != 0
        want = keep[..., c0:c0 + n] & causal[:, c0:c0 + n]
        assert np.array_equal(got, want), f"forward mask differs at keys {c0}.., {np.sum(got != want)} entries"
    out, lse = ops.attention_forward(qd, kd, kd, drop=drop)
    for r0 in range(0, T, D):                     # queries r0 .. r0 + D - 1 through the backward
        n = min(D, T - r0)
        do = np.zeros((B, H, T, D), dtype=ops.act_dtype)
        do[:, :, r0:r0 + n, :n] = np.eye(n)
        _, _, dv = ops.attention_backward(cp.asarray(do), qd, kd, kd, out, lse, drop=drop)
        got = host(dv)[..., :n].swapaxes(-1, -2) != 0          # (B, H, query, key)
        want = keep[:, :, r0:r0 + n] & causal[r0:r0 + n]
        assert np.array_equal(got, want), f"backward mask differs at queries {r0}.., {np.sum(got != want)} entries"
    assert ran_hopper_drop(ops, D) == (hopper and D in cuda_ops.FLASH_FWD_HOPPER)


def check_values(precision, B, H, K, T, S, D, p, offset, seed, hopper=None):
    """hopper None: the default backend (the reference path's tests); True / False: that flash path."""
    ops = backend(precision) if hopper is None else path_backend(precision, hopper)
    f = {"fp16": 1.0, "bf16": 8.0}.get(precision)
    drop = (p, dropout_key(seed, 2, 3), offset)
    (q, qd), (k, kd), (v, vd), (d, dd) = inputs(ops, [(B, H, T, D), (B, K, S, D), (B, K, S, D), (B, H, T, D)], seed)
    out, lse = ops.attention_forward(qd, kd, vd, drop=drop)
    o_ref, l_ref = ref.attention_forward(q, k, v, drop=drop)
    dq, dk, dv = ops.attention_backward(dd, qd, kd, vd, out, lse, drop=drop)
    g_ref = ref.attention_backward(d, q, k, v, host(out), host(lse), drop=drop)
    e_o, e_l = rel(host(out), o_ref), float(np.max(np.abs(host(lse) - l_ref)))
    e_g = [rel(host(a), b) for a, b in zip((dq, dk, dv), g_ref)]
    if f is None:   # fp32: cuBLAS + softmax
        assert e_o < 1e-4 and e_l < 1e-4 and max(e_g) < 1e-4, (e_o, e_l, e_g)
    else:
        assert e_o < 4e-3 * f, f"out rel err {e_o:.2e}"
        assert e_l < 2e-4 * f, f"lse abs err {e_l:.2e}"
        assert max(e_g) < 1e-2 * f, f"grad rel errs {e_g}"
    # the mask matters: the reference without dropout is far off (so the check above can fail)
    assert rel(host(out), ref.attention_forward(q, k, v)[0]) > 0.05
    if hopper is not None:
        assert ran_hopper_drop(ops, D) == (hopper and D in cuda_ops.FLASH_FWD_HOPPER)
    return e_o, e_l, e_g


@pytest.mark.parametrize("hopper", [True, False])
@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("T,offset", [(17, 0), (128, 4 * 12345), (300, 2)])
def test_flash_fp16_against_reference(T, D, offset, hopper):
    if hopper and D not in cuda_ops.FLASH_FWD_HOPPER:
        pytest.skip("no wgmma kernels at this head dim")
    check_values("fp16", 2, 4, 2, T, T, D, 0.2, offset, seed=T + D, hopper=hopper)


@pytest.mark.parametrize("hopper", [True, False])
@pytest.mark.parametrize("T,D,p", [(64, 64, 0.1), (257, 64, 0.5), (200, 128, 0.3)])
def test_flash_bf16_against_reference(T, D, p, hopper):
    check_values("bf16", 2, 4, 1, T, T, D, p, 40, seed=T * 3 + D, hopper=hopper)


@pytest.mark.parametrize("precision,D", [("fp32", 64), ("fp16", 16)])
def test_reference_path_against_reference(precision, D):
    """fp32 (cuBLAS + softmax) and a head dim without a flash kernel (fp16, D 16) draw the mask
    with CuPy, per block of the simple path."""
    check_values(precision, 2, 4, 2, 70, 70, D, 0.25, 7, seed=D)


def test_kv_cache_shape_against_reference():
    """S > T: the counter's rows are S keys long."""
    check_values("fp16", 1, 2, 2, 40, 100, 64, 0.2, 0, seed=1)


@pytest.mark.parametrize("hopper", [True, False])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_p0_is_the_path_without_dropout(precision, hopper, monkeypatch):
    """p = 0 launches the kernels without dropout (same bytes as drop=None); the dropout kernels
    with threshold 0 and scale 1 give those bytes too (fails if they change anything else): on
    each path, the dropout twins against the kernels of the same path."""
    ops = path_backend(precision, hopper)
    B, H, K, T, D = 2, 4, 2, 150, 64
    (_, qd), (_, kd), (_, vd), (_, dd) = inputs(ops, [(B, H, T, D), (B, K, T, D), (B, K, T, D), (B, H, T, D)], 5)

    def run(drop):
        out, lse = ops.attention_forward(qd, kd, vd, drop=drop)
        grads = ops.attention_backward(dd, qd, kd, vd, out, lse, drop=drop)
        return [cp.asnumpy(a).tobytes() for a in (out, lse) + tuple(grads)]

    plain = run(None)
    assert run((0.0, dropout_key(1, 2, 3), 0)) == plain
    for off in (0, 1):   # aligned and not: both paths of the kernels
        monkeypatch.setattr(cuda_ops, "_attn_drop", lambda drop, B, H, T, S, off=off: (
            off, np.uint32(12345), np.uint32(678), np.uint32(0), np.float32(1.0)))
        assert run((0.5, (0, 0), 0)) == plain, f"dropout kernels with nothing dropped differ (offset {off})"
    monkeypatch.undo()
    assert ran_hopper_drop(ops, D) == hopper
    assert run((0.1, dropout_key(1, 2, 3), 0)) != plain


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_same_bytes_twice(precision):
    ops = backend(precision)
    B, H, K, T, D = 2, 4, 2, 300, 64
    (_, qd), (_, kd), (_, vd), (_, dd) = inputs(ops, [(B, H, T, D), (B, K, T, D), (B, K, T, D), (B, H, T, D)], 9)

    def run(step):
        drop = (0.2, dropout_key(0, step, 1 << 40), 0)
        out, lse = ops.attention_forward(qd, kd, vd, drop=drop)
        grads = ops.attention_backward(dd, qd, kd, vd, out, lse, drop=drop)
        return [cp.asnumpy(a).tobytes() for a in (out, lse) + tuple(grads)]

    first = run(1)
    assert run(1) == first
    assert run(2)[0] != first[0]


def test_forward_in_batch_slices():
    """More (batch, head) rows than one grid holds: each slice's mask starts at its first batch row."""
    from bytemodel.ops.cuda_ops import GRID_Y_MAX
    ops = backend("fp16")
    H, K, T, D = 12, 12, 8, 64
    B = GRID_Y_MAX // H + 3
    rng = np.random.default_rng(4)
    q, k, v = (cp.asarray(rng.standard_normal((B, n, T, D)).astype(np.float16)) for n in (H, K, K))
    drop = (0.3, dropout_key(2, 3, 4), 8)
    out, _ = ops.attention_forward(q, k, v, drop=drop)
    for r0 in (0, GRID_Y_MAX // H - 2, B - 3):
        sl = slice(r0, r0 + 3)
        sub = (drop[0], drop[1], drop[2] + r0 * H * T * T)
        o_ref, _ = ref.attention_forward(*(host(x[sl]) for x in (q, k, v)), drop=sub)
        assert rel(host(out[sl]), o_ref) < 4e-3, r0


def test_training_with_attention_dropout_on_the_gpu(tmp_path):
    """`--dropout-attn` on cuda trains (no refusal): two runs of the same seed give the same
    weights; one without attention dropout gives others."""
    import hashlib

    import bytemodel
    from bytemodel import checkpoint as ck
    rng = np.random.default_rng(0)
    motifs = ["".join(rng.choice(list("ACGT"), 12)) for _ in range(16)]   # tests/test_gpu_determinism.py's
    src = tmp_path / "dna.txt"
    src.write_text("".join(motifs[i] for i in rng.integers(0, 16, 64 * 1024 // 12)))
    common = dict(preset="tiny", context=256, batch_size=8, steps=12, eval_every=6, eval_tokens=1024, warmup=2,
                  lr=3e-3, model={"d_model": 128, "n_layers": 2, "n_heads": 2, "d_ff": 384}, plot=False,
                  baseline=False, device="cuda", precision="bf16", dropout=0.0)

    def weights(tag, pa):
        bytemodel.train(src, tmp_path / tag, dropout_attn=pa, **common)
        return hashlib.sha256(np.ascontiguousarray(ck.load(tmp_path / tag).params).tobytes()).hexdigest()

    a = weights("a", 0.1)
    assert weights("b", 0.1) == a
    assert weights("c", 0.0) != a
