"""Deterministic GPU training: the same seed gives the same bits on the same GPU, and a run killed
(SIGKILL mid-run, and in the middle of a checkpoint save) and resumed ends bit-identical to one
that ran straight through, at fp16, bf16 and fp32. Skipped without CuPy and a GPU.

Bit-identity is checked with a SHA-256 of every tensor: the weights and both AdamW moments, per
parameter tensor. The kernels that sum (the embedding, RMSNorm and FlashAttention backward) are
also checked on their own, where a change of summation order shows at once: five calls on the
same inputs must give the same bytes, and FlashAttention's two CTA orders (heaviest or lightest
key block first) the same dQ. The model: 2 layers, d_model 128, 2 heads (head dim 64, the
presets' FlashAttention kernel), context 256, so 2 key blocks and 8 query tiles per head meet
in the ordered dQ reduction.
"""
from __future__ import annotations

import hashlib
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import cuda_backend, gpu_marks

cp = pytest.importorskip("cupy")
pytestmark = gpu_marks(cp)

import bytemodel  # noqa: E402
from bytemodel import checkpoint as ck  # noqa: E402
from bytemodel.model import layout  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEPS = 200
SETTINGS = dict(preset="tiny", context=256, batch_size=8, eval_every=40, eval_tokens=1024, warmup=20,
                dropout=0.2, dropout_attn=0.1,   # residual and attention masks drawn every step
                                                 # (the attention ones inside the wgmma kernels on Hopper)
                lr=3e-3, model={"d_model": 128, "n_layers": 2, "n_heads": 2, "d_ff": 384},
                plot=False, baseline=False, device="cuda")
PRECISIONS = ["fp16", "bf16", "fp32"]


