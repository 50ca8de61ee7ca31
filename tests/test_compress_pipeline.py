"""The coder overlapped with the device (compress/pipeline.py), checked on the CPU.

The GPU's stepper (ops/cuda_decode.LockstepGraph) is stood in for by HostStepper: the same
contract (enqueue ids / result() a view of one of two host buffers, at most two steps in flight),
computed by decode/lockstep.py's sliding step and the quantiser the moment a step is queued (the
device at its fastest, so a buffer read after the step that reuses it is overwritten shows up as
other bytes). The pipelined files must be the launched path's bytes, each decoding the other's.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("constriction")

import bytemodel  # noqa: E402
from bytemodel.compress import driver, pipeline  # noqa: E402
from bytemodel.compress.coder import quantise  # noqa: E402
from bytemodel.decode.lockstep import Lockstep  # noqa: E402


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from bytemodel import checkpoint
    from bytemodel.config import ModelConfig
    from bytemodel.model import Model
    from bytemodel.ops import numpy_ops
    from bytemodel.tokenizer import Tokenizer
    cfg = ModelConfig(vocab_size=257, d_model=32, n_layers=2, n_heads=2, d_ff=64, context=32)
    m = Model(cfg, numpy_ops)
    m.init_weights(3)
    m.load_flat(m.ops.to_numpy(m.params) * 6)     # spread the logits: far from uniform frequencies
    d = tmp_path_factory.mktemp("pipe")
    checkpoint.save(d / checkpoint.CKPT_NAME, cfg, Tokenizer(), m.params)
    return bytemodel.load(d)


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    return bytes(rng.choice(list(b"ACGTTGCA\n"), n))


class HostStepper:
    """LockstepGraph's contract on the host (see the module docstring); log: shared event list."""

    def __init__(self, model, B, window, A, log, lane):
        self.lock, self.A, self.log, self.lane = Lockstep(model, B, window, slide=True), A, log, lane
        self.buf = [np.full((B, A), np.nan, dtype=np.float32) for _ in range(2)]
        self.queued = self.taken = 0
        self.closed = False

    def enqueue(self, ids):
        assert self.queued - self.taken < 2, "a third step queued"
        lg = self.lock.push(np.array(ids))
        self.buf[self.queued % 2][...] = quantise(lg, self.A)
        self.log.append(("enqueue", self.lane, self.queued))
        self.queued += 1

    def result(self):
        assert self.taken < self.queued
        self.log.append(("result", self.lane, self.taken))
        r = self.buf[self.taken % 2]
        self.taken += 1
        return r

    def close(self):
        self.closed = True


@pytest.fixture
def host_steppers(monkeypatch):
    """driver._device_steppers -> HostSteppers (BLAS held to one thread, as the launched path
    holds it); returns (log, made steppers)."""
    log, made = [], []
    limit = driver._blas_one_thread()
    if limit is not None:
        limit.__enter__()

    def steppers(model, bounds, window, steps, A):
        out = [HostStepper(model, b - a, window, A, log, i) for i, (a, b) in enumerate(bounds)]
        made.extend(out)
        return out
    monkeypatch.setattr(driver, "_device_steppers", steppers)
    yield log, made
    if limit is not None:
        limit.__exit__(None, None, None)


@pytest.mark.parametrize("lane", [5, 2])
def test_pipelined_files_are_the_launched_files(lm, host_steppers, monkeypatch, lane):
    """The same layout compressed through the launched step and through the pipeline: the same
    bytes; each decompresses the other's file (one lane, and three lanes of 2, 2, 1 streams)."""
    log, made = host_steppers
    data = _data(260, seed=1)
    opts = dict(engine="lockstep", reread=0, window=8, streams=5, lane=lane, coders=2)
    piped = lm.compress(data, **opts)
    assert made and all(s.closed for s in made)
    assert len(made) == (1 if lane == 5 else 3)
    assert lm.decompress(piped) == data
    monkeypatch.setattr(driver, "_device_steppers", lambda *a: None)     # the launched step
    launched = lm.compress(data, **opts)
    assert piped == launched
    assert lm.decompress(launched) == data


def test_compression_queues_a_step_ahead_and_decompression_does_not(lm, host_steppers):
    """Compression queues step t + 1 before taking step t's table (the device works while the
    coder codes step t), never more than two in flight; decompression takes step t before it
    queues step t + 1 (whose tokens it has just decoded)."""
    log, made = host_steppers
    data = _data(150, seed=2)
    blob = lm.compress(data, engine="lockstep", reread=0, window=8, streams=3)
    comp = list(log)
    log.clear()
    assert lm.decompress(blob) == data
    steps = made[0].queued
    assert steps == -(-len(data) // 3) and made[0].taken == steps
    pos = {e: i for i, e in enumerate(comp)}
    for t in range(steps - 1):
        assert pos[("enqueue", 0, t + 1)] < pos[("result", 0, t)]
        assert pos[("result", 0, t)] < pos.get(("enqueue", 0, t + 2), len(comp))
    pos = {e: i for i, e in enumerate(log)}
    for t in range(steps - 1):
        assert pos[("result", 0, t)] < pos[("enqueue", 0, t + 1)]


class _Fixed:
    """A stepper whose every table is uniform over A symbols."""

    def __init__(self, B, A):
        self.B, self.A, self.n = B, A, 0

    def enqueue(self, ids):
        self.n += 1

    def result(self):
        return np.full((self.B, self.A), 1.0, dtype=np.float32)


def test_tokens_other_than_the_queued_ones_are_an_error():
    lengths = np.array([3, 3, 2])
    st = _Fixed(3, 4)
    with pytest.raises(RuntimeError, match="not the ones queued ahead"):
        pipeline.run([st], [(0, 3)], lengths, lambda t, active, f, lp: np.zeros(active, dtype=np.int64), 4,
                     known=lambda t, active: np.ones(active, dtype=np.int64))
    seen = []
    pipeline.run([st], [(0, 3)], lengths, lambda t, active, f, lp: seen.append((t, active, f.shape)) or
                 np.ones(active, dtype=np.int64), 4, known=lambda t, active: np.ones(active, dtype=np.int64))
    assert seen == [(0, 3, (3, 4)), (1, 3, (3, 4)), (2, 2, (2, 4))]


def test_no_device_stepper_on_the_cpu(lm, monkeypatch):
    monkeypatch.setattr(driver, "GPU_GRAPH", True)
    assert driver._device_steppers(lm.model, [(0, 4)], 8, 10, 256) is None
