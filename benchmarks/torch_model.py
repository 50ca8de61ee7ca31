"""The bytemodel architecture written in PyTorch, for side-by-side benchmarks only.

Same layout and maths as bytemodel.model: embedding, L x [RMSNorm(gain) -> fused qkv -> RoPE
(rotate-half) -> causal attention (GQA) -> out proj -> residual; RMSNorm -> fused gate/up ->
SwiGLU -> down -> residual], final RMSNorm, untied head. PyTorch is not a bytemodel dependency:
this file is imported by the benchmarks in their own environment.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


class TorchModel(torch.nn.Module):
    def __init__(self, cfg, device="cpu", dtype=torch.float32):
        super().__init__()
        self.cfg = cfg
        C, V, Fd = cfg.d_model, cfg.vocab_size, cfg.d_ff
        H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        kw = dict(device=device, dtype=dtype)
        P = torch.nn.Parameter
        self.wte = P(torch.randn(V, C, **kw) * 0.02)
        self.layers = torch.nn.ParameterList()
        for _ in range(cfg.n_layers):
            self.layers.append(P(torch.ones(C, **kw)))
            self.layers.append(P(torch.randn(C, (H + 2 * K) * D, **kw) * 0.02))
            self.layers.append(P(torch.randn(H * D, C, **kw) * 0.02))
            self.layers.append(P(torch.ones(C, **kw)))
            self.layers.append(P(torch.randn(C, 2 * Fd, **kw) * 0.02))
            self.layers.append(P(torch.randn(Fd, C, **kw) * 0.02))
        self.norm_f = P(torch.ones(C, **kw))
        self.lm_head = P(torch.randn(C, V, **kw) * 0.02)
        inv = cfg.rope_theta ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2 / D)
        ang = torch.arange(cfg.context, dtype=torch.float64)[:, None] * inv[None]
        self.register_buffer("cos", ang.cos().to(device=device, dtype=dtype), persistent=False)
        self.register_buffer("sin", ang.sin().to(device=device, dtype=dtype), persistent=False)

    def norm(self, x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps) * g

    def rope(self, x, cos, sin):
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def block(self, x, i, cos, sin, cache=None, pos=0):
        cfg = self.cfg
        B, T, C = x.shape
        H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        g1, wqkv, wo, g2, wgu, wd = self.layers[6 * i:6 * i + 6]
        qkv = (self.norm(x, g1) @ wqkv).view(B, T, H + 2 * K, D).transpose(1, 2)
        q, k, v = qkv[:, :H], qkv[:, H:H + K], qkv[:, H + K:]
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        if cache is not None:
            kc, vc = cache[i]
            kc[:, :, pos:pos + T] = k
            vc[:, :, pos:pos + T] = v
            k, v = kc[:, :, :pos + T], vc[:, :, :pos + T]
        causal = cache is None or T > 1
        if causal and cache is not None and pos > 0:
            mask = torch.ones(T, pos + T, dtype=torch.bool, device=x.device).tril(pos)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=(K != H))
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=(K != H))
        x = x + a.transpose(1, 2).reshape(B, T, H * D) @ wo
        gu = self.norm(x, g2) @ wgu
        g, u = gu.chunk(2, dim=-1)
        return x + (F.silu(g) * u) @ wd

    def forward(self, idx, targets=None, cache=None, pos=0):
        T = idx.shape[1]
        cos, sin = self.cos[pos:pos + T], self.sin[pos:pos + T]
        x = self.wte[idx]
        for i in range(self.cfg.n_layers):
            x = self.block(x, i, cos, sin, cache, pos)
        logits = self.norm(x, self.norm_f) @ self.lm_head
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
