"""What the dropout hash costs inside the wgmma attention kernels (Hopper only, head dim 64): the
shipped dropout kernels (flash_fwd_h64_bs_drop, flash_bwd_h64_drop: two keyed murmur3 finalisers
a word of 4 probabilities) against the same kernels with the hash cut to one finaliser (_r1) or
one multiply (_r0; benchmarks/kernels/flash_hopper_variants.cu) and against the kernels without
dropout, at the base preset's shape, in the same run. The cut variants' masks are not the
reference's: they time what the rounds cost, nothing else.

    PYTHONPATH=. python benchmarks/kernels/attn_dropout_hash.py [--precision bf16] [--shape 32,12,1024,64]

Timing: _bench.median_ms (3 warm-ups, median of 20 samples of 10 calls, CUDA events); p = 0.2.
"""
from __future__ import annotations

import argparse
import os

import _bench  # (benchmarks/kernels/_bench.py: the shared CUDA-event timer)

VARIANTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flash_hopper_variants.cu")


def study_backend(precision: str):
    """A CUDA backend whose dropout kernels take the hash rounds `.hr` (2: the shipped ones)."""
    from bytemodel.ops import cuda_ops
    with open(VARIANTS) as f:
        extra = "\n" + f.read()

    class Study(cuda_ops.CudaBackend):
        hr = 2

        def _hopper_kernel(self, D, name=None, drop=False):
            if not drop or self.hr == 2:
                return super()._hopper_kernel(D, name, drop)
            base = cuda_ops.FLASH_FWD_HOPPER[D]
            mod = cuda_ops._hopper_module(self.precision, extra)
            return mod.get_function(f"{base}_drop_r{self.hr}"), cuda_ops.HOPPER_FWD_KERNELS[base][1:]

        def _hopper_bwd_kernel(self, D, drop=False):
            if not drop or self.hr == 2:
                return super()._hopper_bwd_kernel(D, drop)
            name, tiles = cuda_ops.FLASH_BWD_HOPPER[D]
            return cuda_ops._hopper_module(self.precision, extra).get_function(f"{name}_drop_r{self.hr}"), tiles
    return Study(precision)


def main():
    import cupy as cp
    from bytemodel.model import dropout_key
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="bf16", choices=["fp16", "bf16"])
    ap.add_argument("--shape", default="32,12,1024,64", help="B,H,T,D (D = 64)")
    a = ap.parse_args()
    B, H, T, D = (int(x) for x in a.shape.split(","))
    ops = study_backend(a.precision)
    if not ops.hopper or D != 64:
        raise SystemExit("error: the study needs a Hopper GPU and head dim 64")
    rng = cp.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((B, H, T, D), dtype=cp.float32).astype(ops.act_dtype) for _ in range(4))
    drop = (0.2, dropout_key(0, 1, 1 << 40), 0)
    fl = 4.0 * B * H * T * T * D / 2
    rows = {}
    for label, hr, dr in (("no dropout", 2, None), ("hash, 2 rounds (shipped)", 2, drop),
                          ("hash, 1 round", 1, drop), ("1 multiply", 0, drop)):
        ops.hr = hr
        out, lse = ops.attention_forward(q, k, v, drop=dr)
        f = _bench.median_ms(lambda: ops.attention_forward(q, k, v, drop=dr))
        b = _bench.median_ms(lambda: ops.attention_backward(do, q, k, v, out, lse, drop=dr))
        rows[label] = (f, b)
    f0, b0 = rows["no dropout"]
    print(f"{a.precision} {(B, H, T, D)}: fwd ms (TFLOP/s, x no dropout) | bwd ms (TFLOP/s, x) | both (x)")
    for label, (f, b) in rows.items():
        print(f"  {label:26s} {f:7.3f} ({fl / f / 1e9:5.0f}, {f / f0:.2f}x) | {b:7.3f} ({2.5 * fl / b / 1e9:5.0f}, "
              f"{b / b0:.2f}x) | {(f + b) / (f0 + b0):.2f}x")


if __name__ == "__main__":
    main()
