"""The residual add (gpu/residual.cu, ops.add): ours against CuPy's `a + b`, in the same run.

    python benchmarks/kernels/residual.py [--presets small base] [--precision fp16] [--json f]

Shape: the residual stream (N = B*T, C). Bytes counted: read a and b, write out.
"""
from __future__ import annotations

import numpy as np

from _bench import check, main, median_ms, rnd, row


def run(ops, preset, shape):
    B, T, C, _, _ = shape
    rng = np.random.default_rng(0)
    a, ad = rnd(ops, rng, (B * T, C))
    b, bd = rnd(ops, rng, (B * T, C))
    err = check("add", ops.add(ad, bd), a + b, {"fp16": 2e-3, "bf16": 1.6e-2, "fp32": 1e-7}[ops.precision])
    nb = 3 * B * T * C * ops.act_dtype.itemsize
    return [row("add", preset, (B * T, C), median_ms(lambda: ops.add(ad, bd)), median_ms(lambda: ad + bd),
                nbytes=nb, err=err)]


if __name__ == "__main__":
    main(run, __doc__)
