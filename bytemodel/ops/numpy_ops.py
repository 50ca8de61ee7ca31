"""The reference ops: every layer as a forward/backward pair, in NumPy.

This file is the oracle: the CUDA backend (cuda_ops.py) has the same function names and
signatures and is tested against it. Everything here is dtype-generic: float32 for work, float64
for gradient checks. The caches returned by *_forward are whatever *_backward needs.

Dimension legend
    B batch, T time (query length), S key length (S >= T; S == T in training),
    C d_model, H query heads, K key/value heads (H % K == 0), G = H // K, D head dim,
    F feed-forward width, V vocabulary, N = B * T rows.

Accumulation: every d<param> argument is a view into the flat gradient buffer and is ACCUMULATED
into (+=). Activation gradients are returned fresh; rmsnorm_backward(..., residual=dx) also adds
the residual stream's gradient.
"""
from __future__ import annotations

import math

import numpy as np

xp = np  # the array module this backend computes with
name = "numpy"


# ----------------------------------------------------------------------------------------------
# embedding: out[b, t] = wte[idx[b, t]]

def embedding_forward(wte, idx):
    """wte (V, C), idx (B, T) int -> out (B, T, C), cache."""
    return wte[idx], idx


def embedding_backward(dout, cache, dwte):
    """dout (B, T, C); dwte (V, C) += scatter-add of dout rows at idx."""
    idx = cache
    C = dout.shape[-1]
    np.add.at(dwte, idx.reshape(-1), dout.reshape(-1, C))


# ----------------------------------------------------------------------------------------------
# RMSNorm with a learnable gain: out = x / sqrt(mean(x^2) + eps) * g

def rmsnorm_forward(x, g, eps):
    """x (N, C), g (C,) -> out (N, C), cache."""
    ms = np.mean(np.square(x), axis=-1, keepdims=True)  # (N, 1)
    rstd = 1.0 / np.sqrt(ms + eps)                        # (N, 1)
    xhat = x * rstd                                       # (N, C)
    return xhat * g, (xhat, rstd, g)


def rmsnorm_backward(dout, cache, dg, residual=None, drop=None):
    """dout (N, C) -> dx (N, C); dg (C,) += sum over rows of dout * xhat.

    With `residual` (N, C), returns residual + dx: the residual stream's gradient, which the
    GPU backend adds in the same pass. With `drop` (a dropout_forward cache), returns
    (dx, dropout_backward(dx, drop)): the residual branch's gradient too, which the GPU backend
    writes in the same pass."""
    xhat, rstd, g = cache
    dg += np.einsum("nc,nc->c", dout, xhat)
    dxhat = dout * g                                                   # (N, C)
    proj = np.mean(dxhat * xhat, axis=-1, keepdims=True)              # (N, 1)
    dxhat -= xhat * proj
    dxhat *= rstd
    if residual is not None:
        dxhat += residual
    if drop is not None:
        return dxhat, dropout_backward(dxhat, drop)
    return dxhat


def add(a, b):
    """a + b, a fresh array (the residual stream's update)."""
    return a + b


# ----------------------------------------------------------------------------------------------
# matmul (no bias): out = x @ w, with w stored (in, out)

def matmul_forward(x, w):
    """x (N, Cin), w (Cin, Cout) -> out (N, Cout)."""
    return x @ w


def matmul_backward(dout, x, w, dw):
    """dout (N, Cout) -> dx (N, Cin); dw (Cin, Cout) += x^T @ dout."""
    dw += x.T @ dout
    return dout @ w.T


# ----------------------------------------------------------------------------------------------
# RoPE, rotate-half convention (as Llama): with x = [x1, x2] split along D,
#   out = [x1*cos - x2*sin, x2*cos + x1*sin],  angle(t, i) = pos_t * theta^(-2i/D)

# (the cos/sin tables are host maths: ops/host.py rope_tables)

