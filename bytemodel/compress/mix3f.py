"""ctx3 on the device in a few fused kernels ("ctx3f", the mixer of new `--adapt` files on a GPU).

    mix = mixer("ctx3f", lengths, alphabet, fresh, xp)    # xp: cupy (numpy: ctx3d's arithmetic, the reference)
    z = mix.predict(t, active, net_logp)                   # (active, A) float64 on the device
    f = mix.frequencies(z)                                 # the coder's frequencies, made by predict
    mix.update(t, active, tokens)

Why: ctx3d (compress/mix3d.py) is ctx3 written once for an array module; on a GPU that is ~100
CuPy calls a step, which put the mixer at ~7 of ~10 ms a step at 1,024 streams on the H200 (its
host launching them, not the device computing: benchmarks/README.md, "ctx3d's integer work as
kernels"). Here a step is eight kernels (gpu/mix_step.cu through ops/cuda_mix.py): prepare and
predict (the inputs, the two sets' logits, the mix, its softmax and the coder's quantiser in two
launches), then the gradients, every weight row's step, and the counts, claims, halving and match
model's bookkeeping.

The arithmetic is ctx3's (compress/mix2.py's module doc), the same inputs, weights, rates and
integer state; only the order of the float sums differs: each sum over the alphabet is a fixed
tree in a block, each weight row's step the sum of its contributions (a fixed tree over them in
stream order) added once, where ctx3d adds them one by one in np.add.at's order and lets
einsum choose. So the integers (counts, checks, history, words, the match model) are ctx3d's
exactly and the floats within rounding (tests/test_mix3f_gpu.py), the same bits on every run of a
device kind; a file naming ctx3f decodes where it was made, as every GPU `--adapt` file does
(compress/adapt.check_gpu). With NumPy, ContextMix3F is ctx3d's (and so ctx3's) arithmetic: the
reference its kernels are held to. ctx3d files still decode with ctx3d.
"""
from __future__ import annotations

import numpy as np

from . import mix as ctx1
from . import mix3d
from .coder import TOTAL
from .mix import _P, MATCH_BITS, MATCH_MIN, MAX_LEN
from .mix2 import CONF_BUCKETS, CONTEXTS, LR, LR_CONF, LR_FINAL, SETS
from .mix3d import ContextMix3D

NAME = "ctx3f"


def mixer(name: str, lengths, alphabet: int, fresh: bool = False, xp=np):
    """The mixer the container names: "ctx3f" here, the others from compress/mix3d.mixer."""
    if name == NAME:
        return ContextMix3F(lengths, alphabet, fresh, xp)
    return mix3d.mixer(name, lengths, alphabet, fresh, xp)


def _kinds(K: int):
    """Each context's kind and argument for mix_prepare: 0 a one-token context (its distance), 1 a
    hashed token context (its column of the keys), 2 the word, 3 the word with the one before (its index)."""
    multi = [i for i, c in enumerate(CONTEXTS) if len(c) > 1]
    kind, arg = [], []
    for i in range(K):
        if i < len(CONTEXTS):
            one = len(CONTEXTS[i]) == 1
            kind.append(0 if one else 1)
            arg.append(CONTEXTS[i][0] if one else multi.index(i))
        else:
            kind.append(2 if i == len(CONTEXTS) else 3)
            arg.append(i)
    return np.array(kind, dtype=np.int32), np.array(arg, dtype=np.int32)


class ContextMix3F(ContextMix3D):
    """ctx3 in fused kernels on a CuPy device; ctx3d's NumPy arithmetic on NumPy (the module doc)."""

    NAME = NAME

    def __init__(self, lengths, alphabet: int, fresh: bool = False, xp=np):
        super().__init__(lengths, alphabet, fresh, xp)
        if xp is np:
            return
        from ..ops import cuda_mix
        self.ck = cuda_mix
        S, A, K, M = len(self.lengths), self.A, self.K, self.M
        kind, arg = _kinds(K)
        self.kind, self.arg = xp.asarray(kind), xp.asarray(arg)
        f64, i64 = np.float64, np.int64
        self._X, self._W = xp.empty((S, M, A), f64), xp.empty((S, SETS, M), f64)
        self._zs, self._z, self._p = xp.empty((S, SETS, A), f64), xp.empty((S, A), f64), xp.empty((S, A), f64)
        self._freqs = xp.empty((S, A), np.float32)
        self._rows, self._chk, self._bad = xp.empty((S, K), i64), xp.empty((S, K), np.uint16), xp.empty((S, K), bool)
        self._sel, self._order, self._cls = xp.empty((S, SETS), i64), xp.empty(S, i64), xp.empty((S, K), i64)
        self._pred, self._has, self._lb = xp.empty(S, i64), xp.empty(S, bool), xp.empty(S, i64)
        self._g, self._gv = xp.empty((S, SETS, M), f64), xp.empty((S, SETS), f64)
        self._gm, self._gc, self._slot = xp.empty(S, f64), xp.empty((S, K), f64), xp.empty(S, i64)
        self._scr = xp.zeros(len(self.total), np.uint64)      # the rows' claim / halving marks (by epoch)
        self._mscr = xp.zeros(1 << MATCH_BITS, np.uint64)     # the match table's
        self._epoch = 0
        self._t = None

    def epoch(self) -> int:
        """A fresh epoch for the kernels' winner slots (ops/cuda_mix.update takes three a step)."""
        self._epoch += 1
        return self._epoch

    def prepare(self, t: int, active: int) -> None:
        if self.xp is np:
            return super().prepare(t, active)
        back, hm = self._keys(t, active)
        self.ck.prepare(self, back, hm, _constants())
        self._ready = (t, active)

    def predict(self, t: int, active: int, net):
        xp = self.xp
        if xp is np:
            return super().predict(t, active, net)
        if self._ready != (t, active):
            self.prepare(t, active)
        net = xp.ascontiguousarray(net, dtype=np.float64)
        if net.shape != (active, self.A):
            raise ValueError(f"ctx3f: net must be ({active}, {self.A}), got {net.shape}")
        self.ck.predict(self, net, active, _constants())
        self._ready, self._t = None, (t, active)
        return self._z[:active]

    def frequencies(self, z):
        if self.xp is np:
            return super().frequencies(z)
        assert self._t is not None and self._t[1] == z.shape[0], "frequencies follow predict"
        return self._freqs[:z.shape[0]]

    def update(self, t: int, active: int, sym) -> None:
        xp = self.xp
        if xp is np:
            return super().update(t, active, sym)
        assert self._t == (t, active), "update follows the predict of the same step"
        f = self._rate(active)
        sym = xp.ascontiguousarray(xp.asarray(sym, dtype=np.int64))
        self.ck.update(self, t, active, sym, (LR_FINAL * f, LR * f, LR_CONF * f, 4 * LR * f), _constants())
        self._t = self._step = self._ready = None


def _constants() -> dict:
    """The format's constants the kernels take (LIMIT read at each call: a test may lower it)."""
    return dict(P=_P, alpha=ctx1.ALPHA, n_buckets=ctx1.N_BUCKETS, conf_buckets=CONF_BUCKETS, max_len=MAX_LEN,
                total=TOTAL, limit=mix3d.LIMIT, match_min=MATCH_MIN, match_bits=MATCH_BITS)
