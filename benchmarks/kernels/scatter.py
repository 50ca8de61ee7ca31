"""The ordered row scatter-add (gpu/scatter.cu, ops/cuda_scatter.add_rows) against CuPy's
cupyx.scatter_add (atomics: the same sums in an order that changes from run to run), in the same
run, at the shapes ctx3d's update uses (compress/mix3d.py); and the mixer's integer scatters
(gpu/mixer.cu: add_ones for the counts, put_last for the match table, claim_rows for the checks).

    python benchmarks/kernels/scatter.py [--streams 488 1024 4096] [--json f]

Each case: out (R, m) of the mixer's own sizes, n = streams x (rows a stream adds) indices drawn
over the rows the mixer draws from, values float64 (or ones for the counts). Checked first: our
result must be np.add.at's on the host bit for bit (any difference prints `error:` and exits 1);
the peer's largest difference from it is printed beside (0 for integers; float64 sums in another
order differ in the last bits). Bytes counted: the indices and values read, each touched row of
out read and written once.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from _bench import median_ms, row  # noqa: E402


def cases(S: int):
    """(name, out shape, dtype, n, rows drawn from, vals) for S streams, as mix3d's update calls add_rows."""
    from bytemodel.compress.mix3d import ContextMix3D
    m = ContextMix3D(np.full(S, 2048), 256)        # 2,048 tokens a stream, as on a GPU (NumPy: its sizes only)
    K, M, R = m.K, m.M, m.total.shape[0]
    return [("weights Ws (sets x M)", m.Ws.shape, np.float64, 2 * S, m.Ws.shape[0], "normal"),
            ("confidence Wc", (m.Wc.size,), np.float64, S * K, m.Wc.size, "normal"),
            ("counts table (flat)", (R * m.A,), np.uint16, S * K, R * m.A, "ones"),
            ("row totals", (R,), np.int64, S * K, R, "ones"),
            ("order-0 c0", m.c0.shape, np.int64, S, m.c0.shape[0], "ones")]


def run(S: int) -> list:
    import cupy as cp
    import cupyx
    from bytemodel.ops import cuda_scatter, scatter_ops
    rng = np.random.default_rng(S)
    rows = []
    for name, shape, dtype, n, span, kind in cases(S):
        idx = rng.integers(0, span, n).astype(np.int64)
        vals = (rng.standard_normal((n,) + tuple(shape[1:])) if kind == "normal"
                else np.ones((n,) + tuple(shape[1:]))).astype(dtype)
        base = (rng.standard_normal(shape) if kind == "normal" else rng.integers(0, 100, shape)).astype(dtype)
        want = base.copy()
        scatter_ops.add_rows(want, idx, vals)
        out_d, idx_d, vals_d = cp.asarray(base), cp.asarray(idx), cp.asarray(vals)
        cuda_scatter.add_rows(out_d, idx_d, vals_d)
        got = cp.asnumpy(out_d)
        if not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
            print(f"error: {name} at {S} streams: not np.add.at's bits")
            sys.exit(1)
        try:
            peer_out = cp.asarray(base)
            cupyx.scatter_add(peer_out, idx_d, vals_d)
            peer_diff = float(np.max(np.abs(cp.asnumpy(peer_out).astype(np.float64) - want.astype(np.float64))))
            peer_ms = median_ms(lambda: cupyx.scatter_add(peer_out, idx_d, vals_d))
        except Exception as e:        # CuPy has no atomic add of this type: no peer for the case
            print(f"   (peer: {type(e).__name__}: {str(e).splitlines()[0][:80]})")
            peer_ms, peer_diff = None, None
        ms = median_ms(lambda: cuda_scatter.add_rows(out_d, idx_d, vals_d))
        width = int(np.prod(shape[1:], dtype=np.int64))
        touched = len(np.unique(idx))
        nb = n * 8 + vals.nbytes + 2 * touched * width * np.dtype(dtype).itemsize
        r = row(f"add_rows {name}", f"S={S}", (n,) + tuple(shape), ms, peer_ms, nbytes=nb, err=0.0,
                peer="cupyx.scatter_add")
        r["peer_max_diff"] = peer_diff
        if peer_diff is not None:
            print(f"   peer's largest difference from np.add.at: {peer_diff:.3g}")
        rows.append(r)
        if kind == "ones":           # the counts as the mixer adds them now: add_ones (atomics; integers)
            want1 = base.copy()
            scatter_ops.add_ones(want1, idx)
            d1 = cp.asarray(base)
            cuda_scatter.add_ones(d1, idx_d)
            if not np.array_equal(cp.asnumpy(d1), want1):
                print(f"error: add_ones {name} at {S} streams: not the reference's")
                sys.exit(1)
            ms1 = median_ms(lambda: cuda_scatter.add_ones(d1, idx_d))
            rows.append(row(f"add_ones {name}", f"S={S}", (n,) + tuple(shape), ms1, peer_ms, nbytes=nb, err=0.0,
                            peer="cupyx.scatter_add"))
    rows += _writes(S, rng)
    return rows