def _rotate(x, cos, sin, out, sign=1.0):
    """out = x rotated by sign * angle; x, out (..., D) with cos/sin broadcasting to (..., D/2)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    o1, o2 = out[..., :h], out[..., h:]
    tmp = np.multiply(x2, sin)
    np.multiply(x1, cos, out=o1)
    if sign > 0:
        o1 -= tmp                    # x1 cos - x2 sin
    else:
        o1 += tmp                    # x1 cos + x2 sin
    np.multiply(x1, sin, out=tmp)
    np.multiply(x2, cos, out=o2)
    if sign > 0:
        o2 += tmp                    # x2 cos + x1 sin
    else:
        o2 -= tmp                    # x2 cos - x1 sin
    return out


def _wide_tables(cos, sin, sign):
    """cos/sin (T, D/2) -> [cos, cos], sign * [-sin, sin] (T, D), for _rotate_wide."""
    h = cos.shape[-1]
    cc = np.empty(cos.shape[:-1] + (2 * h,), dtype=cos.dtype)
    ss = np.empty_like(cc)
    cc[..., :h] = cos
    cc[..., h:] = cos
    if sign > 0:
        np.negative(sin, out=ss[..., :h])
        ss[..., h:] = sin
    else:
        ss[..., :h] = sin
        np.negative(sin, out=ss[..., h:])
    return cc, ss


def _rotate_wide(x, cc, ss):
    """_rotate's result as a new contiguous array in three whole-row passes, the same bits:
    x * [cos, cos] + [x2, x1] * ss, ss = [-sin, sin] (or [sin, -sin] for -angle); x1 cos - x2 sin
    is x1 cos + x2 (-sin) in IEEE arithmetic, signed zeros included. cc/ss broadcast to x's (..., D);
    made whole (not broadcast along the rows' last axes) so NumPy's inner loops run a row long,
    not D/2 (at tiny, D = 32, B 8 x T 256: the qkv rotation 1.8 ms in _rotate, 0.74 this way)."""
    h = x.shape[-1] // 2
    r = np.multiply(x, cc)
    swapped = x.reshape(x.shape[:-1] + (2, h))[..., ::-1, :]
    tmp = np.multiply(swapped, ss.reshape(ss.shape[:-1] + (2, h)))
    r += tmp.reshape(r.shape)
    return r


def rope_forward(x, cos, sin):
    """x (B, H, T, D), cos/sin (T, D/2) -> out (B, H, T, D)."""
    return _rotate(x, cos, sin, np.empty_like(x))


def rope_backward(dout, cos, sin):
    """dout (B, H, T, D) -> dx: the transpose of the rotation (rotate by -angle)."""
    return _rotate(dout, cos, sin, np.empty_like(dout), sign=-1.0)


# ----------------------------------------------------------------------------------------------
# qkv split + RoPE: the fused projection's output becomes per-head q, k, v

def qkv_rope_forward(qkv, cos, sin, B, T, H, K):
    """qkv (B*T, (H + 2K) * D) -> q (B, H, T, D), k (B, K, T, D), v (B, K, T, D); rope on q, k.

    q, k, v are views of one (B, H + 2K, T, D) buffer; each head's (T, D) block is contiguous.
    """
    D = qkv.shape[-1] // (H + 2 * K)
    t = qkv.reshape(B, T, H + 2 * K, D)                   # read in the projection's own layout
    out = np.empty((B, H + 2 * K, T, D), dtype=qkv.dtype)
    ov = out.transpose(0, 2, 1, 3)                        # (B, T, H+2K, D) view to write through
    cc, ss = _wide_tables(np.repeat(cos[:, None], H + K, axis=1), np.repeat(sin[:, None], H + K, axis=1), 1.0)
    ov[:, :, :H + K] = _rotate_wide(t[:, :, :H + K], cc, ss)      # tables (T, H+K, D): a token's q, k heads
    ov[:, :, H + K:] = t[:, :, H + K:]
    return out[:, :H], out[:, H:H + K], out[:, H + K:]


def qkv_rope_backward(dq, dk, dv, cos, sin):
    """dq (B, H, T, D), dk/dv (B, K, T, D) -> dqkv (B*T, (H + 2K) * D)."""
    B, H, T, D = dq.shape
    K = dk.shape[1]
    d = np.empty((B, T, H + 2 * K, D), dtype=dq.dtype)
    dt = d.transpose(0, 2, 1, 3)                          # (B, H+2K, T, D) view
    cc, ss = _wide_tables(cos, sin, -1.0)                                 # (T, D)
    dt[:, :H] = _rotate_wide(dq, cc, ss)
    dt[:, H:H + K] = _rotate_wide(dk, cc, ss)
    dt[:, H + K:] = dv
    return d.reshape(B * T, (H + 2 * K) * D)


def merge_heads_forward(a):
    """a (B, H, T, D) -> (B*T, H*D)."""
    B, H, T, D = a.shape
    return np.ascontiguousarray(a.transpose(0, 2, 1, 3)).reshape(B * T, H * D)


def merge_heads_backward(dout, B, H, T, D):
    """dout (B*T, H*D) -> da (B, H, T, D)."""
    return np.ascontiguousarray(dout.reshape(B, T, H, D).transpose(0, 2, 1, 3))


# ----------------------------------------------------------------------------------------------
# causal attention, blocked over queries so memory is O(block * S), never O(T^2) at once.
# Query t (absolute position S - T + t) sees keys 0 .. S - T + t. Grouped-query: query head h
# uses key/value head h // G.

ATTN_BLOCK = 64  # queries per block: (B, H, 64, S) scores at a time; 32-64 measured fastest at T=256


def _scores(qb, k):
    """qb (B, K, G, b, D) (already scaled), k (B, K, S, D) -> qb @ k^T (B, K, G, b, S)."""
    return np.matmul(qb, k[:, :, None].swapaxes(-1, -2))


_MASKS: dict = {}


def _mask_diagonal(s):
    """Mask s (..., b, kend) in place for a block whose queries are the last b positions seen.

    Query row r sees keys up to kend - b + r, so only the last b columns need a mask: the
    (b, b) upper triangle above the diagonal becomes -inf; every earlier key is visible.
    """
    b = s.shape[-2]
    key = (b, s.dtype.str)
    tri = _MASKS.get(key)
    if tri is None:
        tri = np.where(np.triu(np.ones((b, b), dtype=bool), 1), -np.inf, 0.0).astype(s.dtype)
        _MASKS[key] = tri
    s[..., s.shape[-1] - b:] += tri


def _sum_groups(a):
    """(B, K, G, ...) -> (B, K, ...): sum over the query heads that share a key/value head."""
    return a[:, :, 0] if a.shape[2] == 1 else a.sum(axis=2)


def attention_decode(q, kc, vc, n):
    """One new query per sequence against a KV cache: q (B, H, 1, D); kc/vc (B, K, S, D) cache
    buffers whose first n keys/values are filled (the query's own included) -> out (B, H, 1, D).
    The same arithmetic as attention_forward over the first n keys (lse is not needed here).
    """
    return attention_forward(q, kc[:, :, :n], vc[:, :, :n])[0]


def attn_drop_threshold(drop, B, H, T, S):
    """drop = (p, key, offset) of attention over (B, H, T, S) -> (threshold, scale) as
    dropout_threshold's, after the checks (p's range; the counter: B H T S elements from offset
    within 2^32 hash words). The CUDA twin makes the same checks."""
    p, key, offset = drop
    thr, scale = dropout_threshold(p)
    if offset < 0 or offset + B * H * T * S > 4 * 2 ** 32:
        raise ValueError("attention dropout counter outside 0 .. 2^32 words: batch too large")
    return thr, scale


def attn_keep(drop, B, H, T, S, q0, q1, kend, xp=np):
    """drop = (p, key, offset) -> the attention-probability mask of queries q0..q1-1, keys
    0..kend-1: bool (B, H, q1 - q0, kend), True where kept, and the kept ones' scale. Probability (b, h, i, j) (query i, key j; S keys a row) is element
    offset + ((b H + h) T + i) S + j of the hash's counter (offset: the first row's in the whole
    batch), drawn by the rule of dropout_keep, so a block, a batch slice or the CUDA twin's tile
    regenerates the same bits. xp: the array module (cuda_ops' fp32 path passes CuPy)."""
    p, key, offset = drop
    thr, scale = attn_drop_threshold(drop, B, H, T, S)
    g = (xp.arange(B * H, dtype=xp.int64)[:, None, None] * T + xp.arange(q0, q1, dtype=xp.int64)[:, None]) * S
    g = g + xp.arange(kend, dtype=xp.int64) + offset               # (B H, b, kend)
    h = (g >> 2).astype(np.uint32)
    h ^= np.uint32(key[0])
    _fmix32(h)
    h ^= np.uint32(key[1])
    _fmix32(h)
    byte = (h >> ((g & 3).astype(np.uint32) << np.uint32(3))) & np.uint32(0xFF)
    return (byte >= thr).reshape(B, H, q1 - q0, kend), scale


def attn_dropped(drop):
    """Whether attention_forward/backward's drop= drops anything (None or p = 0: no)."""
    return drop is not None and drop[0] > 0


def attention_forward(q, k, v, block=ATTN_BLOCK, drop=None):
    """q (B, H, T, D), k/v (B, K, S, D) -> out (B, H, T, D), lse (B, H, T) (natural log).

    drop (training only): (p, key, offset): the probabilities P = softmax(scores) are dropped
    after the softmax, out = (P * keep * scale) V (the mask of attn_keep); lse stays that of P."""
    B, H, T, D = q.shape
    K, S = k.shape[1], k.shape[2]
    G = H // K
    scale = 1.0 / math.sqrt(D)
    qs = q.reshape(B, K, G, T, D) * q.dtype.type(scale)   # scale folded into q: (T, D), not (T, S)
    out = np.empty((B, K, G, T, D), dtype=q.dtype)
    lse = np.empty((B, K, G, T), dtype=q.dtype)
    for q0 in range(0, T, block):
        q1 = min(T, q0 + block)
        kend = S - T + q1                       # keys past this are masked for every row
        s = _scores(qs[:, :, :, q0:q1], k[:, :, :kend])          # (B, K, G, b, kend)
        _mask_diagonal(s)
        m = s.max(axis=-1, keepdims=True)
        s -= m
        np.exp(s, out=s)                                          # unnormalised probabilities
        l = s.sum(axis=-1, keepdims=True)
        if attn_dropped(drop):                                   # dropped after the sum: lse is P's
            keep, sc = attn_keep(drop, B, H, T, S, q0, q1, kend)
            s = np.where(keep.reshape(s.shape), s * s.dtype.type(sc), s.dtype.type(0))
        o = np.matmul(s, v[:, :, None, :kend])
        o /= l
        out[:, :, :, q0:q1] = o
        lse[:, :, :, q0:q1] = (m + np.log(l))[..., 0]
    return out.reshape(B, H, T, D), lse.reshape(B, H, T)


def attention_backward(dout, q, k, v, out, lse, block=ATTN_BLOCK, drop=None):
    """dout (B, H, T, D) -> dq (B, H, T, D), dk (B, K, S, D), dv (B, K, S, D).

    FlashAttention-2 style: the probabilities are recomputed per block from lse. drop: the
    forward's (p, key, offset); its mask is drawn again per block (none is stored):
    dV = (P Z)^T dO, dP = Z (dO V^T), dS = P (dP - rowsum(dO * O)) with Z = keep * scale (the
    rowsum still equals rowsum(P dP), as O is the dropped output).
    """
    B, H, T, D = q.shape
    K, S = k.shape[1], k.shape[2]
    G = H // K
    scale = 1.0 / math.sqrt(D)
    qs = q.reshape(B, K, G, T, D) * q.dtype.type(scale)
    dog = dout.reshape(B, K, G, T, D)
    lseg = lse.reshape(B, K, G, T)
    delta = np.einsum("bhtd,bhtd->bht", dout, out).reshape(B, K, G, T)   # rowsum(dO * O)
    dq = np.empty_like(qs)
    dk = np.zeros_like(k)
    dv = np.zeros_like(v)
    for q0 in range(0, T, block):
        q1 = min(T, q0 + block)
        kend = S - T + q1
        qb, dob = qs[:, :, :, q0:q1], dog[:, :, :, q0:q1]
        p = _scores(qb, k[:, :, :kend])
        _mask_diagonal(p)
        p -= lseg[:, :, :, q0:q1, None]
        np.exp(p, out=p)                                                 # (B, K, G, b, kend)
        if attn_dropped(drop):
            keep, sc = attn_keep(drop, B, H, T, S, q0, q1, kend)
            z = np.where(keep.reshape(p.shape), p.dtype.type(sc), p.dtype.type(0))   # Z
            dv[:, :, :kend] += _sum_groups(np.matmul((p * z).swapaxes(-1, -2), dob))
            ds = np.matmul(dob, v[:, :, None, :kend].swapaxes(-1, -2))  # d(P Z)
            ds *= z                                                      # dP
        else:
            dv[:, :, :kend] += _sum_groups(np.matmul(p.swapaxes(-1, -2), dob))
            ds = np.matmul(dob, v[:, :, None, :kend].swapaxes(-1, -2))  # dP (B, K, G, b, kend)
        ds -= delta[:, :, :, q0:q1, None]
        ds *= p                                                          # dS = P * (dP - delta)
        dqb = np.matmul(ds, k[:, :, None, :kend])
        dqb *= scale                                                     # d(scaled scores)/dq
        dq[:, :, :, q0:q1] = dqb
        dk[:, :, :kend] += _sum_groups(np.matmul(ds.swapaxes(-1, -2), qb))  # qb carries the scale
    return dq.reshape(B, H, T, D), dk, dv


# ----------------------------------------------------------------------------------------------
# dropout: out = x * keep / (1 - p), keep drawn from a counter-based hash, so the mask is a pure
# function of (key, element) and the CUDA twin (gpu/dropout.cu) draws the very same bits.
#
# Element g of the whole batch's flat array (g = offset + the element's flat index here) reads
# byte g % 4 (bits 8(g % 4) .. 8(g % 4) + 7) of the 32-bit word h(g // 4), where
# h(c) = fmix32(fmix32(c ^ k0) ^ k1) (murmur3's finaliser, twice, keyed), and is kept when that
# byte is >= threshold = round(p 256): p is used to the nearest 1/256 (one hash serves 4 elements,
# which halves the kernel's integer work against 16 bits each; benchmarks/kernels/dropout.py). The
# kept ones are scaled by 256 / (256 - threshold), so the expectation is exactly x.
# key = (k0, k1), two uint32 words (bytemodel.model.dropout_key makes them from seed, step and
# site); offset is where this array starts in the whole batch, so a batch split over threads or
# ranks draws the same mask as one piece.

def _fmix32(x):
    """murmur3's 32-bit finaliser on a uint32 array, in place (uint32 products wrap mod 2^32)."""
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x85EBCA6B)
    x ^= x >> np.uint32(13)
    x *= np.uint32(0xC2B2AE35)
    x ^= x >> np.uint32(16)
    return x


