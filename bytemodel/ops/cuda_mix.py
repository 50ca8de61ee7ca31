"""The ctx3f mixer's kernels (gpu/mix_step.cu), compiled once per context count K, and their launches.

    prepare(m, back, keys, c)              # after ContextMix2._keys: mix_prepare, one block per stream
    predict(m, net, active, c)             # mix_predict: the mix, its softmax and frequencies
    update(m, t, active, sym, rates, c)    # mix_grad, mix_apply, the claims, counts, halving, match model

m is the mixer (compress/mix3f.ContextMix3F: its state and step buffers as device arrays); c its
format's constants (a dict: compress/mix3f._constants). The NumPy reference of all of it is ctx3's
arithmetic (compress/mix2.ContextMix3, and ctx3d on NumPy, which is it bit for bit); the module doc
of gpu/mix_step.cu says what each kernel computes and how its sums stay in a fixed order.
"""
from __future__ import annotations

import numpy as np
import cupy as cp

from .gpu_source import mix_options, source

THREADS = 256                     # gpu/mix_step.cu's block (its tree sums assume it)
_MODULES: dict = {}


def kernel(name: str, K: int):
    key = (int(K), cp.cuda.Device().id)
    if key not in _MODULES:
        _MODULES[key] = cp.RawModule(code=source("mix_step.cu"), options=mix_options(K))
    return _MODULES[key].get_function(name)


def _blocks(n: int):
    return ((max(1, (int(n) + THREADS - 1) // THREADS),), (THREADS,))


def prepare(m, back, keys, c) -> None:
    """Step t's inputs but the network's, for m's first back.shape[0] streams."""
    active = int(back.shape[0])
    kernel("mix_prepare", m.K)((active,), (THREADS,), (
        back, np.int32(back.shape[1]), keys, np.int32(keys.shape[1]), m.kind, m.arg, m.offset,
        np.int64(m.R), np.uint64(c["P"]), m.word, m.prev_word, m.check, m.table, m.total,
        m.c0, m.log_c, np.float64(c["alpha"] * m.A), m.Ws, m.base, m.Wc,
        np.int32(m.CHAIN), np.int32(c["n_buckets"]), np.int32(c["conf_buckets"]),
        m.mptr, m.mlen, m.hist, np.int32(c["max_len"]), np.int64(m.A),
        m._X, m._W, m._rows, m._chk, m._bad, m._sel, m._order, m._cls, m._pred, m._has, m._lb))


def predict(m, net, active: int, c) -> None:
    """X[0] = net (active, A) float64; the mix into m._z, its softmax m._p, the coder's m._freqs."""
    kernel("mix_predict", m.K)((active,), (THREADS,), (
        net, m._X, m._W, m.V, m._order, m._pred, m._has, m._lb, m.wm,
        np.int64(m.A), np.int64(c["total"]), m._zs, m._z, m._p, m._freqs))


def update(m, t: int, active: int, sym, rates, c) -> None:
    """After step t: learn the coded tokens sym (active,) int64 on the device. rates: the steps'
    factors (final layer, weight sets, confidence weights, match bonus); m.epoch() a fresh epoch."""
    K, A = m.K, m.A
    kernel("mix_grad", K)((active,), (THREADS,), (
        m._X, m._zs, m._p, sym, m._pred, m._has, np.int64(A), m._g, m._gv, m._gm, m._gc))
    nV, nWs, conf2, nwm = m.V.shape[0], m.Ws.shape[0], 2 * c["conf_buckets"], m.wm.shape[0]
    warps = nV + nWs + K * conf2 + nwm                    # one warp per weight row
    kernel("mix_apply", K)(*_blocks(32 * warps), (
        np.int64(active), m._order, m._sel, m._cls, m._lb, m._has, m._g, m._gv, m._gm, m._gc,
        m.V, np.int64(nV), m.Ws, np.int64(nWs), m.Wc, np.int32(conf2), m.wm, np.int64(nwm),
        *(np.float64(r) for r in rates)))
    n = active * K
    e = np.uint64(m.epoch())
    kernel("mix_claim", K)(*_blocks(n), (m._rows, m._bad, np.int64(n), m.table, m.total, m._scr, e, np.int64(A)))
    kernel("mix_own", K)(*_blocks(n), (m._rows, m._chk, m._bad, np.int64(n), m.check, m._scr, e))
    kernel("mix_count", K)(*_blocks(n), (m._rows, m._chk, sym, np.int64(n), m.check, m.table, m.total, np.int64(A)))
    kernel("mix_halve", K)(*_blocks(n), (m._rows, m._chk, np.int64(n), m.check, m.table, m.total, m._scr,
                                         np.uint64(m.epoch()), np.int64(c["limit"]), np.int64(A)))
    e = np.uint64(m.epoch())
    kernel("mix_advance", K)(*_blocks(active), (
        sym, np.int64(active), np.int64(t), np.int64(m.row_len), m.hist, m.c0, m.wordish, m.word, m.prev_word,
        m._pred, m._has, m.mlen, m.mptr, m.mtab, m._slot, m._mscr, e, np.uint64(c["P"]),
        np.int32(c["match_min"]), np.uint64((1 << c["match_bits"]) - 1)))
    if t + 1 >= c["match_min"]:
        kernel("mix_put", K)(*_blocks(active), (m._slot, np.int64(active), np.int64(t), np.int64(m.row_len),
                                                m.mtab, m._mscr, e))