def _writes(S: int, rng) -> list:
    """put_last (the match table) and claim_rows (rows changing hands) at the mixer's sizes, checked
    against the NumPy references first; the peer: CuPy's fancy assignment, whose winner among
    repeated rows is unspecified."""
    import cupy as cp
    from bytemodel.compress.mix import MATCH_BITS
    from bytemodel.compress.mix3d import ContextMix3D
    from bytemodel.ops import cuda_scatter, scatter_ops
    m = ContextMix3D(np.full(S, 2048), 256)
    out = []
    idx = rng.integers(0, 1 << MATCH_BITS, S)
    vals = rng.integers(0, 10**9, S)
    want = np.full(1 << MATCH_BITS, -1, dtype=np.int64)
    scatter_ops.put_last(want, idx, vals)
    d, i_d, v_d = cp.full(1 << MATCH_BITS, -1, dtype=cp.int64), cp.asarray(idx), cp.asarray(vals)
    cuda_scatter.put_last(d, i_d, v_d)
    if not np.array_equal(cp.asnumpy(d), want):
        print(f"error: put_last at {S} streams: not the reference's")
        sys.exit(1)

    def peer():
        d[i_d] = v_d
    out.append(row("put_last match table", f"S={S}", (S, 1 << MATCH_BITS), median_ms(lambda: cuda_scatter.put_last(
        d, i_d, v_d)), median_ms(peer), nbytes=S * 24, err=0.0, peer="cupy d[idx] = v"))
    R, K = m.total.shape[0], m.K
    n = S * K
    idx = rng.integers(0, R, n)
    chk = rng.integers(1, 60000, n).astype(np.uint16)
    mask = rng.random(n) < 0.05
    check = np.zeros(R, dtype=np.uint16)
    want = check.copy()
    scatter_ops.claim_rows(want, idx, chk, mask)
    dc, i_d, c_d, m_d = cp.asarray(check), cp.asarray(idx), cp.asarray(chk), cp.asarray(mask)
    cuda_scatter.claim_rows(dc, i_d, c_d, m_d)
    if not np.array_equal(cp.asnumpy(dc), want):
        print(f"error: claim_rows at {S} streams: not the reference's")
        sys.exit(1)

    def peer2():
        rb = i_d[m_d]
        dc[rb] = c_d[m_d]
    out.append(row("claim_rows checks", f"S={S}", (n, R), median_ms(lambda: cuda_scatter.claim_rows(dc, i_d, c_d, m_d)),
                   median_ms(peer2), nbytes=n * 11, err=0.0, peer="cupy masked d[idx] = c"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", nargs="*", type=int, default=[488, 1024, 4096])
    ap.add_argument("--json", help="write the rows here")
    a = ap.parse_args()
    print(f"{'op':<28} {'streams':>6} {'shape':>22} {'time':>12} {'rate':>13}  {'against':>14}  check (bits)")
    rows = [r for S in a.streams for r in run(S)]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
