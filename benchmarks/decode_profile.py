"""Where a decode step's time goes on the GPU: the graph decoder's kernels one by one, the whole
captured step, and the cuBLAS path's forward and sampler, per batch size (random weights).

    PYTHONPATH=. python3 benchmarks/decode_profile.py --preset base --batches 1,16,64 --pos 200

Each figure is the mean over --reps launches between CUDA events, after a warm-up.
"""
from __future__ import annotations

import argparse

import numpy as np
import cupy as cp

from bytemodel.config import preset
from bytemodel.model import Model
from bytemodel.ops import get_backend
from bytemodel.ops import cuda_decode


def timed(fn, reps):
    fn()
    cp.cuda.Device().synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) * 1e3 / reps   # us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="base")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--pos", type=int, default=200)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    cfg = preset(a.preset)
    m = Model(cfg, get_backend("cuda", a.precision))
    m.init_weights(0)
    W = m.weights()
    V = cfg.vocab_size
    print(f"| {a.preset} {a.precision} | B | what | us a launch |")
    print("|---|---:|---|---:|")
    for B in (int(x) for x in a.batches.split(",")):
        for graph in (True, False):
            d = cuda_decode.Decoder(m, B, V, 0, 1.0, 0, 1.0, graph=graph)
            d.begin(cp.zeros((B, V), cp.float32), a.pos, W)
            rows = []

            def step_and_rewind():
                d.step(1)
                with d.stream:
                    d.state[0] = a.pos
                    d.state[1] = 0
                d._pos = a.pos
            step_and_rewind()                  # the first step runs eagerly, the second captures the graph
            rows.append(("whole step", timed(step_and_rewind, a.reps)))
            with d.stream:
                rows.append(("sampler", timed(lambda: d.sampler(d.logits, d.state, 1.0, 0, 1.0), a.reps)))
            if not graph:
                ids = cp.zeros((B, 1), cp.int64)
                rows.append(("forward_cached (cuBLAS path)",
                             timed(lambda: m.forward_cached(ids, d.cache, a.pos, W), a.reps)))
            else:
                L0 = d.layers[0]
                C, F, H, K, D = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
                i32, eps, null = np.int32, np.float32(cfg.norm_eps), np.uint64(0)
                kc, vc = d.cache[0]
                wb = lambda n: ((n + 7) // 8,)   # noqa: E731
                with d.stream:
                    d.state[0] = a.pos
                    rows.append(("qkv", timed(lambda: d.k_qkv(wb((H + 2 * K) * D // 2), (256,), (
                        d.x, null, null, d.wte, L0["g1"], L0["wqkv"], d.cos, d.sin, d.q, kc, vc, d.state,
                        i32(B), i32(C), i32(H), i32(K), i32(D), i32(cfg.context), eps), shared_mem=d.smem["C"]), a.reps)))
                    rows.append(("attention", timed(lambda: d.k_attn((B * H, d.NS), (128,), (
                        d.q, kc, vc, d.part, d.tickets, d.att, d.state, i32(H), i32(K), i32(cfg.context),
                        i32(d.CH), np.float32(d.scale_log2))), a.reps)))
                    rows.append(("proj wo", timed(lambda: d.k_proj(wb(C), (256,), (
                        d.att, L0["wo"], d.x, null, i32(B), i32(H * D), i32(C), i32(1), eps, null),
                        shared_mem=d.smem["A"]), a.reps)))
                    rows.append(("gate/up", timed(lambda: d.k_gu(wb(F), (256,), (
                        d.x, L0["g2"], L0["wgu"], d.s, i32(B), i32(C), i32(F), eps), shared_mem=d.smem["C"]), a.reps)))
                    rows.append(("proj w_down", timed(lambda: d.k_proj(wb(C), (256,), (
                        d.s, L0["wd"], d.x, null, i32(B), i32(F), i32(C), i32(1), eps, null),
                        shared_mem=d.smem["F"]), a.reps)))
                    rows.append(("head", timed(lambda: d.k_proj(wb(V), (256,), (
                        d.x, d.head, d.logits, d.g_f, i32(B), i32(C), i32(V), i32(0), eps, null),
                        shared_mem=d.smem["C"]), a.reps)))
            for what, us in rows:
                print(f"| {'graph' if graph else 'cuBLAS'} | {B} | {what} | {us:,.1f} |", flush=True)
            del d
            cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
