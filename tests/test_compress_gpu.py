"""The compressor's captured step on the GPU (ops/cuda_decode.LockstepGraph) against the launched one.

The compressor's files must not depend on how its steps are launched: the sliding lockstep step
captured as a CUDA graph with the quantiser in it, the same launches made eagerly, and
decode/lockstep.py's Lockstep (Model.forward_cached from Python, the path files were made with
before the graph) give the same logit bits at every step, through the ring (steps past the
window) and past the model's context (RoPE rows of their own). So the files are the same bytes,
and each decodes the other's. Exact equality throughout: any other tolerance would be a file
that does not decode. Skipped without CuPy or a GPU.
"""
from __future__ import annotations

import numpy as np
import pytest

from bytemodel.ops import cuda_available

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason="needs CuPy and a GPU")]

from bytemodel.config import ModelConfig, preset  # noqa: E402
from bytemodel.model import Model  # noqa: E402

CONFIGS = [
    dict(vocab_size=257, d_model=64, n_layers=2, n_heads=4, d_ff=96, context=24),                  # D 16
    dict(vocab_size=300, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=136, context=24),  # GQA, D 32
    dict(vocab_size=257, d_model=128, n_layers=3, n_heads=2, d_ff=256, context=24, tie_embeddings=True),  # D 64
]


def _gpu_model(cfg, precision, seed=0, scale=4.0):
    from bytemodel.ops import get_backend, numpy_ops
    ref = Model(cfg, numpy_ops)
    ref.init_weights(seed)
    gpu = Model(cfg, get_backend("cuda", precision))
    gpu.load_flat(ref.ops.to_numpy(ref.params).astype(np.float32) * scale)   # logits spread out
    return gpu


def _three_ways(model, B, window, steps, post, cols, seed):
    """Every step's table by Lockstep (launched), LockstepGraph eager and captured, random ids fed
    (the same to all three; the captured one kept two steps in flight)."""
    import cupy as cp
    from bytemodel.decode.lockstep import Lockstep
    from bytemodel.ops.cuda_decode import LockstepGraph
    rng = np.random.default_rng(seed)
    feeds = rng.integers(0, model.cfg.vocab_size - 1, (steps, B))
    W = model.weights()
    lock = Lockstep(model, B, window, W, slide=True)
    launched = np.stack([cp.asnumpy(post(lock.push(f))) for f in feeds])
    eager = LockstepGraph(model, B, window, steps, post, cols, W, graph=False)
    got_eager = []
    for f in feeds:
        eager.enqueue(f)
        got_eager.append(eager.result().copy())
    eager.close()
    cap = LockstepGraph(model, B, window, steps, post, cols, W, graph=True)
    got_cap = []
    cap.enqueue(feeds[0])
    for t in range(steps):
        if t + 1 < steps:
            cap.enqueue(feeds[t + 1])
        got_cap.append(cap.result().copy())
    assert cap.captured and cap.graph is not None, cap.capture_error
    cap.close()
    return launched, np.stack(got_eager), np.stack(got_cap)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("ci", range(len(CONFIGS)))
def test_captured_step_gives_the_launched_logits(ci, precision):
    """Logits (as float32) of every step, window 8 and 40 steps: the ring from step 8 on, RoPE past
    the context (24) from step 24 on; 37 streams."""
    import cupy as cp
    cfg = ModelConfig(**CONFIGS[ci])
    model = _gpu_model(cfg, precision, seed=ci)
    V = cfg.vocab_size
    launched, eager, cap = _three_ways(model, 37, 8, 40, lambda lg: lg[:, :V].astype(cp.float32), V, ci)
    assert np.isfinite(launched).all() and np.abs(launched).max() > 0
    assert np.array_equal(eager, launched)
    assert np.array_equal(cap, launched)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_captured_quantiser_gives_the_launched_frequencies_at_base(precision):
    """The base preset's shapes (the cuBLAS products at 1024 rows), the compressor's own quantiser
    in the graph: every step's integer frequencies equal, each row summing to 2^24."""
    from bytemodel.compress.coder import TOTAL, quantise
    import cupy as cp
    cfg = preset("base")
    model = _gpu_model(cfg, precision, seed=5, scale=1.0)
    A = 256
    launched, eager, cap = _three_ways(model, 1024, 16, 24, lambda lg: quantise(lg, A, cp).astype(cp.float32), A, 7)
    assert (launched.astype(np.float64).sum(axis=-1) == TOTAL).all()
    assert np.array_equal(eager, launched)
    assert np.array_equal(cap, launched)


def test_graph_files_are_the_launched_files(tmp_path, monkeypatch):
    """bytemodel compress on the GPU with the captured step (driver.GPU_GRAPH) and without: the
    same bytes, each decompressing the other's (and through the ring: 8-token window, 60-token streams)."""
    pytest.importorskip("constriction")
    import bytemodel
    from bytemodel import checkpoint
    from bytemodel.compress import driver
    from bytemodel.ops import numpy_ops
    from bytemodel.tokenizer import Tokenizer
    cfg = ModelConfig(**dict(CONFIGS[0], context=32))
    m = Model(cfg, numpy_ops)
    m.init_weights(1)
    m.load_flat(m.ops.to_numpy(m.params) * 4)
    checkpoint.save(tmp_path / checkpoint.CKPT_NAME, cfg, Tokenizer(), m.params)
    data = bytes(np.random.default_rng(0).choice(list(b"ACGT\n"), 600))
    made, orig = [], driver._device_steppers
    monkeypatch.setattr(driver, "_device_steppers", lambda *a: made.append(orig(*a)) or made[-1])
    for precision in ("fp16", "bf16"):
        lm = bytemodel.load(tmp_path, device="cuda", precision=precision)
        opts = dict(window=8, streams=10)
        monkeypatch.setattr(driver, "GPU_GRAPH", False)
        launched = lm.compress(data, **opts)
        monkeypatch.setattr(driver, "GPU_GRAPH", True)
        made.clear()
        graph = lm.compress(data, **opts)
        assert made and made[-1] is not None        # the graph path ran
        assert graph == launched
        assert lm.decompress(launched) == data       # by the graph
        monkeypatch.setattr(driver, "GPU_GRAPH", False)
        assert lm.decompress(graph) == data          # by the launched step
