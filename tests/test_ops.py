"""Each NumPy op's backward against centered finite differences in float64.

For an op y = f(x) and a random upstream gradient w, the scalar L = sum(w * f(x)) has
dL/dx = backward(w). We check every entry of small inputs (odd sizes on purpose).

Tolerance: float64 centered differences with eps = 1e-6 have truncation error ~eps^2 * f''' and
round-off ~1e-16 / eps relative, i.e. about 1e-9 relative for these O(1) quantities; RTOL = 1e-6
with ATOL = 1e-8 is loose enough never to flake and tight enough that a wrong term fails by orders
of magnitude (a missing factor or transpose gives errors of order 1).
"""
import numpy as np
import pytest

from bytemodel.ops import numpy_ops as op
from bytemodel.ops.host import rope_tables

EPS, RTOL, ATOL = 1e-6, 1e-6, 1e-8
rng = np.random.default_rng(1234)


def numgrad(f, x, w):
    """d/dx of sum(w * f(x)) by centered differences, every entry."""
    g = np.zeros_like(x)
    flat, gf = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + EPS
        lp = np.sum(w * f(x))
        flat[i] = old - EPS
        lm = np.sum(w * f(x))
        flat[i] = old
        gf[i] = (lp - lm) / (2 * EPS)
    return g


def close(a, b):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_matmul():
    x, w = rng.standard_normal((7, 5)), rng.standard_normal((5, 3))
    dout = rng.standard_normal((7, 3))
    dw = np.zeros_like(w)
    dx = op.matmul_backward(dout, x, w, dw)
    close(dx, numgrad(lambda x_: op.matmul_forward(x_, w), x, dout))
    close(dw, numgrad(lambda w_: op.matmul_forward(x, w_), w, dout))


def test_matmul_grad_accumulates():
    x, w = rng.standard_normal((4, 3)), rng.standard_normal((3, 2))
    dout = rng.standard_normal((4, 2))
    dw = np.ones_like(w)
    op.matmul_backward(dout, x, w, dw)
    close(dw, 1 + x.T @ dout)


def test_rmsnorm():
    x, g = rng.standard_normal((6, 9)), rng.standard_normal(9)
    dout = rng.standard_normal((6, 9))
    y, cache = op.rmsnorm_forward(x, g, 1e-5)
    close(y, x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-5) * g)   # by hand
    dg = np.zeros_like(g)
    dx = op.rmsnorm_backward(dout, cache, dg)
    close(dx, numgrad(lambda x_: op.rmsnorm_forward(x_, g, 1e-5)[0], x, dout))
    close(dg, numgrad(lambda g_: op.rmsnorm_forward(x, g_, 1e-5)[0], g, dout))


def test_embedding():
    wte = rng.standard_normal((11, 4))
    idx = rng.integers(0, 11, size=(3, 5))
    idx[0, :3] = 2  # repeated ids must accumulate
    dout = rng.standard_normal((3, 5, 4))
    y, cache = op.embedding_forward(wte, idx)
    dw = np.zeros_like(wte)
    op.embedding_backward(dout, cache, dw)
    close(dw, numgrad(lambda w_: op.embedding_forward(w_, idx)[0], wte, dout))


def test_rope_is_a_rotation_and_its_backward_is_the_transpose():
    B, H, T, D = 2, 3, 5, 8
    cos, sin = rope_tables(np.arange(T), D, 10000.0, np.float64)
    x = rng.standard_normal((B, H, T, D))
    y = op.rope_forward(x, cos, sin)
    close(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1))       # rotations keep norms
    close(y[..., 0, :], x[..., 0, :])                                    # position 0: identity
    dout = rng.standard_normal(x.shape)
    close(op.rope_backward(dout, cos, sin), numgrad(lambda x_: op.rope_forward(x_, cos, sin), x, dout))


def test_rope_rotate_half_by_hand():
    # D = 4, position 1, theta = 100: frequencies 1 and 1/10
    cos, sin = rope_tables(np.array([1]), 4, 100.0, np.float64)
    x = np.array([1.0, 2.0, 3.0, 4.0]).reshape(1, 1, 1, 4)
    a, b = 1.0, 0.1
    want = [1 * np.cos(a) - 3 * np.sin(a), 2 * np.cos(b) - 4 * np.sin(b),
            3 * np.cos(a) + 1 * np.sin(a), 4 * np.cos(b) + 2 * np.sin(b)]
    close(op.rope_forward(x, cos, sin).reshape(-1), want)


