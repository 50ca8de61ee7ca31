"""Generation speed: bytemodel against Hugging Face transformers `generate` on the identical model.

The same random-init weights (preset shape, seed 0) run in both: ours through `generate`, theirs
as a `LlamaForCausalLM` with the weights copied across (each matrix transposed, wqkv split into
q/k/v, w_gateup into gate/up; rms_norm_eps, rope_theta, head_dim from our config; the copy is
checked by comparing logits). Both sample at temperature 1 from the full distribution after a
64-byte prompt, for a fixed number of new tokens (no early stop).

Reported per (device, preset, side, batch N): time to first byte (in process, warm: a call that
makes one token) and aggregate tokens/s over the whole call (N samples x new tokens / seconds,
set-up, prefill and, for ours, the weight transposes and graph capture included).
Start-up from the command line (`--startup`): `bytemodel generate --bytes 1` wall time in a fresh
process, with an empty CuPy kernel cache (cold) and again with it filled (warm).

    python benchmarks/generate.py --device cuda --presets small,base --samples 1,16,256 --hf --startup
    python benchmarks/generate.py --device cuda --presets base --samples 1,64 --mask --only ours,host   # a DNA byte mask: device / host loop
    python benchmarks/generate.py --device cuda --presets base --samples 1,4 --pdl --rounds 3   # PDL on (default) / off
    python benchmarks/generate.py --device cuda --presets base --samples 1,4 --persist --rounds 3   # one persistent kernel a step (default) / the launches
    python benchmarks/generate.py --device cuda --presets base --samples 16,64 --views --rounds 3   # the fused step (default) / views only / as it was
    python benchmarks/generate.py --device cuda --presets base --samples 16,64 --mma --rounds 3  # cuBLAS step / tensor-core kernels
    python benchmarks/generate.py --device cuda --presets base --samples 1,64 --tokens 512 --kernels   # every kernel of a step
    PYTHONPATH=. /work/venv-torch/bin/python benchmarks/generate.py --device cpu --presets small --samples 1,16 --hf --tokens 200

On the CPU, as in cpu_generate.py, the two sides are measured in separate processes (two
numerical runtimes in one process fight over the cores); the sides alternate within each of
--rounds rounds and the median is reported.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from bytemodel.config import preset
from bytemodel.decode.generate import generate
from bytemodel.model import Model
from bytemodel.ops import numpy_ops
from bytemodel.tokenizer import Tokenizer

PROMPT = bytes(range(32, 96))


def our_model(name, device, precision):
    from bytemodel.ops import get_backend
    cfg = preset(name)
    m = Model(cfg, get_backend(device, precision))
    m.init_weights(0)
    return m


def sync(device):
    if device == "cuda":
        import cupy as cp
        cp.cuda.Device().synchronize()


def dna_mask():
    """A DNA run's byte set (A C G T and the newline; <doc> stays allowed): what the CLI's generate
    samples from by default (runinfo.RunData.allowed_ids)."""
    tok = Tokenizer()
    allowed = np.zeros(tok.vocab_size, dtype=bool)
    allowed[list(b"ACGT\n")] = True
    allowed[tok.doc_id] = True
    return allowed


def time_ours(name, device, precision, tokens, samples, engine="auto", allowed=None):
    m = our_model(name, device, precision)
    tok = Tokenizer()
    kw = dict(engine=engine, allowed=allowed)
    generate(m, tok, 2, PROMPT, seed=0, samples=samples, **kw)   # compile, warm up
    sync(device)
    t = time.perf_counter()
    generate(m, tok, 1, PROMPT, seed=0, **kw)
    sync(device)
    ttfb = time.perf_counter() - t
    t = time.perf_counter()
    out = generate(m, tok, tokens, PROMPT, seed=0, samples=samples, **kw)
    sync(device)
    dt = time.perf_counter() - t
    assert sum(len(o) for o in (out if samples > 1 else [out])) == tokens * samples
    return ttfb, tokens * samples / dt, (tokens - 1) * samples / (dt - ttfb)


def kernels_of_a_step(name, precision, tokens, samples, top=25):
    """Every GPU kernel of one `generate` call (after a warm call), from PyTorch's profiler, which
    traces through CUPTI every kernel the process launches, those replayed from a CUDA graph
    included: GPU time per generated step by kernel name, largest first; the sum of kernel time a
    step against the step's wall time (the rest: the gaps between kernels and the host)."""
    from torch.profiler import ProfilerActivity, profile as tprofile
    m = our_model(name, "cuda", precision)
    tok = Tokenizer()
    generate(m, tok, tokens, PROMPT, seed=0, samples=samples)   # compile, capture, warm up
    sync("cuda")
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        generate(m, tok, tokens, PROMPT, seed=0, samples=samples)
        sync("cuda")
        wall = time.perf_counter() - t
    rows = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us and e.key and not e.key.startswith(("ProfilerStep", "cuda", "Memcpy", "Memset")):
            c, s_ = rows.get(e.key, (0, 0.0))
            rows[e.key] = (c + e.count, s_ + us)
    total = sum(u for _, u in rows.values()) / tokens
    print(f"--- {name} {precision}, {samples} samples x {tokens} tokens: {wall / tokens * 1e6:,.1f} us wall a step, "
          f"{total:,.1f} us of kernels a step ({sum(c for c, _ in rows.values()) / tokens:.0f} launches a step; "
          f"{tokens * samples / wall:,.0f} tokens/s under the profiler)")
    print("| kernel | launches a step | us a step | us a launch | share of kernel time |")
    print("|---|---:|---:|---:|---:|")
    for k, (c, u) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"| {k[:90]} | {c / tokens:.1f} | {u / tokens:,.1f} | {u / max(c, 1):,.2f} | {100 * u / tokens / total:.1f}% |")


