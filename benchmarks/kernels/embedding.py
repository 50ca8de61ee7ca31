"""Embedding forward (gather) and backward (gpu/embedding.cu): ours against CuPy's `wte[idx]` and
its atomic scatter-add (cupyx.scatter_add: the order of its adds varies, ours does not).

    python benchmarks/kernels/embedding.py [--presets small base] [--precision fp16] [--json f]

Ids: random bytes (V = 256), the presets' N = B*T rows, width C. Bytes counted: forward reads
the N ids and N*C rows, writes N*C; backward reads N*C dout and the ids, reads and writes the V*C
fp32 table. The check also covers the sorted path (any vocabulary; a V = 9000 case).
"""
from __future__ import annotations

import numpy as np

from _bench import check, main, median_ms, rnd, row

from bytemodel.ops import numpy_ops as ref


def run(ops, preset, shape):
    import cupy as cp
    import cupyx
    B, T, C, _, _ = shape
    rng = np.random.default_rng(0)
    rows = []
    for V in (256, 9000):
        w, wd = rnd(ops, rng, (V, C))
        idx = rng.integers(0, V, (B, T))
        idxd = cp.asarray(idx, dtype=cp.int32)
        d, dd = rnd(ops, rng, (B, T, C))
        out, cache = ops.embedding_forward(wd, idxd)
        err_f = check("embedding forward", out, w[idx], 0.0)
        dw = cp.zeros((V, C), dtype=cp.float32)
        ops.embedding_backward(dd, cache, dw)
        dw_ref = np.zeros((V, C))
        ref.embedding_backward(d, idx, dw_ref)
        err_b = check("embedding backward", dw, dw_ref, 1e-6)   # fp32 sums of exact act values
        isz = ops.act_dtype.itemsize
        nf = B * T * 4 + 2 * B * T * C * isz
        nb = B * T * C * isz + B * T * 4 + 2 * V * C * 4
        flat = idxd.reshape(-1)
        d2 = dd.reshape(-1, C)
        peer_b = lambda: cupyx.scatter_add(dw, flat, d2.astype(cp.float32))   # noqa: E731
        tag = "" if V == 256 else f" V={V}"
        rows.append(row("embedding_fwd" + tag, preset, (B * T, C), median_ms(lambda: ops.embedding_forward(wd, idxd)),
                        median_ms(lambda: wd[idxd]), nbytes=nf, err=err_f))
        rows.append(row("embedding_bwd" + tag, preset, (B * T, C), median_ms(lambda: ops.embedding_backward(dd, cache, dw)),
                        median_ms(peer_b), nbytes=nb, err=err_b, peer="CuPy atomic"))
    return rows


if __name__ == "__main__":
    main(run, __doc__)