def dropout_threshold(p):
    """p in [0, 1) -> (threshold, scale): an element is kept when its byte >= threshold."""
    if not 0 <= p < 1:
        raise ValueError(f"dropout p must be in [0, 1), got {p}")
    thr = min(int(round(p * 256)), 255)
    return thr, 256.0 / (256 - thr)


def dropout_keep(n, key, offset, p):
    """The mask of elements offset .. offset + n - 1: bool (n,), True where kept."""
    c0, c1 = offset // 4, (offset + n + 3) // 4          # the words covering those elements
    if offset < 0 or c1 > 2 ** 32:
        raise ValueError("dropout counter outside 0 .. 2^32 words: batch too large")
    thr, _ = dropout_threshold(p)
    h = np.arange(c1 - c0, dtype=np.uint32)
    h += np.uint32(c0)
    h ^= np.uint32(key[0])
    _fmix32(h)
    h ^= np.uint32(key[1])
    _fmix32(h)
    s = offset - 4 * c0
    return h.astype("<u4", copy=False).view(np.uint8)[s:s + n] >= thr   # byte l = bits 8l..8l+7


def dropout_forward(x, p, key, offset=0, residual=None):
    """x (N, C) -> out (N, C) = [residual +] x * keep * scale, cache (keep, scale).

    p: drop probability in [0, 1) (used to the nearest 1/256); key: (k0, k1) uint32; offset:
    x's first element's index in the whole batch. With `residual` (N, C) the residual stream's update in the same pass
    (as rmsnorm_backward's residual=)."""
    keep = dropout_keep(x.size, key, offset, p).reshape(x.shape)
    scale = x.dtype.type(dropout_threshold(p)[1])
    out = np.where(keep, x * scale, x.dtype.type(0))
    if residual is not None:
        out += residual
    return out, (keep, scale)


