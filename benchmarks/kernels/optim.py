"""The optimizer's flat-buffer kernels (gpu/optim.cu): the global gradient norm (two fixed-order
passes) and one AdamW step, ours against the same math as CuPy expressions, in the same run.

    python benchmarks/kernels/optim.py [--presets small base] [--precision fp16] [--json f]

Buffers: the preset's parameter count P (the flat fp32 layout). Bytes counted: the norm reads P
floats; AdamW reads p, g, m, v and the decay mask and writes p, m, v and the compute copy.
Checked against numpy_ops: the norm in float64 over the whole buffer, AdamW (fp32, the
reference's own dtype) on the first 2^20 entries.
"""
from __future__ import annotations

import numpy as np

from _bench import check, main, median_ms, row

from bytemodel.config import preset as preset_cfg
from bytemodel.model import n_params
from bytemodel.ops import numpy_ops as ref


def run(ops, preset, shape):
    import cupy as cp
    P = n_params(preset_cfg(preset)) // 4 * 4
    rng = cp.random.default_rng(0)
    pd, gd, md = (rng.standard_normal(P, dtype=cp.float32) * s for s in (1.0, 1e-2, 1e-3))
    vd = cp.abs(rng.standard_normal(P, dtype=cp.float32)) * 1e-6
    maskd = (rng.random(P) < 0.9).astype(cp.float32)
    # the reference on the first CHECK entries (AdamW is elementwise once the norm is known; the
    # norm is checked over the whole buffer, in float64 on the host)
    CHECK = min(P, 1 << 20)
    p, g, m, v, mask = (cp.asnumpy(a[:CHECK]) for a in (pd, gd, md, vd, maskd))
    norm_ref = ref.global_norm(cp.asnumpy(gd))
    err_n = check("global norm", np.array([float(ops.global_norm(gd))]), np.array([norm_ref]), 1e-5)   # fp32 partial sums of ~600 squares each
    kw = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=7, grad_scale=0.5, clip=1.0)
    ops.adamw_step(pd, gd, md, vd, maskd, norm=ops.global_norm(gd), **kw)
    ref.adamw_step(p, g, m, v, mask, norm=norm_ref, **kw)
    err_a = max(check("adamw " + n, a[:CHECK], b, 1e-6) for n, a, b in (("p", pd, p), ("m", md, m), ("v", vd, v)))
    nrm = ops.global_norm(gd)

    def peer_a():   # the same step as CuPy expressions (several passes)
        c = cp.minimum(1.0, 1.0 / (cp.linalg.norm(gd) * 0.5 + 1e-6)) * 0.5
        gg = gd * c
        md[...] = 0.9 * md + 0.1 * gg
        vd[...] = 0.95 * vd + 0.05 * gg * gg
        pd[...] -= 1e-3 * ((md / (1 - 0.9 ** 7)) / (cp.sqrt(vd / (1 - 0.95 ** 7)) + 1e-8) + 0.1 * maskd * pd)
        return pd.astype(ops.act_dtype)
    cw = 0 if ops.precision == "fp32" else ops.act_dtype.itemsize
    return [row("global_norm", preset, (P,), median_ms(lambda: ops.global_norm(gd)), median_ms(lambda: cp.linalg.norm(gd)),
                nbytes=4 * P, err=err_n),
            row("adamw_step", preset, (P,), median_ms(lambda: ops.adamw_step(pd, gd, md, vd, maskd, norm=nrm, **kw)),
                median_ms(peer_a), nbytes=(8 * 4 + cw) * P, err=err_a)]


if __name__ == "__main__":
    main(run, __doc__)