def corpus(path: Path) -> Path:
    """64 kB of DNA made of repeated motifs: learnable, enough for context 256."""
    rng = np.random.default_rng(0)
    motifs = ["".join(rng.choice(list("ACGT"), 12)) for _ in range(16)]
    path.write_text("".join(motifs[i] for i in rng.integers(0, 16, 64 * 1024 // 12)))
    return path


def tensor_hashes(run) -> dict:
    """{"w:name" | "m:name" | "v:name": SHA-256 of that tensor's fp32 bytes} of a run's checkpoint."""
    ld = ck.load(run)
    out = {}
    for name, shape, off in layout(ld.cfg):
        n = math.prod(shape)
        for kind, flat in (("w", ld.params), ("m", ld.m), ("v", ld.v)):
            out[f"{kind}:{name}"] = hashlib.sha256(np.ascontiguousarray(flat[off:off + n]).tobytes()).hexdigest()
    return out


def differing(a: dict, b: dict) -> list:
    return sorted(k for k in a if a[k] != b.get(k))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """precision -> (run folder, tensor hashes) of a straight 200-step run, trained once per module."""
    root = tmp_path_factory.mktemp("det")
    src = corpus(root / "dna.txt")
    runs = {}

    def get(precision, tag="a", seed=0):
        key = (precision, tag)
        if key not in runs:
            r = bytemodel.train(src, root / f"{precision}-{tag}", steps=STEPS, precision=precision, seed=seed,
                                **{**SETTINGS, "model": dict(SETTINGS["model"])})
            assert r.step == STEPS
            runs[key] = (root / f"{precision}-{tag}", tensor_hashes(root / f"{precision}-{tag}"))
        return runs[key]
    get.src = src
    return get


@pytest.mark.parametrize("precision", PRECISIONS)
def test_two_runs_with_one_seed_give_the_same_bits(straight, precision):
    _, a = straight(precision, "a")
    _, b = straight(precision, "b")
    cfg = ck.load(straight(precision)[0]).cfg
    assert len(a) == 3 * len(layout(cfg))
    assert cfg.dropout > 0 and cfg.dropout_attn > 0    # the dropout masks repeat too
    assert not differing(a, b), differing(a, b)
    if precision == "fp16":   # the comparison can fail: another seed changes every tensor
        _, c = straight(precision, "seed1", seed=1)
        assert len(differing(a, c)) == len(a)


KILLER = r"""
import os, signal, stat, sys
mode, nth, out, src, precision = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
import json
settings = json.loads(sys.argv[6])
import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.model import Model
fsyncs = steps = 0
real_fsync, real_backward = os.fsync, Model.backward

def in_save():
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name == "save" and "checkpoint" in f.f_code.co_filename:
            return True
        f = f.f_back
    return False

def fsync(fd):                      # "torn": half the checkpoint reached the disk, then the power went
    global fsyncs
    if mode == "torn" and stat.S_ISREG(os.fstat(fd).st_mode) and in_save():
        fsyncs += 1
        if fsyncs == nth:
            os.truncate(os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size // 2)
            os.kill(os.getpid(), signal.SIGKILL)
    return real_fsync(fd)

def backward(self, *a, **k):        # "step": killed in the middle of a run, steps queued on the GPU
    global steps
    steps += 1
    if mode == "step" and steps == nth:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_backward(self, *a, **k)

os.fsync, Model.backward = fsync, backward
if os.path.exists(os.path.join(out, ck.CKPT_NAME)):   # a resume takes the device and precision it is given
    bytemodel.train(None, out, resume=True, device="cuda", precision=precision)
else:
    bytemodel.train(src, out, precision=precision, **settings)
print("finished")
"""


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@pytest.mark.parametrize("precision", PRECISIONS)
def test_killed_and_resumed_run_ends_with_the_same_bits(straight, tmp_path, precision):
    _, want = straight(precision)
    run = tmp_path / "killed"
    settings = {**SETTINGS, "steps": STEPS}
    import json
    # killed at the 70th step (the checkpoint of step 40 is the last one), then during the second
    # checkpoint write of the resumed process (a torn temp file: the one before stays whole)
    for mode, nth in [("step", 70), ("torn", 2)]:
        p = subprocess.run([sys.executable, "-c", KILLER, mode, str(nth), str(run), str(straight.src), precision,
                            json.dumps(settings)], capture_output=True, text=True, timeout=300, env=_env())
        assert p.returncode == -signal.SIGKILL, (mode, p.returncode, p.stdout, p.stderr[-2000:])
        assert 0 < ck.load(run).train["step"] < STEPS
    p = subprocess.run([sys.executable, "-c", KILLER, "none", "0", str(run), str(straight.src), precision,
                        json.dumps(settings)], capture_output=True, text=True, timeout=300, env=_env())
    assert p.returncode == 0 and "finished" in p.stdout, p.stderr[-2000:]
    assert ck.load(run).train["step"] == STEPS
    got = tensor_hashes(run)
    assert not differing(got, want), differing(got, want)


# ------------------------------------------------------------------------------------------------
# the summing kernels one by one

def _same_every_time(fn, times=5):
    """fn() -> tuple of device arrays; True when every call gives the same bytes."""
    first = [cp.asnumpy(a).tobytes() for a in fn()]
    return all([cp.asnumpy(a).tobytes() for a in fn()] == first for _ in range(times - 1))


@pytest.fixture(scope="module", params=PRECISIONS)
def ops(request):
    return cuda_backend(request.param)


@pytest.mark.parametrize("V,C", [(256, 128), (9000, 36)])   # rows kernel, sorted kernel
def test_embedding_backward_repeats(ops, V, C):
    rng = cp.random.default_rng(0)
    idx = rng.integers(0, 40, (16, 512)).astype(cp.int32)      # 8192 rows on 40 ids: long sums
    dout = rng.standard_normal((16, 512, C), dtype=cp.float32).astype(ops.act_dtype)
    _, cache = ops.embedding_forward(cp.zeros((V, C), dtype=ops.act_dtype), idx)

    def run():
        dw = cp.zeros((V, C), dtype=cp.float32)
        ops.embedding_backward(dout, cache, dw)
        return (dw,)
    assert _same_every_time(run)


@pytest.mark.parametrize("C", [768, 100])                    # register kernel, any-width kernel
def test_rmsnorm_backward_repeats(ops, C):
    rng = cp.random.default_rng(1)
    x = rng.standard_normal((8192, C), dtype=cp.float32).astype(ops.act_dtype)
    g = rng.standard_normal((C,), dtype=cp.float32).astype(ops.act_dtype)
    d = rng.standard_normal((8192, C), dtype=cp.float32).astype(ops.act_dtype)
    _, cache = ops.rmsnorm_forward(x, g, 1e-5)

    def run():
        dg = cp.zeros((C,), dtype=cp.float32)
        return ops.rmsnorm_backward(d, cache, dg), dg
    assert _same_every_time(run)


@pytest.mark.parametrize("D,K", [(32, 8), (64, 8), (64, 4), (128, 8)])   # K < 8 kv heads: grouped-query
def test_flash_backward_repeats_in_either_cta_order(ops, D, K):
    if not ops.flash:
        pytest.skip("fp32 attention is cuBLAS + softmax")
    rng = cp.random.default_rng(2)
    # 16 x 8 heads of 1024 (8 key blocks each): enough CTAs at once that unordered adds do change
    # order (at 2 x 4 heads the kernel before the ordered reduction happened to repeat)
    q, do = (rng.standard_normal((16, 8, 1024, D), dtype=cp.float32).astype(ops.act_dtype) for _ in range(2))
    k, v = (rng.standard_normal((16, K, 1024, D), dtype=cp.float32).astype(ops.act_dtype) for _ in range(2))
    out, lse = ops.attention_forward(q, k, v)
    run = lambda: ops.attention_backward(do, q, k, v, out, lse)   # noqa: E731
    assert _same_every_time(run)
    first = [cp.asnumpy(a).tobytes() for a in run()]
    sm = ops.sm_count
    try:
        ops.sm_count = 1            # 8 key blocks > 1 SM: the lightest-first order
        assert [cp.asnumpy(a).tobytes() for a in run()] == first
    finally:
        ops.sm_count = sm


def test_model_gradients_repeat(ops):
    """One forward and backward of a whole model (MTP heads, a tied head, grouped-query attention)
    three times on the same weights and batch: the same gradient bytes."""
    from bytemodel.config import ModelConfig
    from bytemodel.model import Model
    cfg = ModelConfig(d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=512, context=256, mtp=2,
                      tie_embeddings=True)
    m = Model(cfg, ops)
    m.init_weights(0)
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (8, 256))
    y = rng.integers(0, 256, (8, 256))

    def run():
        m.grads[...] = 0
        m.loss_and_grad(ops.asarray(x), ops.asarray(y), 1.0 / x.size)
        return (m.grads,)
    assert _same_every_time(run, times=3)