def dropout_backward(dout, cache):
    """dout (N, C) -> dx (N, C) = dout * keep * scale (the same mask; fresh array)."""
    keep, scale = cache
    return np.where(keep, dout * scale, dout.dtype.type(0))


# ----------------------------------------------------------------------------------------------
# SwiGLU: h = [gate, up] (the fused projection), out = silu(gate) * up

def swiglu_forward(h):
    """h (N, 2F) -> out (N, F), cache (h, sigmoid(gate)): the backward pass needs no exp."""
    F = h.shape[-1] // 2
    g, u = h[:, :F], h[:, F:]
    sig = np.negative(g)
    np.exp(sig, out=sig)
    sig += 1.0
    np.reciprocal(sig, out=sig)     # sigmoid(g)
    out = np.multiply(g, sig)       # silu(g)
    out *= u
    return out, (h, sig)


def swiglu_backward(dout, cache):
    """dout (N, F) -> dh (N, 2F) = [dout * u * silu'(g), dout * silu(g)]."""
    h, sig = cache
    F = h.shape[-1] // 2
    g, u = h[:, :F], h[:, F:]
    dh = np.empty_like(h)
    silu = np.multiply(g, sig)
    np.multiply(dout, silu, out=dh[:, F:])       # d up
    t = np.subtract(1.0, sig)
    t *= silu
    t += sig                                     # silu'(g) = sig + silu (1 - sig)
    t *= u
    np.multiply(t, dout, out=dh[:, :F])          # d gate
    return dh