def hf_model(name, device, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from bytemodel.model import views
    cfg = preset(name)
    ours = Model(cfg, numpy_ops)
    ours.init_weights(0)
    W = views(ours.params, cfg)
    C, F, H, K, D = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    hc = LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=C, intermediate_size=F, num_hidden_layers=cfg.n_layers,
                     num_attention_heads=H, num_key_value_heads=K, head_dim=D,
                     max_position_embeddings=cfg.context, rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta,
                     tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, mlp_bias=False,
                     hidden_act="silu", bos_token_id=None, eos_token_id=None, pad_token_id=0)
    hm = LlamaForCausalLM(hc)
    sd = {"model.embed_tokens.weight": W["wte"], "model.norm.weight": W["norm_f"]}
    if not cfg.tie_embeddings:
        sd["lm_head.weight"] = W["lm_head"].T
    for i in range(cfg.n_layers):
        p, q = f"layers.{i}.", f"model.layers.{i}."
        qkv = W[p + "wqkv"]
        sd.update({q + "input_layernorm.weight": W[p + "attn_norm"],
                   q + "self_attn.q_proj.weight": qkv[:, :H * D].T,
                   q + "self_attn.k_proj.weight": qkv[:, H * D:(H + K) * D].T,
                   q + "self_attn.v_proj.weight": qkv[:, (H + K) * D:].T,
                   q + "self_attn.o_proj.weight": W[p + "wo"].T,
                   q + "post_attention_layernorm.weight": W[p + "mlp_norm"],
                   q + "mlp.gate_proj.weight": W[p + "w_gateup"][:, :F].T,
                   q + "mlp.up_proj.weight": W[p + "w_gateup"][:, F:].T,
                   q + "mlp.down_proj.weight": W[p + "w_down"].T})
    missing, unexpected = hm.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()},
                                             strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    # the copy is right: the same logits as our NumPy forward on the same ids
    ids = np.random.default_rng(0).integers(0, 256, (1, 40))
    want = ours.forward_cached(ids, ours.new_cache(1, 40), 0)
    with torch.no_grad():
        got = hm(torch.from_numpy(ids)).logits.numpy()
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < 1e-4, err
    return hm.to(device=device, dtype=dtype).eval(), err


def time_hf(name, device, tokens, samples, static=False):
    import torch
    dtype = torch.float16 if device == "cuda" else torch.float32
    hm, err = hf_model(name, device, dtype)
    ids = torch.tensor([[256] + list(PROMPT)], device=device).repeat(samples, 1)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)
    if static:
        kw["cache_implementation"] = "static"

    def run(n):
        with torch.inference_mode():
            out = hm.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        if device == "cuda":
            torch.cuda.synchronize()
        assert out.shape == (samples, ids.shape[1] + n)

    run(4)
    run(4)      # (static: compile happens in the first calls)
    t = time.perf_counter()
    run(1)
    ttfb = time.perf_counter() - t
    t = time.perf_counter()
    run(tokens)
    dt = time.perf_counter() - t
    return ttfb, tokens * samples / dt, (tokens - 1) * samples / (dt - ttfb), err


def startup(ckpt, device, precision, cache_dir):
    env = dict(os.environ, CUPY_CACHE_DIR=cache_dir)
    cmd = [sys.executable, "-m", "bytemodel.cli", "generate", "-c", ckpt, "--bytes", "1", "--device", device,
           "--precision", precision, "--prompt", PROMPT.decode()]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, capture_output=True)
    return time.perf_counter() - t