def test_qkv_rope_split_and_merge():
    B, T, H, K, D = 2, 3, 4, 2, 6
    cos, sin = rope_tables(np.arange(T), D, 10000.0, np.float64)
    qkv = rng.standard_normal((B * T, (H + 2 * K) * D))
    dq, dk, dv = (rng.standard_normal(s) for s in [(B, H, T, D), (B, K, T, D), (B, K, T, D)])

    def f(x_):
        q, k, v = op.qkv_rope_forward(x_, cos, sin, B, T, H, K)
        return np.concatenate([(q * dq).ravel(), (k * dk).ravel(), (v * dv).ravel()])

    g = op.qkv_rope_backward(dq, dk, dv, cos, sin)
    close(g, numgrad(f, qkv, np.ones(f(qkv).shape)))
    a = rng.standard_normal((B, H, T, D))
    m = op.merge_heads_forward(a)
    close(op.merge_heads_backward(m, B, H, T, D), a)


def naive_attention(q, k, v):
    """Full-matrix causal attention, the obvious way (S >= T: queries are the last T positions)."""
    B, H, T, D = q.shape
    K, S = k.shape[1], k.shape[2]
    kk, vv = np.repeat(k, H // K, axis=1), np.repeat(v, H // K, axis=1)
    s = q @ kk.swapaxes(-1, -2) / np.sqrt(D)
    mask = np.arange(S)[None, :] > (S - T + np.arange(T))[:, None]
    s = np.where(mask, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p @ vv


@pytest.mark.parametrize("B,H,K,T,S,D,block", [(2, 4, 2, 7, 7, 6, 3), (1, 3, 3, 5, 5, 4, 256),
                                              (2, 2, 1, 3, 8, 4, 2), (1, 2, 2, 1, 1, 2, 1)])
def test_attention(B, H, K, T, S, D, block):
    q = rng.standard_normal((B, H, T, D))
    k, v = rng.standard_normal((B, K, S, D)), rng.standard_normal((B, K, S, D))
    out, lse = op.attention_forward(q, k, v, block=block)
    close(out, naive_attention(q, k, v))
    dout = rng.standard_normal(out.shape)
    dq, dk, dv = op.attention_backward(dout, q, k, v, out, lse, block=block)
    close(dq, numgrad(lambda x_: op.attention_forward(x_, k, v, block)[0], q, dout))
    close(dk, numgrad(lambda x_: op.attention_forward(q, x_, v, block)[0], k, dout))
    close(dv, numgrad(lambda x_: op.attention_forward(q, k, x_, block)[0], v, dout))


def test_attention_lse():
    q, k, v = (rng.standard_normal((1, 2, 6, 4)) for _ in range(3))
    _, lse = op.attention_forward(q, k, v, block=4)
    s = q @ k.swapaxes(-1, -2) / 2.0
    s = np.where(np.triu(np.ones((6, 6), bool), 1), -np.inf, s)
    close(lse, np.log(np.exp(s).sum(-1)))


def test_swiglu():
    h = rng.standard_normal((5, 2 * 7))
    dout = rng.standard_normal((5, 7))
    y, cache = op.swiglu_forward(h)
    g, u = h[:, :7], h[:, 7:]
    close(y, g / (1 + np.exp(-g)) * u)
    close(op.swiglu_backward(dout, cache), numgrad(lambda x_: op.swiglu_forward(x_)[0], h, dout))


def test_cross_entropy():
    logits = rng.standard_normal((6, 13)) * 3
    t = rng.integers(0, 13, size=6)
    losses, cache = op.cross_entropy_forward(logits, t)
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    close(losses, -np.log(p[np.arange(6), t]))
    w = rng.standard_normal(6)
    close(op.cross_entropy_backward(w, cache), numgrad(lambda x_: op.cross_entropy_forward(x_, t)[0], logits, w))


def test_cross_entropy_is_stable_for_huge_logits():
    logits = np.array([[1e4, 0.0, -1e4]], dtype=np.float32)
    losses, _ = op.cross_entropy_forward(logits, np.array([1]))
    assert np.isfinite(losses).all() and abs(losses[0] - 1e4) < 1
