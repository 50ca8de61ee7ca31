"""Training throughput on the GPU: bytemodel's CUDA engine against PyTorch (eager and
torch.compile) on the identical model, in the same run.

    python benchmarks/gpu_train.py --bf16 base           # small and base presets, all rows
    python benchmarks/gpu_train.py --presets base --skip-torch
    python benchmarks/gpu_train.py --presets base --profile       # GPU time per op
    python benchmarks/gpu_train.py --presets small --kernels      # every kernel, ours and torch.compile's
    python benchmarks/gpu_train.py --no-flash-run --skip-torch    # flash on vs off

A step = zero grads, forward, backward, global grad norm, AdamW (clip 1.0, weight decay 0.1)
over all parameters. Ours: fp16 compute, fp32 master weights, static loss scale 1024 (the dynamic
scaler only reads the norm on the host, which this loop avoids so that Python runs ahead of the
GPU). PyTorch: autocast fp16 + GradScaler (or bf16), fused AdamW, clip_grad_norm_.

MFU: FLOPs/token = 6 N + 12 L d T (N = parameters in matrix products: all but the embedding
table; the attention term is the PaLM convention), over the cuBLAS fp16 peak measured here
(8192^3, fp16 in, fp32 accumulate, median of 10). Step time: the mean over `--steps` steps after
3 warm-ups, timed with CUDA events around the whole loop; `host` is the Python time per step
(below the GPU time: the GPU, not launch overhead, is the bottleneck). The batch is fixed (random
bytes), so the loss falling from ~5.6 is memorisation, a sanity check only.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bytemodel import ops as ops_table  # noqa: E402
from bytemodel.config import preset  # noqa: E402
from bytemodel.model import n_params  # noqa: E402

RUNS = {"small": (64, 512), "base": (32, 1024)}


def flops_per_token(cfg, T):
    N = n_params(cfg) - cfg.vocab_size * cfg.d_model
    return 6 * N + 12 * cfg.n_layers * cfg.d_model * T


def cublas_peak():
    import cupy as cp
    from bytemodel.ops.cuda_ops import CudaBackend
    ops = CudaBackend("fp16")
    n = 8192
    rng = cp.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    b = rng.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
    c = cp.empty((n, n), dtype=cp.float16)
    for _ in range(3):
        ops._gemm(a, b, c)
    ts = []
    for _ in range(10):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(); ops._gemm(a, b, c); e1.record(); e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1))
    return 2 * n ** 3 / (np.median(ts) * 1e-3) / 1e12


# ------------------------------------------------------------------------------------------------
def ours(name, B, T, steps, flash=True, graph=False, precision="fp16", hook=None):
    import cupy as cp
    from bytemodel.model import Model
    from bytemodel.ops.cuda_ops import CudaBackend
    cfg = preset(name)
    ops = CudaBackend(precision, flash=flash)
    model = Model(cfg, ops)
    model.init_weights(0)
    m = cp.zeros_like(model.params)
    v = cp.zeros_like(model.params)
    mask = model.decay_mask()
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=(B, T + 1))
    idx = cp.asarray(data[:, :-1], dtype=cp.int32)
    tgt = cp.asarray(data[:, 1:], dtype=cp.int32)
    N = B * T
    scale = 1024.0
    dl = cp.full(N, scale / N, dtype=cp.float32)
    state = {"t": 0}

    def step():
        state["t"] += 1
        model.grads.fill(0)
        losses = model.forward(idx, tgt)
        model.backward(dl)
        nrm = ops.global_norm(model.grads)
        ops.adamw_step(model.params, model.grads, m, v, mask, lr=3e-4, beta1=0.9, beta2=0.95,
                       eps=1e-8, weight_decay=0.1, step=state["t"], grad_scale=1 / scale,
                       clip=1.0, norm=nrm)
        return losses, nrm

    losses, _ = step()
    loss0 = float(losses.mean())
    for _ in range(2):
        step()
    run = step
    if graph:
        # the whole step captured once and replayed: its products through a cuBLAS handle of its
        # own bound to the capturing stream (CuPy's wrappers refuse cuBLAS calls while a stream
        # captures), its temporaries from a pool of its own kept while the graph lives. Host
        # scalars are frozen into the graph (AdamW's step count stays the captured one): a timing
        # of the launches saved, not a training loop.
        from bytemodel.ops.cuda_decode import StreamBlas
        s = cp.cuda.Stream(non_blocking=True)
        blas, pool = StreamBlas(s), cp.cuda.MemoryPool()
        with s, blas.use(), cp.cuda.using_allocator(pool.malloc):
            step()
            s.synchronize()
            s.begin_capture()
            out = step()
            g = s.end_capture()
        s.synchronize()

        def run():
            g.launch(s)
            return out
        stream = s
    else:
        stream = cp.cuda.get_current_stream()
    cp.cuda.Device().synchronize()
    if hook is not None:      # --kernels: the warm step handed to a profiler
        return hook(run)
    with stream:
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        h0 = time.perf_counter()
        e0.record()
        for _ in range(steps):
            losses, nrm = run()
        h1 = time.perf_counter()
        e1.record()
        e1.synchronize()
    ms = cp.cuda.get_elapsed_time(e0, e1) / steps
    host_ms = (h1 - h0) * 1e3 / steps
    lossN = float(losses.mean())
    del model, m, v
    cp.get_default_memory_pool().free_all_blocks()
    return dict(ms=ms, host_ms=host_ms, tok_s=N / (ms * 1e-3), loss_first=loss0, loss_last=lossN,
                norm=float(nrm))


# ------------------------------------------------------------------------------------------------
OPS = [n for n in ops_table.OPS if n not in ("asarray", "to_numpy", "activation_dtype", "fetch_async", "log_softmax")]


def profile(name, B, T):
    """GPU time per op (CUDA events around each backend call) over one training step; the rest
    (CuPy residual adds, grad zeroing) is the difference to the whole step."""
    import cupy as cp
    from bytemodel.model import Model
    from bytemodel.ops.cuda_ops import CudaBackend
    cfg = preset(name)
    ops = CudaBackend("fp16")
    model = Model(cfg, ops)
    model.init_weights(0)
    m, v, mask = cp.zeros_like(model.params), cp.zeros_like(model.params), model.decay_mask()
    rng = np.random.default_rng(0)
    idx = cp.asarray(rng.integers(0, 256, size=(B, T)), dtype=cp.int32)
    N = B * T
    dl = cp.full(N, 1024.0 / N, dtype=cp.float32)
    recs = []

    def wrap(op):
        f = getattr(ops, op)

        def w(*a, **k):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            r = f(*a, **k)
            e1.record()
            key = op
            if op.startswith("matmul"):
                key = f"{op} {a[0].shape[0]}x{a[1].shape[0] if op == 'matmul_forward' else a[2].shape[0]}" \
                      f"x{a[1].shape[1] if op == 'matmul_forward' else a[2].shape[1]}"
            recs.append((key, e0, e1))
            return r
        setattr(ops, op, w)

    def step():
        model.grads.fill(0)
        model.forward(idx, idx)
        model.backward(dl)
        nrm = ops.global_norm(model.grads)
        ops.adamw_step(model.params, model.grads, m, v, mask, lr=1e-4, beta1=0.9, beta2=0.95,
                       eps=1e-8, weight_decay=0.1, step=1, grad_scale=1 / 1024, clip=1.0, norm=nrm)

    step()
    for op in OPS:
        wrap(op)
    step()
    recs.clear()
    cp.cuda.Device().synchronize()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record()
    step()
    e1.record()
    e1.synchronize()
    total = cp.cuda.get_elapsed_time(e0, e1)
    agg = {}
    for key, a, b in recs:
        t = cp.cuda.get_elapsed_time(a, b)
        c, s = agg.get(key, (0, 0.0))
        agg[key] = (c + 1, s + t)
    print(f"--- profile {name} (B={B}, T={T}): step {total:.2f} ms (event-wrapped)")
    for key, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"  {key:45s} {c:4d} calls {t:8.2f} ms {100 * t / total:5.1f}%")
    print(f"  {'other (CuPy adds, zeroing, gaps)':45s}      {total - sum(t for _, t in agg.values()):8.2f} ms")
    # the residual add as a CuPy expression `x + y` against the backend's vectorised ops.add
    x = cp.ones((N, cfg.d_model), dtype=cp.float16)
    y = cp.ones((N, cfg.d_model), dtype=cp.float16)
    for label, f in (("CuPy x + y", lambda: x + y), ("ops.add(x, y)", lambda: ops.add(x, y))):
        for _ in range(3):
            f()
        e0.record()
        for _ in range(20):
            f()
        e1.record()
        e1.synchronize()
        ms = cp.cuda.get_elapsed_time(e0, e1) / 20
        print(f"  residual add {label:16s} ({N}x{cfg.d_model} fp16): {ms * 1e3:7.1f} us, "
              f"{3 * x.nbytes / ms / 1e9:6.2f} TB/s; x {4 * cfg.n_layers} per step = {4 * cfg.n_layers * ms:.2f} ms")
    del model, m, v
    cp.get_default_memory_pool().free_all_blocks()


# ------------------------------------------------------------------------------------------------
def torch_model(cfg):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    C, H, K, D, Fd, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm = nn.Parameter(torch.ones(C))
            self.wqkv = nn.Linear(C, (H + 2 * K) * D, bias=False)
            self.wo = nn.Linear(H * D, C, bias=False)
            self.mlp_norm = nn.Parameter(torch.ones(C))
            self.w_gateup = nn.Linear(C, 2 * Fd, bias=False)
            self.w_down = nn.Linear(Fd, C, bias=False)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            h = F.rms_norm(x, (C,), self.attn_norm, cfg.norm_eps)
            qkv = self.wqkv(h).view(B, T, H + 2 * K, D).transpose(1, 2)
            q, k, v = qkv.split([H, K, K], dim=1)

            def rope(t):
                t1, t2 = t[..., :D // 2], t[..., D // 2:]
                return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], -1).to(t.dtype)

            a = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True, enable_gqa=K != H)
            x = x + self.wo(a.transpose(1, 2).reshape(B, T, H * D))
            h = F.rms_norm(x, (C,), self.mlp_norm, cfg.norm_eps)
            g, u = self.w_gateup(h).chunk(2, -1)
            return x + self.w_down(F.silu(g) * u)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.layers = nn.ModuleList([Block() for _ in range(cfg.n_layers)])
            self.norm_f = nn.Parameter(torch.ones(C))
            self.lm_head = nn.Linear(C, V, bias=False)
            inv = cfg.rope_theta ** (-torch.arange(0, D // 2, dtype=torch.float64) * 2.0 / D)
            ang = torch.arange(cfg.context, dtype=torch.float64)[:, None] * inv[None]
            self.register_buffer("cos", ang.cos().float(), persistent=False)
            self.register_buffer("sin", ang.sin().float(), persistent=False)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=cfg.init_std)

        def forward(self, idx, tgt):
            T = idx.shape[1]
            x = self.wte(idx)
            cos, sin = self.cos[:T], self.sin[:T]
            for blk in self.layers:
                x = blk(x, cos, sin)
            x = F.rms_norm(x, (C,), self.norm_f, cfg.norm_eps)
            logits = self.lm_head(x)
            return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1))

    return Net()


def torch_run(name, B, T, steps, compile=False, dtype="fp16", hook=None):
    import torch
    cfg = preset(name)
    net = torch_model(cfg).cuda()
    dt = torch.float16 if dtype == "fp16" else torch.bfloat16
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=dt == torch.float16)
    fwd = torch.compile(net) if compile else net
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 256, (B, T + 1), generator=g).cuda()
    idx, tgt = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def step():
        with torch.autocast("cuda", dtype=dt):
            loss = fwd(idx, tgt)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    if hook is not None:
        return hook(step)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(steps):
        loss = step()
    e1.record()
    e1.synchronize()
    ms = e0.elapsed_time(e1) / steps
    out = dict(ms=ms, tok_s=B * T / (ms * 1e-3), loss_last=float(loss))
    del net, opt
    torch.cuda.empty_cache()
    return out


def kernels(name, B, T, steps=3, top=30, dtype="fp16"):
    """Every GPU kernel of a training step, ours and torch.compile's, from one profiler (PyTorch's,
    which traces through CUPTI every kernel the process launches, CuPy's and NVRTC's included):
    GPU time a step per kernel name, largest first, and the step's sum. Both sides warm (3 steps),
    then `steps` steps traced."""
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile

    def hook(run):
        with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                run()
            torch.cuda.synchronize()
            import cupy as cp
            cp.cuda.Device().synchronize()
        rows = {}
        for e in prof.key_averages():
            t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if t and e.key and not e.key.startswith(("ProfilerStep", "cuda", "Memcpy", "Memset")):
                c, s = rows.get(e.key, (0, 0.0))
                rows[e.key] = (c + e.count, s + t / 1e3)
        return rows

    sides = {"ours": ours(name, B, T, 0, precision=dtype, hook=hook),
             "torch.compile": torch_run(name, B, T, 0, compile=True, dtype=dtype, hook=hook)}
    for side, rows in sides.items():
        total = sum(t for _, t in rows.values()) / steps
        print(f"--- kernels of a {name} {dtype} step (B={B}, T={T}), {side}: {total:.2f} ms of kernels a step, "
              f"{sum(c for c, _ in rows.values()) / steps:.0f} launches")
        print("| kernel | launches a step | ms a step | share |")
        print("|---|---:|---:|---:|")
        for k, (c, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"| {k[:90]} | {c / steps:.0f} | {t / steps:.3f} | {100 * t / steps / total:.1f}% |")


# ------------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", nargs="*", default=["small", "base"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--no-flash-run", action="store_true", help="also time the cuBLAS+softmax attention path")
    ap.add_argument("--graph", action="store_true", help="also time our whole step captured as one CUDA graph "
                    "and replayed (the launches it saves; AdamW's step count frozen in the graph)")
    ap.add_argument("--bf16", nargs="*", default=[], help="presets to also time in bf16 (ours and compiled PyTorch)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--profile", action="store_true", help="only print a per-op GPU time profile")
    ap.add_argument("--kernels", action="store_true",
                    help="only list every GPU kernel of a step, ours and torch.compile's, from PyTorch's profiler")
    a = ap.parse_args()
    if a.kernels:
        for name in a.presets:
            kernels(name, *RUNS[name])
        return
    if a.profile:
        for name in a.presets:
            profile(name, *RUNS[name])
        return

    peak = cublas_peak()
    print(f"cuBLAS fp16 peak (8192^3, fp32 accumulate): {peak:.0f} TFLOP/s", flush=True)
    results = {"peak_tflops": peak, "runs": []}

    def report(name, label, r):
        B, T = RUNS[name]
        cfg = preset(name)
        fpt = flops_per_token(cfg, T)
        r.update(preset=name, label=label, B=B, T=T, mfu=fpt * r["tok_s"] / (peak * 1e12),
                 flops_per_token=fpt)
        results["runs"].append(r)
        extra = f" host {r['host_ms']:.1f} ms/step, loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}" \
            if "host_ms" in r else ""
        print(f"{name:6s} {label:28s} {r['ms']:8.2f} ms/step {r['tok_s'] / 1e3:9.1f}k tok/s "
              f"MFU {100 * r['mfu']:5.1f}%{extra}", flush=True)

    for name in a.presets:
        B, T = RUNS[name]
        report(name, "bytemodel fp16 (flash)", ours(name, B, T, a.steps))
        if a.graph:
            try:
                report(name, "bytemodel fp16 (flash, graph)", ours(name, B, T, a.steps, graph=True))
            except Exception as e:
                print(f"{name}: CUDA graph capture failed: {e!r}", flush=True)
        if a.no_flash_run:
            report(name, "bytemodel fp16 (cuBLAS attn)", ours(name, B, T, max(2, a.steps // 3), flash=False))
        if name in a.bf16:
            report(name, "bytemodel bf16 (flash)", ours(name, B, T, a.steps, precision="bf16"))
        if not a.skip_torch:
            report(name, "PyTorch eager fp16", torch_run(name, B, T, a.steps))
            if not a.skip_compile:
                report(name, "PyTorch compile fp16", torch_run(name, B, T, a.steps, compile=True))
                if name in a.bf16:
                    report(name, "PyTorch compile bf16", torch_run(name, B, T, a.steps, compile=True, dtype="bf16"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