# ----------------------------------------------------------------------------------------------
# softmax + cross-entropy, per row. Returns per-token losses so callers can weight by bytes.

def cross_entropy_forward(logits, targets, mask=None):
    """logits (N, V), targets (N,) int -> losses (N,) in nats, cache (probabilities).

    mask (N,) or None: where it is 0 the row counts for nothing, its loss is 0 and its gradient
    exactly 0 whatever dlosses says (prompt tokens when fine-tuning on completions only).
    """
    m = logits.max(axis=-1, keepdims=True)
    z = logits - m
    e = np.exp(z)
    s = e.sum(axis=-1, keepdims=True)
    rows = np.arange(logits.shape[0])
    losses = np.log(s[:, 0]) - z[rows, targets]
    e /= s
    keep = None
    if mask is not None:
        keep = np.asarray(mask).reshape(-1) != 0                          # (N,) bool
        losses = np.where(keep, losses, 0).astype(losses.dtype, copy=False)
    return losses, (e, targets, keep)


def cross_entropy_backward(dlosses, cache):
    """dlosses (N,) -> dlogits (N, V) = (softmax - onehot) * dlosses (0 on masked rows)."""
    probs, targets, keep = cache
    if keep is not None:
        dlosses = np.where(keep, dlosses, 0).astype(probs.dtype, copy=False)
    d = probs * dlosses[:, None]
    d[np.arange(d.shape[0]), targets] -= dlosses
    return d


