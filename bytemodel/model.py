"""The transformer: parameter layout, forward, backward. Device-agnostic.

    idx -> embedding -> L x [x += Attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x))] -> RMSNorm -> LM head

The model never branches on the device: it calls the ops of the backend it was given
(bytemodel.ops.numpy_ops or the CUDA backend), which share names and signatures.

Parameters live in ONE flat master buffer (float32, or float64 for gradient checks) with named
views; gradients likewise, with the same layout. `layout(cfg)` is the single place that decides
names, shapes and offsets. Offsets are aligned to 64 elements (256 bytes in fp32), which the GPU's
vector loads and cuBLAS like; the padding stays zero.

Shapes (legend in ops/numpy_ops.py): B batch, T time, C d_model, H heads, K kv heads, D head dim,
F d_ff, V vocab, N = B*T.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .config import ModelConfig
from .mtp import draft_logits, mtp_backward, mtp_forward, mtp_shapes
from .ops.host import rope_tables

ALIGN = 64

# The ModelConfig fields this hand-written transformer follows, and those that cannot change what
# it computes. Each copy of the block declares the same (compress/cpu_engine.py, ops/cuda_decode.py);
# tests/test_engines.py lists ModelConfig's fields against every one, so a new field fails there.
FOLLOWS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "context", "rope_theta",
           "norm_eps", "tie_embeddings", "init_std", "mtp", "mtp_design", "mtp_weight", "dropout",
           "dropout_attn")
IGNORES = {}


def layout(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], int]]:
    """[(name, shape, offset)] for every parameter tensor, in order."""
    C, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    shapes = [("wte", (V, C))]
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        shapes += [
            (p + "attn_norm", (C,)),              # RMSNorm gain before attention
            (p + "wqkv", (C, (H + 2 * K) * D)),   # fused q, k, v projection, stored (in, out)
            (p + "wo", (H * D, C)),               # attention output projection
            (p + "mlp_norm", (C,)),               # RMSNorm gain before the MLP
            (p + "w_gateup", (C, 2 * F)),         # fused SwiGLU gate and up projections
            (p + "w_down", (F, C)),               # SwiGLU down projection
        ]
    shapes.append(("norm_f", (C,)))
    if not cfg.tie_embeddings:
        shapes.append(("lm_head", (C, V)))
    shapes += mtp_shapes(cfg)                     # multi-token heads (none when cfg.mtp == 1)
    out, off = [], 0
    for name, shape in shapes:
        out.append((name, shape, off))
        off += (math.prod(shape) + ALIGN - 1) // ALIGN * ALIGN
    return out


def buffer_size(cfg: ModelConfig) -> int:
    name, shape, off = layout(cfg)[-1]
    return off + (math.prod(shape) + ALIGN - 1) // ALIGN * ALIGN


def views(buf, cfg: ModelConfig) -> dict:
    """Named views into a flat buffer laid out by layout(cfg)."""
    return {name: buf[off:off + math.prod(shape)].reshape(shape) for name, shape, off in layout(cfg)}


def n_params(cfg: ModelConfig) -> int:
    return sum(math.prod(s) for _, s, _ in layout(cfg))


_M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """splitmix64's finaliser on a Python int (exact, the same on every machine)."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


D2 = 13              # where a layer's saved tuple (block's) holds its MLP branch's dropout cache
ATTN_SITE = 1 << 40   # dropout site of layer i's attention probabilities: ATTN_SITE + i


def dropout_key(seed: int, step: int, site: int) -> tuple[int, int]:
    """The two uint32 words the dropout ops hash with, from (seed, step, site). Sites: 0 the
    embedding, 1 + 2i layer i's attention branch, 2 + 2i its MLP branch, ATTN_SITE + i its
    attention probabilities."""
    k = _mix64(_mix64(_mix64(seed) ^ step) ^ site)
    return k & 0xFFFFFFFF, k >> 32


@dataclasses.dataclass(frozen=True)
class Dropout:
    """One training step's dropout masks: drawn from (seed, step) by a counter-based hash, so a
    resumed run draws the same ones and the CPU and GPU draw the same bits. row0 is where this
    piece's rows start in the whole batch (a batch split over threads or ranks draws the masks
    of one piece). p is the model's own (ModelConfig.dropout)."""
    seed: int
    step: int
    row0: int = 0

    def rows(self, start: int) -> "Dropout":
        """The same step's masks for the rows from `start` of this piece."""
        return dataclasses.replace(self, row0=self.row0 + int(start))


