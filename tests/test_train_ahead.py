"""The training loop's "run a step ahead" mode (used with the GPU backend), exercised on the CPU.

AheadOps is numpy_ops plus the three hooks the CUDA backend offers (global_norm as a 0-d array,
a fused adamw_step that clips and skips on its own, fetch_async), written with the same
arithmetic as the plain path. The loop then queues step s before reading step s-1, and must end
with exactly the weights of the plain loop: same batches, same clipping, saves taken at settled
steps.
"""
import math
import types

import numpy as np

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.ops import numpy_ops


def ahead_ops():
    ops = types.SimpleNamespace(**{k: getattr(numpy_ops, k) for k in dir(numpy_ops) if not k.startswith("__")})
    ops.name = "numpy-ahead"
    fetched = []

    def global_norm(grads):
        g = grads.astype(np.float64)
        return np.array(np.sqrt(np.dot(g, g)))

    def adamw_step(params, grads, m, v, decay_mask, lr, beta1, beta2, eps, weight_decay, step,
                   grad_scale=1.0, clip=0.0, norm=None):
        n = float(norm) * grad_scale
        if not math.isfinite(n):
            return                                          # skipped "on the device"
        factor = min(1.0, clip / (n + 1e-6)) if clip > 0 else 1.0
        g = grads * params.dtype.type(grad_scale * factor)
        m *= beta1
        m += (1 - beta1) * g
        v *= beta2
        v += (1 - beta2) * (g * g)
        upd = (m / (1 - beta1 ** step)) / (np.sqrt(v / (1 - beta2 ** step)) + eps)
        upd += weight_decay * decay_mask * params
        params -= params.dtype.type(lr) * upd

    def fetch_async(*arrays):
        fetched.append(len(arrays))
        vals = tuple(float(a) for a in arrays)
        return lambda: vals

    ops.global_norm, ops.adamw_step, ops.fetch_async = global_norm, adamw_step, fetch_async
    return ops, fetched


def test_ahead_loop_matches_the_plain_loop(tmp_path, dna_file, fast_settings, monkeypatch):
    settings = {**fast_settings, "workers": 1, "eval_every": 4}
    plain = bytemodel.train(dna_file, tmp_path / "plain", steps=10, **settings)
    ops, fetched = ahead_ops()
    monkeypatch.setattr("bytemodel.training.get_backend", lambda device, precision: ops)
    ahead = bytemodel.train(dna_file, tmp_path / "ahead", steps=10, **settings)
    assert len(fetched) == 10                               # the ahead path really ran
    a, b = ck.load(plain.checkpoint), ck.load(ahead.checkpoint)
    assert np.array_equal(a.params, b.params) and np.array_equal(a.m, b.m)
    assert [h["step"] for h in ahead.history] == list(range(1, 11))        # every step recorded, in order
    assert [h["loss"] for h in ahead.history] == [h["loss"] for h in plain.history]
    assert ahead.val_bpb == plain.val_bpb
    # a stop between validations settles the queued step first and saves exactly that state
    stopped = bytemodel.train(dna_file, tmp_path / "stopped", steps=10, stop_at=6, **settings)
    assert stopped.step == 6 and ck.load(stopped.checkpoint).train["step"] == 6
    resumed = bytemodel.train(None, tmp_path / "stopped", resume=True)
    assert np.array_equal(ck.load(resumed.checkpoint).params, b.params)