def log_softmax(logits):
    """logits (..., V) -> log-probabilities, for sampling and scoring."""
    m = logits.max(axis=-1, keepdims=True)
    z = logits - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


# ----------------------------------------------------------------------------------------------
# arrays and precision: the host is the device, nothing to copy or cast

cpu_threads = True  # batch slices may run on CPU threads (training/runner.py, CoreParallel)


def asarray(a, dtype=None):
    return np.asarray(a, dtype=dtype)


def to_numpy(a):
    return np.asarray(a)


def describe() -> dict:
    """What computes here: device, precision and the numerical libraries (recorded beside results
    that depend on them, such as a compressed file's probabilities)."""
    from threadpoolctl import threadpool_info
    blas = [f"{d.get('internal_api')} {d.get('version')} {d.get('architecture')}"
            for d in threadpool_info() if d.get("user_api") == "blas"]
    return {"device": "cpu", "precision": "fp32", "numpy": np.__version__, "blas": blas[0] if blas else "unknown"}


def activation_dtype(master_dtype):
    """The dtype activations are computed in: the master weights' own (float32, float64)."""
    return np.dtype(master_dtype)


def compute_weights(flat):
    """flat master buffer (P,) -> the buffer the forward pass computes with: itself."""
    return flat


# ----------------------------------------------------------------------------------------------
# the optimizer's ops over the flat buffers, and reading results back