def is_matrix(name: str) -> bool:
    """Weight decay applies to the matrices, not the RMSNorm gains."""
    return not name.endswith("norm") and not name.endswith("norm_f")


class Model:
    """Parameters, gradients and the forward/backward orchestration over a backend's ops."""

    def __init__(self, cfg: ModelConfig, ops, dtype=np.float32):
        """ops: the backend (ops.get_backend(device, precision), or bytemodel.ops.numpy_ops)."""
        self.cfg, self.ops, self.xp = cfg, ops, ops.xp
        self.dtype = dtype
        self.size = buffer_size(cfg)
        self.params = self.xp.zeros(self.size, dtype=dtype)   # master weights
        self.grads = self.xp.zeros(self.size, dtype=dtype)
        self.p = views(self.params, cfg)
        self.g = views(self.grads, cfg)
        self._rope = {}
        self._acts = None
        self.mtp_losses = []   # the MTP heads' mean losses (nats) of the last forward

    def replica(self) -> "Model":
        """A model sharing these weights with its own gradients and activations (for threads)."""
        r = Model.__new__(Model)
        r.__dict__.update(self.__dict__)
        r.grads = self.xp.zeros_like(self.grads)
        r.g = views(r.grads, self.cfg)
        r._rope, r._acts, r.mtp_losses = {}, None, []
        return r

    # ------------------------------------------------------------------ parameters
    def use_buffers(self, params, grads) -> None:
        """Keep the weights and gradients in these flat buffers (views of larger ones: the sharded
        optimizer's padded blocks, training/zero.py), with the named views re-made over them."""
        self.params, self.grads = params, grads
        self.p, self.g = views(params, self.cfg), views(grads, self.cfg)

    def init_weights(self, seed: int = 0) -> None:
        """N(0, init_std) matrices, output projections scaled by 1/sqrt(2L), gains 1."""
        cfg = self.cfg
        rng = np.random.default_rng(seed)
        host = np.zeros(self.size, dtype=np.float32)
        hv = views(host, cfg)
        for name, shape, _ in layout(cfg):
            if not is_matrix(name):
                hv[name][...] = 1.0
                continue
            std = cfg.init_std
            if name.endswith(".wo") or name.endswith(".w_down"):
                std /= math.sqrt(2 * cfg.n_layers)
            hv[name][...] = rng.standard_normal(shape, dtype=np.float32) * std
        self.load_flat(host)

    def load_flat(self, host: np.ndarray) -> None:
        self.params[...] = self.ops.asarray(host.astype(self.dtype, copy=False))

    def decay_mask(self):
        """Flat 0/1 buffer: 1 where weight decay applies."""
        m = np.zeros(self.size, dtype=np.float32)
        mv = views(m, self.cfg)
        for name, _, _ in layout(self.cfg):
            if is_matrix(name):
                mv[name][...] = 1.0
        return self.ops.asarray(m)

    def rope(self, T: int, start: int = 0, dtype=None):
        key = (T, start, dtype or self.dtype)
        if key not in self._rope:
            cos, sin = rope_tables(np.arange(start, start + T), self.cfg.head_dim,
                                   self.cfg.rope_theta, np.dtype(key[2]))
            self._rope[key] = (self.ops.asarray(cos), self.ops.asarray(sin))
            if len(self._rope) > 64:
                self._rope.pop(next(iter(self._rope)))
        return self._rope[key]

    def weights(self) -> dict:
        """Views of the weights the forward pass computes with (ops.compute_weights: the master
        buffer itself, or a cast copy)."""
        return views(self.ops.compute_weights(self.params), self.cfg)

    def head(self, W):
        """The LM head as an (in, out) matrix and its gradient view."""
        if self.cfg.tie_embeddings:
            return W["wte"].T, self.g["wte"].T
        return W["lm_head"], self.g["lm_head"]

    # ------------------------------------------------------------------ one layer
    def _drop(self, y, x, drop, site: int, T: int):
        """x + dropout(y) with this step's mask for `site` -> (x, cache), or x + y, None without."""
        if drop is None or self.cfg.dropout == 0:
            return self.ops.add(x, y), None
        off = drop.row0 * T * y.shape[-1]
        return self.ops.dropout_forward(y, self.cfg.dropout, dropout_key(drop.seed, drop.step, site),
                                        off, residual=x)

    def _attn_drop(self, drop, i: int, B: int, T: int):
        """Layer i's attention-probability dropout (p, key, offset) for the ops, or None."""
        if drop is None or self.cfg.dropout_attn == 0:
            return None
        return (self.cfg.dropout_attn, dropout_key(drop.seed, drop.step, ATTN_SITE + i),
                drop.row0 * self.cfg.n_heads * T * T)

    def block(self, i: int, x, W, cos, sin, B: int, T: int, cache=None, pos: int = 0, drop=None,
              keep: int | None = None):
        """Layer i: x += Attn(RMSNorm(x)); x += SwiGLU(RMSNorm(x)). x (N, C) -> (x, saved).

        The one block both passes run: training (cache None; `saved` is what backward needs) and
        generation (cache = this layer's (keys, values) buffers (B, K, S_max, D): the new keys and
        values are written at pos..pos+T-1 and the queries attend to all keys 0..pos+T-1). One
        token (T = 1) at pos >= S_max treats the buffers as a ring: its key and value go to slot
        pos % S_max, over the one S_max positions back, and it attends to all S_max slots (a
        sliding window; RoPE's scores depend only on relative positions, and keys keep the
        rotation of their own absolute position, so no key moves).
        drop (a Dropout, training only): both residual branches go through dropout first (p =
        cfg.dropout), and the attention probabilities (p = cfg.dropout_attn).
        keep (scoring's last layer, no cache): only the last `keep` positions of each window go on
        past the keys and values; x comes back (B * keep, C).
        """
        o, cfg = self.ops, self.cfg
        H, K = cfg.n_heads, cfg.n_kv_heads
        p = f"layers.{i}."
        h1, n1 = o.rmsnorm_forward(x, W[p + "attn_norm"], cfg.norm_eps)       # (N, C)
        qkv = o.matmul_forward(h1, W[p + "wqkv"])                              # (N, (H+2K)D)
        q, k, v = o.qkv_rope_forward(qkv, cos, sin, B, T, H, K)                # (B, H|K, T, D)
        if cache is not None:                                                  # keys 0..S-1
            kc, vc = cache
            if T == 1 and pos >= kc.shape[2]:   # a full cache is a ring: the new key replaces the oldest
                r, S = pos % kc.shape[2], kc.shape[2]
                kc[:, :, r:r + 1] = k
                vc[:, :, r:r + 1] = v
            else:
                S = pos + T
                kc[:, :, pos:S] = k
                vc[:, :, pos:S] = v
            k, v = kc[:, :, :S], vc[:, :, :S]
        if keep is not None and keep < T:          # the earlier positions serve as keys and values only
            q = q[:, :, T - keep:]
            x = x.reshape(B, T, -1)[:, T - keep:].reshape(B * keep, -1)
            T = keep
        if cache is not None and T == 1:                                       # one new token a sequence
            a, lse = o.attention_decode(q, kc, vc, S), None                    # (B, H, 1, D)
        else:
            ad = self._attn_drop(drop, i, B, T) if cache is None else None
            a, lse = o.attention_forward(q, k, v, drop=ad)                     # (B, H, T, D)
        am = o.merge_heads_forward(a)                                          # (N, H*D)
        x, d1 = self._drop(o.matmul_forward(am, W[p + "wo"]), x, drop, 1 + 2 * i, T)   # residual
        h2, n2 = o.rmsnorm_forward(x, W[p + "mlp_norm"], cfg.norm_eps)        # (N, C)
        u = o.matmul_forward(h2, W[p + "w_gateup"])                            # (N, 2F)
        s, sw = o.swiglu_forward(u)                                            # (N, F)
        x, d2 = self._drop(o.matmul_forward(s, W[p + "w_down"]), x, drop, 2 + 2 * i, T)  # residual
        return x, (h1, n1, q, k, v, a, lse, am, h2, n2, sw, s, d1, d2, drop)

    # ------------------------------------------------------------------ training passes
    def forward(self, idx, targets, mask=None, heads: bool = False, drop=None):
        """idx, targets (B, T) int -> per-token losses (B*T,) in nats. Keeps activations.

        mask (B, T) 0/1 or None: targets where it is 0 count for nothing (loss 0, no gradient).
        heads: also run the multi-token heads (their losses in self.mtp_losses) for a backward
        pass; scoring and validation need only the next-token losses, so they leave them out.
        drop: a Dropout (training steps only; None, the default, is every other use: validation,
        scoring, generation, compression): the embedding and every residual branch are dropped
        with p = cfg.dropout, the attention probabilities with p = cfg.dropout_attn."""
        o, cfg = self.ops, self.cfg
        B, T = idx.shape
        N, C = B * T, cfg.d_model
        W = self.weights()
        cos, sin = self.rope(T, 0, o.activation_dtype(self.dtype))
        acts = []
        x, emb_cache = o.embedding_forward(W["wte"], idx)          # (B, T, C)
        x = x.reshape(N, C)
        d0 = None
        if drop is not None and cfg.dropout > 0:
            x, d0 = o.dropout_forward(x, cfg.dropout, dropout_key(drop.seed, drop.step, 0), drop.row0 * T * C)
        for i in range(cfg.n_layers):
            x, saved = self.block(i, x, W, cos, sin, B, T, drop=drop)
            acts.append(saved)
        hf, nf = o.rmsnorm_forward(x, W["norm_f"], cfg.norm_eps)                   # (N, C)
        wh, _ = self.head(W)
        logits = o.matmul_forward(hf, wh)                                          # (N, V)
        if mask is None:
            losses, ce = o.cross_entropy_forward(logits, targets.reshape(N))       # (N,)
        else:  # masked targets: loss 0 and no gradient (the MTP heads below are not masked)
            losses, ce = o.cross_entropy_forward(logits, targets.reshape(N), o.asarray(mask).reshape(N))
        mtp, self.mtp_losses = None, []
        if heads and cfg.mtp > 1:                                                  # heads t+2..t+K
            self.mtp_losses, mtp = mtp_forward(o, cfg, W, wh, x, targets)
        self._acts = (B, T, W, cos, sin, emb_cache, d0, acts, hf, nf, ce, mtp)
        return losses

    def backward(self, dlosses, mtp_scale: float = 1.0) -> None:
        """dlosses (B*T,): d(objective)/d(per-token loss). Accumulates into self.grads.

        With MTP heads, the objective also has mtp_scale * mtp_weight * (mean over heads of each
        head's mean loss); loss_and_grad passes the total of the main loss's weights."""
        o, cfg, G = self.ops, self.cfg, self.g
        B, T, W, cos, sin, emb_cache, d0, acts, hf, nf, ce, mtp = self._acts
        H, D = cfg.n_heads, cfg.head_dim
        wh, dwh = self.head(W)
        dmtp = None   # the MTP heads' gradient on the trunk's last residual stream
        if mtp is not None:
            dmtp = mtp_backward(o, cfg, W, G, wh, dwh, mtp, cfg.mtp_weight * mtp_scale)
        dlogits = o.cross_entropy_backward(dlosses, ce)                            # (N, V)
        dx = o.matmul_backward(dlogits, hf, wh, dwh)                               # (N, C)
        # each RMSNorm backward also hands on the residual stream's gradient through the next
        # dropout met going down, in the same pass: below[i] is the one under layer i's attention
        # norm (layer i - 1's MLP branch, or the embedding's), below[-1] the one under norm_f
        below = [d0] + [saved[D2] for saved in acts]
        dx, dy = self._norm_back(dx, nf, G["norm_f"], dmtp, below[-1])
        for i in reversed(range(cfg.n_layers)):
            p = f"layers.{i}."
            h1, n1, q, k, v, a, lse, am, h2, n2, sw, s, d1, d2, drop = acts[i]
            ds = o.matmul_backward(dy, s, W[p + "w_down"], G[p + "w_down"])        # (N, F); dy: the branch's
            du = o.swiglu_backward(ds, sw)                                         # (N, 2F)
            dh2 = o.matmul_backward(du, h2, W[p + "w_gateup"], G[p + "w_gateup"])  # (N, C)
            dx, dy = self._norm_back(dh2, n2, G[p + "mlp_norm"], dx, d1)           # + residual
            dam = o.matmul_backward(dy, am, W[p + "wo"], G[p + "wo"])              # (N, H*D)
            da = o.merge_heads_backward(dam, B, H, T, D)                           # (B, H, T, D)
            ad = self._attn_drop(drop, i, B, T)                                  # the forward's mask
            dq, dk, dv = o.attention_backward(da, q, k, v, a, lse, drop=ad)
            dqkv = o.qkv_rope_backward(dq, dk, dv, cos, sin)                       # (N, (H+2K)D)
            dh1 = o.matmul_backward(dqkv, h1, W[p + "wqkv"], G[p + "wqkv"])        # (N, C)
            dx, dy = self._norm_back(dh1, n1, G[p + "attn_norm"], dx, below[i])
        o.embedding_backward(dy.reshape(B, T, cfg.d_model), emb_cache, G["wte"])
        self._acts = None

    def _norm_back(self, dh, n, dg, residual, drop):
        """An RMSNorm's backward -> (dx, dy): dx the residual stream's gradient (+ residual), dy
        that through the dropout cache `drop` below it (dx itself without one)."""
        if drop is None:
            dx = self.ops.rmsnorm_backward(dh, n, dg, residual=residual)
            return dx, dx
        return self.ops.rmsnorm_backward(dh, n, dg, residual=residual, drop=drop)

    def loss_and_grad(self, idx, targets, weights, drop=None):
        """Per-token losses (B*T,); grads += d(sum_i weights_i * loss_i)/d(params). drop: as forward's.

        weights: the per-token weights the training loop built (training/loop.py, loss_weights):
        a number (every target alike, e.g. 1 / (B*T) for the mean) or a (B, T) host array, where
        a target of weight 0 counts for nothing (loss 0, no gradient). The MTP heads' mean loss
        is weighted by the weights' total (the share of the batch these rows are).
        """
        if np.isscalar(weights):
            losses = self.forward(idx, targets, heads=True, drop=drop)
            n = losses.shape[0]
            self.backward(self.xp.full(n, weights, dtype=losses.dtype), mtp_scale=weights * n)
            return losses
        w = np.asarray(weights).reshape(-1)
        losses = self.forward(idx, targets, w, heads=True, drop=drop)
        self.backward(self.ops.asarray(w, dtype=losses.dtype), mtp_scale=float(w.sum()))
        return losses

    def objective(self, losses) -> float:
        """The training objective of the last forward (float): the main head's mean loss plus
        mtp_weight * the heads' mean loss."""
        main = float(self.xp.mean(losses))
        if not self.mtp_losses:
            return main
        aux = sum(float(v) for v in self.mtp_losses) / len(self.mtp_losses)
        return main + self.cfg.mtp_weight * aux

    # ------------------------------------------------------------------ inference
    def new_cache(self, B: int, S: int):
        """Per-layer key/value buffers (B, K, S, D) for generation."""
        cfg, xp = self.cfg, self.xp
        dt = self.ops.activation_dtype(self.dtype)
        shape = (B, cfg.n_kv_heads, S, cfg.head_dim)
        return [(xp.zeros(shape, dtype=dt), xp.zeros(shape, dtype=dt)) for _ in range(cfg.n_layers)]

    def forward_cached(self, idx, cache, pos: int, W=None, hidden: bool = False, keep: int | None = None):
        """idx (B, T) new tokens at positions pos..pos+T-1, with keys 0..pos-1 in `cache`.

        Writes the new keys/values into the cache and returns logits (B, T, V) (the last T rows).
        W: the weights() views, when the caller calls this once per token and made them once.
        hidden: also return the trunk's last residual stream (B*T, C), the MTP heads' input.
        keep (no cache: scoring): the logits of the last `keep` positions only, (B, keep, V); the
        last layer's attention output, MLP and the head run for those rows alone.
        """
        o, cfg = self.ops, self.cfg
        B, T = idx.shape
        N, C = B * T, cfg.d_model
        W = self.weights() if W is None else W
        dt = o.activation_dtype(self.dtype)
        if pos + T <= cfg.context:  # one table for the whole context, sliced: no per-token tables
            cos, sin = self.rope(cfg.context, 0, dt)
            cos, sin = cos[pos:pos + T], sin[pos:pos + T]
        else:
            cos, sin = self.rope(T, pos, dt)
        x, _ = o.embedding_forward(W["wte"], idx)
        x = x.reshape(N, C)
        last = cfg.n_layers - 1
        if keep is not None and (keep >= T or cache[last] is not None):
            keep = None
        for i in range(cfg.n_layers):
            x, _ = self.block(i, x, W, cos, sin, B, T, cache[i], pos, keep=keep if i == last else None)
        hf, _ = o.rmsnorm_forward(x, W["norm_f"], cfg.norm_eps)
        wh, _ = self.head(W)
        logits = o.matmul_forward(hf, wh).reshape(B, T if keep is None else keep, cfg.vocab_size)
        return (logits, x) if hidden else logits

    def draft_logits(self, x, W=None) -> list:
        """x (R, C) trunk residual rows -> [logits (R, V) of MTP head k for k = 2..K]."""
        W = self.weights() if W is None else W
        return draft_logits(self.ops, self.cfg, W, self.head(W)[0], x)
