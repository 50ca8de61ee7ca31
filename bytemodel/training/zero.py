"""ZeRO-1 (shard_optimizer): each MPI rank keeps the AdamW moments of its 1/N of the flat buffers.

The gradients are reduce-scattered instead of all-reduced, each rank updates its block of the
weights with the same AdamW arithmetic (training/optim.py) and the blocks are all-gathered.
Checkpoints still hold the full moments (gathered to rank 0), so the file format does not change
and a sharded run resumes unsharded, or on another rank count, and the other way round.

Shapes: flat buffers (P,) in the model's layout (model.layout), padded to (N * S,) with S the
shard length, a multiple of SHARD_ALIGN.
"""
from __future__ import annotations

import types

import numpy as np

from .optim import AdamW

SHARD_ALIGN = 64          # shard lengths are multiples of this (the fused AdamW kernel wants % 4)


class Shards:
    """The model's weights and gradients moved into buffers of N * S elements (the tail stays
    zero), so every rank owns an equal block [lo, hi) for reduce-scatter and all-gather."""

    def __init__(self, model, world):
        xp, n, P = model.xp, world.size, model.size
        self.world, self.size = world, P
        self.S = -(-P // (n * SHARD_ALIGN)) * SHARD_ALIGN
        self.lo, self.hi = world.rank * self.S, (world.rank + 1) * self.S
        self.ppad = xp.zeros(n * self.S, dtype=model.params.dtype)
        self.ppad[:P] = model.params
        self.gpad = xp.zeros(n * self.S, dtype=model.grads.dtype)
        model.use_buffers(self.ppad[:P], self.gpad[:P])
        self.gshard = xp.zeros(self.S, dtype=model.grads.dtype)   # this rank's block of the summed gradients

    def reduce_gradients(self) -> None:
        self.world.reduce_scatter(self.gpad, self.gshard, "the gradient reduce-scatter")

    def host_moments(self, opt):
        """(m, v) as full host arrays on rank 0, (None, None) elsewhere; every rank must call it."""
        m = self.world.gather_host(opt.ops.to_numpy(opt.m))
        v = self.world.gather_host(opt.ops.to_numpy(opt.v))
        return (m[:self.size], v[:self.size]) if self.world.main else (None, None)


class ShardedAdamW:
    """AdamW over this rank's block of the flat buffers: the same update as AdamW on those
    elements, then the blocks all-gathered so every rank has the whole new weights.
    state(), load_state(d, m, v) and step() as AdamW; m and v are this rank's block only."""

    def __init__(self, model, shards: Shards, **kw):
        sh = shards
        self.shards = sh
        mask = model.xp.zeros(sh.world.size * sh.S, dtype=model.params.dtype)
        mask[:model.size] = model.decay_mask().astype(model.params.dtype)
        part = types.SimpleNamespace(params=sh.ppad[sh.lo:sh.hi], grads=sh.gshard, ops=model.ops,
                                     xp=model.xp, decay_mask=lambda: mask[sh.lo:sh.hi])
        self.inner = AdamW(part, **kw)
        self.ops = model.ops

    @property
    def m(self):
        return self.inner.m

    @property
    def v(self):
        return self.inner.v

    @property
    def t(self):
        return self.inner.t

    def step(self, lr: float, grad_scale: float = 1.0, clip: float = 0.0, norm=None) -> None:
        self.inner.step(lr, grad_scale=grad_scale, clip=clip, norm=norm)
        self.shards.world.allgather(self.shards.ppad, "the weight all-gather")

    def state(self) -> dict:
        return self.inner.state()

    def load_state(self, d: dict, m, v) -> None:
        """m, v: the full moments (as a checkpoint holds them); this rank keeps its block."""
        sh = self.shards

        def block(a):
            full = np.zeros(sh.world.size * sh.S, dtype=np.float32)
            full[:a.shape[0]] = a
            return full[sh.lo:sh.hi]
        self.inner.load_state(d, block(m), block(v))