def global_norm(grads):
    """grads (P,) -> 0-d float64: sqrt(sum grads^2), summed in float64; inf/nan pass through."""
    g = grads.astype(np.float64, copy=False)
    return np.sqrt(np.dot(g, g))


def adamw_step(params, grads, m, v, decay_mask, lr, beta1, beta2, eps, weight_decay, step,
               grad_scale=1.0, clip=0.0, norm=None):
    """One AdamW step (Loshchilov & Hutter) over flat buffers (P,), in place; the reference.

        g  = grads * grad_scale * c    c = min(1, clip / (|g| + 1e-6)) when clip > 0, else 1
        m  = beta1 m + (1 - beta1) g             v = beta2 v + (1 - beta2) g^2
        p -= lr (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps) + lr wd mask p

    grad_scale undoes the loss scale; norm is global_norm(grads) of the scaled gradients, so the
    unscaled norm |g| is norm * grad_scale. A norm that is not finite skips the step (changes
    nothing). Weight decay applies where decay_mask is 1 (the matrices, not the gains).
    """
    factor = 1.0
    if norm is not None:
        n = float(norm) * grad_scale
        if not math.isfinite(n):
            return
        if clip > 0:
            factor = min(1.0, clip / (n + 1e-6))
    mult = grad_scale * factor
    g = grads if mult == 1.0 else grads * params.dtype.type(mult)
    m *= beta1
    m += (1 - beta1) * g
    v *= beta2
    v += (1 - beta2) * (g * g)
    upd = (m / (1 - beta1 ** step)) / (np.sqrt(v / (1 - beta2 ** step)) + eps)
    upd += weight_decay * decay_mask * params
    params -= params.dtype.type(lr) * upd


def fetch_async(*arrays):
    """Values of 0-d arrays (a loss, a norm) as floats, through a function: on the host they are
    ready at once (the GPU backend starts a copy here and waits only when the function is called)."""
    vals = tuple(float(a) for a in arrays)
    return lambda: vals