def child(args):
    """One measurement in this process; prints a JSON line."""
    kind, name, n = args.child.split(":")
    n = int(n)
    if kind.startswith("ours-g"):     # several steps per CUDA graph
        from bytemodel.ops import cuda_decode
        cuda_decode.GRAPH_STEPS = int(kind[6:])
        r = time_ours(name, args.device, args.precision, args.tokens, n)
    elif kind.startswith("ours-b"):   # the graph decoder up to this batch (GRAPH_MAX_BATCH)
        from bytemodel.ops import cuda_decode
        cuda_decode.GRAPH_MAX_BATCH = int(kind[6:])
        r = time_ours(name, args.device, args.precision, args.tokens, n)
    elif kind == "ours-mma":          # the kernel path with tensor-core products up to N = 64 (cuda_decode.MMA_MAX_BATCH)
        from bytemodel.ops import cuda_decode
        cuda_decode.MMA_MAX_BATCH = 64
        r = time_ours(name, args.device, args.precision, args.tokens, n)
    elif kind == "ours-nopersist":    # the kernel path launched kernel by kernel (cuda_decode.PERSIST off)
        from bytemodel.ops import cuda_decode
        cuda_decode.PERSIST = False
        r = time_ours(name, args.device, args.precision, args.tokens, n)
    elif kind == "ours-nopdl":        # the kernel path without programmatic dependent launch (cuda_decode.PDL)
        from bytemodel.ops import cuda_decode
        cuda_decode.PDL = False
        r = time_ours(name, args.device, args.precision, args.tokens, n)
    elif kind in ("ours-unfused", "ours-views"):   # the cuBLAS step as it was (copies around RoPE, the cache
        from bytemodel.ops import cuda_decode        # and attention; each add then its norm), or reading k, v, q
        cuda_decode.STEP_VIEWS = kind == "ours-views"  # where the projection left them (STEP_VIEWS) but the add
        cuda_decode.STEP_ADD_NORM = False              # and norm apart; "ours" is both (the default)
        r = time_ours(name, args.device, args.precision, args.tokens, n)
    elif kind == "ours-launched":     # above GRAPH_MAX_BATCH: the cuBLAS step launched from Python, as before
        from bytemodel.ops import cuda_decode
        cuda_decode.BLAS_GRAPH = False
        r = time_ours(name, args.device, args.precision, args.tokens, n)
    elif kind == "ours":
        r = time_ours(name, args.device, args.precision, args.tokens, n)
    elif kind == "host":
        r = time_ours(name, args.device, args.precision, args.tokens, n, engine="host")
    elif kind == "ours-mask":         # a DNA run's byte mask (the CLI's default), on the device's sampler
        r = time_ours(name, args.device, args.precision, args.tokens, n, allowed=dna_mask())
    elif kind == "host-mask":         # the same mask through the host loop: where a mask sent generation before
        r = time_ours(name, args.device, args.precision, args.tokens, n, engine="host", allowed=dna_mask())
    else:
        r = time_hf(name, args.device, args.tokens, n, static=(kind == "hf-static"))[:3]
    print(json.dumps(r))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--presets", default="small,base")
    ap.add_argument("--samples", default="1,16,256")
    ap.add_argument("--tokens", type=int, default=0, help="new tokens per sample (default: 3/4 of the context)")
    ap.add_argument("--hf", action="store_true", help="also time transformers generate (eager, static)")
    ap.add_argument("--hf-static", action="store_true", help="also the static cache (compiled) on the GPU")
    ap.add_argument("--host-loop", action="store_true", help="also the pre-decoder loop (engine='host'), N = 1")
    ap.add_argument("--mask", action="store_true", help="also ours under a DNA run's byte mask (the CLI's default), "
                    "on the device and through the host loop (where a mask sent generation before)")
    ap.add_argument("--startup", action="store_true")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--graph-steps", type=int, default=0, help="also ours with this many steps per graph")
    ap.add_argument("--graph-max-batch", type=int, default=0,
                    help="also ours with the graph decoder up to this batch (GRAPH_MAX_BATCH)")
    ap.add_argument("--launched", action="store_true",
                    help="also ours with the cuBLAS step launched from Python (BLAS_GRAPH off), N > 64")
    ap.add_argument("--mma", action="store_true",
                    help="also ours with the tensor-core kernel path for 4 < N <= 64 (cuda_decode.MMA_MAX_BATCH)")
    ap.add_argument("--persist", action="store_true",
                    help="also ours with the kernel path's launches one by one instead of the persistent step, "
                         "N <= 4 (cuda_decode.PERSIST)")
    ap.add_argument("--pdl", action="store_true",
                    help="also ours without programmatic dependent launch in the kernel path, N <= 4 (cuda_decode.PDL)")
    ap.add_argument("--views", action="store_true",
                    help="also ours with the captured cuBLAS step as it was (ours-unfused: copies around RoPE, the cache and "
                         "attention, each add and its norm apart) and with views only (STEP_VIEWS without STEP_ADD_NORM), N > 4")
    ap.add_argument("--kernels", action="store_true",
                    help="only list every GPU kernel of a generation step (ours, the default path at each N), "
                         "from PyTorch's profiler (CUDA graphs' kernels included)")
    ap.add_argument("--only", help="comma-separated sides to run (ours,host,hf,hf-static)")
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.device == "cpu":
        args.precision = "fp32"
    if args.child:
        return child(args)
    if args.kernels:
        for name in args.presets.split(","):
            for n in args.samples.split(","):
                kernels_of_a_step(name, args.precision, args.tokens or preset(name).context * 3 // 4, int(n))
        return
    rows = []
    print("| device | preset | side | N | new tokens | first byte ms | tokens/s (call) | tokens/s (after 1st) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.presets.split(","):
        tokens = args.tokens or preset(name).context * 3 // 4
        a = argparse.Namespace(**vars(args))
        a.tokens = tokens
        sides = [("ours", int(n)) for n in args.samples.split(",")]
        if args.host_loop:
            sides.append(("host", 1))
        if args.mask:
            sides += [(k, int(n)) for k in ("ours-mask", "host-mask") for n in args.samples.split(",")]
        if args.hf:
            sides += [("hf", int(n)) for n in args.samples.split(",") if int(n) <= 64]
        if args.hf_static:
            sides += [("hf-static", 1)]
        if args.graph_steps:
            sides += [(f"ours-g{args.graph_steps}", int(n)) for n in args.samples.split(",") if int(n) <= 16]
        if args.launched:
            sides += [("ours-launched", int(n)) for n in args.samples.split(",") if int(n) > 64]
        if args.mma:
            sides += [("ours-mma", int(n)) for n in args.samples.split(",") if 4 < int(n) <= 64]
        if args.pdl:
            sides += [("ours-nopdl", int(n)) for n in args.samples.split(",") if int(n) <= 4]
        if args.persist:
            sides += [("ours-nopersist", int(n)) for n in args.samples.split(",") if int(n) <= 4]
        if args.views:
            sides += [(k, int(n)) for k in ("ours-unfused", "ours-views") for n in args.samples.split(",") if int(n) > 4]
        if args.graph_max_batch:
            sides += [(f"ours-b{args.graph_max_batch}", int(n)) for n in args.samples.split(",")
                      if int(n) > 16]
        if args.only:
            sides = [s for s in sides if (s[0] if s[0] == "hf-static" else s[0].split("-")[0]) in args.only.split(",")]
        vals = {side: [] for side in sides}
        for _ in range(args.rounds):          # the sides alternate within each round
            for kind, n in sides:
                tk = tokens if not kind.startswith("host") else min(tokens, 128)
                cmd = [sys.executable, __file__, "--child", f"{kind}:{name}:{n}", "--device", args.device,
                       "--precision", args.precision, "--tokens", str(tk)]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode:
                    print(f"{kind} {name} N={n} failed: {r.stderr.strip().splitlines()[-1:]}", flush=True)
                    continue
                vals[(kind, n)].append(json.loads(r.stdout.strip().splitlines()[-1]))
        for (kind, n), v in vals.items():
            if v:
                tk = tokens if not kind.startswith("host") else min(tokens, 128)
                ttfb, tps, after = (statistics.median(x[i] for x in v) for i in range(3))
                rows.append((name, kind, n, tk, ttfb, tps, after))
                print(f"| {args.device} {args.precision} | {name} | {kind} | {n} | {tk} | {ttfb * 1e3:,.1f} | "
                      f"{tps:,.0f} | {after:,.0f} |", flush=True)
    if args.startup:
        from bytemodel import checkpoint
        for name in args.presets.split(","):
            m = our_model(name, "cpu", "fp32")
            with tempfile.TemporaryDirectory() as d:
                ck = os.path.join(d, "m.safetensors")
                checkpoint.save(ck, m.cfg, Tokenizer(), m.ops.to_numpy(m.params))
                cache = os.path.join(d, "cupy-cache")
                cold = startup(ck, args.device, args.precision, cache)
                warm = startup(ck, args.device, args.precision, cache)
                print(f"startup {args.device} {name}: cold cache {cold:.2f} s, warm cache {warm:.2f} s", flush=True)


if __name__ == "__main__":
    main()
