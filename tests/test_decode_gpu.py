"""The GPU decoder (gpu/decode.cu, ops/cuda_decode.py) against the NumPy reference.

Skipped without CuPy or a GPU. Tolerances: fp32 decode vs the float64 NumPy model is limited by
float32 summation order over <= 2k terms (1e-4 relative to the logits' scale, far above the ~1e-6
seen, far below a wrong index or a missed key); fp16 weights and cache vs float64: 2e-2 (fp16
rounding of weights and cache, ~3 significant digits, through 1-3 layers, growing with the
cache: up to 2.8e-2 seen at 230 cached keys; 6e-2 bounds it and still catches a wrong key or head).
The tensor-core products (mma) round their input to fp16 as the cuBLAS step does, and land where it
does: on config 2 (weights x4) the cuBLAS step is 0.088 of the logits' scale from float64, the mma
path 0.060-0.109 (B 1, 16, 64; H200, 2026-12-02): 0.15 bounds it there; a wrong fragment, operand
or row gives noise at the logits' own scale (>= 0.5).
"""
import numpy as np
import pytest

from bytemodel.ops import cuda_available

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason="needs CuPy and a GPU")]

from bytemodel.config import ModelConfig  # noqa: E402
from bytemodel.decode.generate import generate, sample_next  # noqa: E402
from bytemodel.model import Model  # noqa: E402
from bytemodel.ops import numpy_ops  # noqa: E402
from bytemodel.tokenizer import Tokenizer  # noqa: E402


def models(cfg, precision, seed=0):
    from bytemodel.ops import get_backend
    ref = Model(cfg, numpy_ops, dtype=np.float64)
    ref.init_weights(seed)
    # larger weights than the init so the logits spread (ties would make greedy ambiguous)
    host = ref.ops.to_numpy(ref.params).astype(np.float32) * 4
    ref.load_flat(host)
    gpu = Model(cfg, get_backend("cuda", precision))
    gpu.load_flat(host)
    return ref, gpu


MMA_FP16_TOL = 0.15     # the tensor-core path at fp16 against float64 (see the docstring)

CONFIGS = [
    dict(vocab_size=257, d_model=64, n_layers=2, n_heads=4, d_ff=96, context=200),                 # D 16
    dict(vocab_size=300, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=136, context=300),  # GQA, D 32
    dict(vocab_size=257, d_model=128, n_layers=3, n_heads=2, d_ff=256, context=160, tie_embeddings=True),  # D 64
    dict(vocab_size=261, d_model=256, n_layers=1, n_heads=2, d_ff=64, context=100),                # D 128
]


@pytest.mark.parametrize("mma", [False, True])
@pytest.mark.parametrize("precision,tol", [("fp32", 1e-4), ("fp16", 6e-2)])
@pytest.mark.parametrize("ci", range(len(CONFIGS)))
@pytest.mark.parametrize("B", [1, 3, 16, 37, 64])
def test_decode_steps_match_numpy(ci, B, precision, tol, mma):
    """Prefill a prompt, then steps through the kernels (greedy ids fed back): every step's logits
    against the NumPy cached forward fed the same ids, past several attention splits. mma: the
    tensor-core products (fp16 and bf16 only; their input rounded to fp16 as the cuBLAS step's
    is, inside the same bound)."""
    import cupy as cp
    from bytemodel.ops.cuda_decode import Decoder, mma_supports
    cfg = ModelConfig(**CONFIGS[ci])
    if mma and mma_supports(cfg, precision):
        pytest.skip(mma_supports(cfg, precision))
    ref, gpu = models(cfg, precision, seed=ci)
    rng = np.random.default_rng(ci + 10 * B)
    P = 5
    prompt = rng.integers(0, cfg.vocab_size, (B, P))
    d = Decoder(gpu, B, cfg.vocab_size, seed=0, temperature=0.0, top_k=0, top_p=1.0, graph=True, mma=mma)
    assert d.mma == mma
    W = gpu.weights()
    lg = d.run_prefill(lambda: gpu.forward_cached(cp.asarray(prompt), d.cache, 0, W))
    d.begin(lg[:, -1, :], P, W)
    rcache = ref.new_cache(B, cfg.context)
    want = ref.forward_cached(prompt, rcache, 0)[:, -1]
    steps = cfg.context - P          # to the end of the cache: every split of the attention used
    worst = 0.0
    for s in range(steps):
        d.step(1)
        ids = d.tokens(s, s + 1)[:, 0]
        got = cp.asnumpy(d.logits)
        want = ref.forward_cached(ids[:, None].astype(np.int64), rcache, P + s)[:, -1]
        err = np.abs(got - want).max() / np.abs(want).max()
        worst = max(worst, err)
        assert np.isfinite(got).all()
        assert err < (MMA_FP16_TOL if mma else tol), (s, err)
    assert int(cp.asnumpy(d.state)[0]) == cfg.context


@pytest.mark.parametrize("fused", ["none", "views", "views+add_norm"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("ci", [1, 2])
def test_blas_graph_steps_equal_the_launched_steps(ci, precision, fused, monkeypatch):
    """The path `generate --samples N` takes above GRAPH_MAX_BATCH at fp16/bf16: the cuBLAS step
    reading its position on the device, launched every step ("eager") or captured once as a graph
    and replayed, gives the same logit bytes as the backend's cached forward launched from Python
    (Model.forward_cached: the same ops in the same order), every step to the end of the cache,
    greedy ids fed back. (Against the float64 NumPy forward all three are equally far: on the H200,
    config 2 with the weights x4, 0.088 of the logits' scale at fp16 and 0.34 at bf16.)"""
    import cupy as cp
    from bytemodel.ops import cuda_decode
    cfg = ModelConfig(**CONFIGS[ci])
    _, gpu = models(cfg, precision, seed=ci)
    B, P = 6, 5
    assert B > cuda_decode.GRAPH_MAX_BATCH
    # fused: k, v, q read where the projection left them (STEP_VIEWS), each add with its RMSNorm (STEP_ADD_NORM)
    monkeypatch.setattr(cuda_decode, "STEP_VIEWS", fused != "none")
    monkeypatch.setattr(cuda_decode, "STEP_ADD_NORM", fused == "views+add_norm")
    prompt = cp.asarray(np.random.default_rng(ci).integers(0, cfg.vocab_size, (B, P)))
    W = gpu.weights()
    runs = {}
    for mode in ("launched", "eager", "captured"):
        monkeypatch.setattr(cuda_decode, "BLAS_GRAPH", mode != "launched")
        d = cuda_decode.Decoder(gpu, B, cfg.vocab_size, seed=0, temperature=0.0, top_k=0, top_p=1.0,
                                graph=False)
        assert d.blas_graph == (mode != "launched") and not d.use_graph
        lg = d.run_prefill(lambda: gpu.forward_cached(prompt, d.cache, 0, W))
        d.begin(lg[:, -1, :], P, W)
        logits = []
        for s in range(cfg.context - P):
            if mode == "eager":
                d._eager_done = False
            d.step(1)
            d.stream.synchronize()           # the logits are written on the decoder's stream
            logits.append(cp.asnumpy(d.logits))
        assert (1 in d._graphs) == (mode == "captured")
        assert int(cp.asnumpy(d.state)[0]) == cfg.context
        runs[mode] = (np.stack(logits), d.tokens(0, cfg.context - P))
    for mode in ("eager", "captured"):
        assert np.array_equal(runs[mode][0], runs["launched"][0]), mode
        assert np.array_equal(runs[mode][1], runs["launched"][1]), mode


SAMPLING = [dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(temperature=1.3, top_p=0.9),
            dict(temperature=1.0, top_k=40, top_p=0.5), dict(temperature=0.0)]


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("V", [257, 300, 4096])
@pytest.mark.parametrize("kw", SAMPLING)
def test_sampler_matches_host_sampler(V, kw, masked):
    """Same logits, same seeds: the device sampler picks the ids sample_next picks with
    np.random.default_rng(seed + i), step after step (each stream advanced once per draw).
    masked: generation's byte mask (a third of the ids allowed, fewer than top_k = 40 at V = 257
    in places), which the host applies as -inf logits and the device sampler by itself; the
    likeliest id of every row left out, so a sampler that ignored the mask would pick it greedily."""
    import cupy as cp
    from bytemodel.ops.cuda_decode import Sampler
    from bytemodel.ops import get_backend
    B, steps, seed = 24, 3, 11
    r = np.random.default_rng(V)
    allowed = r.random(V) < (1 / 3 if V > 257 else 0.1) if masked else None
    s = Sampler(get_backend("cuda", "fp32"), V, B, seed, steps, allowed)
    rngs = [np.random.default_rng(seed + i) for i in range(B)]
    bias = np.where(allowed, 0.0, -np.inf) if masked else 0.0
    state = cp.zeros((4,), dtype=cp.int32)
    for t in range(steps):
        logits = (r.standard_normal((B, V)) * 3).astype(np.float32)
        logits[0, :7] = logits[0, 7]                    # ties: the lower id first, as argsort's stable order
        if masked:
            logits[np.arange(B), r.integers(0, V, B)] = 50.0   # a left-out id would win every draw
            logits[:, ~allowed] += 20.0
        s(cp.asarray(logits), state, kw.get("temperature", 1.0), kw.get("top_k", 0), kw.get("top_p", 1.0))
        state[1] += 1
        got = cp.asnumpy(s.out[:, t])
        want = [sample_next(logits[i].astype(np.float64) + bias, rngs[i], **kw) for i in range(B)]
        assert got.tolist() == want
        if masked:
            assert allowed[got].all()


@pytest.fixture(scope="module")
def pair():
    cfg = ModelConfig(vocab_size=257, d_model=128, n_layers=2, n_heads=2, d_ff=192, context=96)
    ref, gpu32 = models(cfg, "fp32", seed=5)
    from bytemodel.ops import get_backend, numpy_ops
    cpu = Model(cfg, numpy_ops)
    cpu.load_flat(ref.ops.to_numpy(ref.params).astype(np.float32))
    gpu16 = Model(cfg, get_backend("cuda", "fp16"))
    gpu16.load_flat(ref.ops.to_numpy(ref.params).astype(np.float32))
    return cfg, cpu, gpu32, gpu16


def test_cpu_and_gpu_fp32_give_the_same_bytes(pair):
    """What is identical across devices: in fp32 the GPU decoder gives the CPU's bytes, greedy and
    sampled (same seed semantics), one sample and several, past the context (restarts)."""
    cfg, cpu, gpu32, _ = pair
    tok = Tokenizer()
    n = 2 * cfg.context + 9
    for kw in (dict(temperature=0), dict(seed=3), dict(seed=4, top_k=8, top_p=0.9, temperature=0.8)):
        assert generate(gpu32, tok, n, b"AC", **kw) == generate(cpu, tok, n, b"AC", **kw), kw
    assert generate(gpu32, tok, 150, b"AC", seed=2, samples=3) == generate(cpu, tok, 150, b"AC", seed=2, samples=3)


def test_byte_mask_samples_on_the_device(pair, monkeypatch):
    """Generation's byte mask (the run's byte set: the CLI's default) runs on the on-device decoder,
    not the host loop: in fp32 it gives the CPU's bytes (the host applies the mask as -inf logits,
    the device's sampler by itself), only allowed bytes come out, one sample and several, and in
    fp16 the same seed gives the same bytes. The host paths are made to fail on the GPU model, so
    falling back to them fails the test."""
    from bytemodel.decode import generate as gen_mod
    cfg, cpu, gpu32, gpu16 = pair
    tok = Tokenizer()
    allowed = np.zeros(tok.vocab_size, dtype=bool)
    allowed[list(b"ACGT\n")] = True
    allowed[tok.doc_id] = True
    n = 2 * cfg.context + 9
    want = {}
    for kw in (dict(temperature=0), dict(seed=3), dict(seed=4, top_k=8, top_p=0.9, temperature=0.8)):
        want[str(kw)] = generate(cpu, tok, n, b"AC", allowed=allowed, **kw)
    want_n = generate(cpu, tok, 150, b"AC", seed=2, samples=3, allowed=allowed)

    def no_host(*a, **k):
        raise AssertionError("the byte mask sent generation to the host loop")
    monkeypatch.setattr(gen_mod, "plain_ids", no_host)
    monkeypatch.setattr(gen_mod, "_generate_host", no_host)
    for kw in (dict(temperature=0), dict(seed=3), dict(seed=4, top_k=8, top_p=0.9, temperature=0.8)):
        got = generate(gpu32, tok, n, b"AC", allowed=allowed, **kw)
        assert got == want[str(kw)], kw
        assert set(got) <= set(b"ACGT\n"), kw
    assert generate(gpu32, tok, 150, b"AC", seed=2, samples=3, allowed=allowed) == want_n
    a = generate(gpu16, tok, 300, b"AC", seed=5, samples=2, allowed=allowed)
    assert a == generate(gpu16, tok, 300, b"AC", seed=5, samples=2, allowed=allowed)
    assert all(set(x) <= set(b"ACGT\n") for x in a)


def test_fp16_same_seed_same_bytes_and_paths(pair, monkeypatch):
    """fp16: same seed and batch size, same bytes. The cuBLAS path (batches above
    GRAPH_MAX_BATCH: the backend's fp16 forward, device sampling) gives the host loop's greedy
    bytes exactly; the graph path keeps the residual stream in fp32, so its fp16 bytes may part
    from those at a near-tie (not asserted: printed)."""
    from bytemodel.ops import cuda_decode
    cfg, cpu, _, gpu16 = pair
    tok = Tokenizer()
    a = generate(gpu16, tok, 200, b"x", seed=1, samples=4)
    assert a == generate(gpu16, tok, 200, b"x", seed=1, samples=4)
    assert len(set(a)) == 4
    host = generate(gpu16, tok, 120, b"x", temperature=0, engine="host")
    graph = generate(gpu16, tok, 120, b"x", temperature=0)
    same = next((i for i, (p, q) in enumerate(zip(host, graph)) if p != q), len(host))
    print(f"fp16 greedy: graph path equals the host loop for {same} of {len(host)} bytes")
    monkeypatch.setattr(cuda_decode, "GRAPH_MAX_BATCH", 0)
    assert generate(gpu16, tok, 120, b"x", temperature=0, samples=2) == [host, host]


def test_cublas_step_as_a_graph_matches_the_launched_step(pair, monkeypatch):
    """Above GRAPH_MAX_BATCH the cuBLAS step is captured once as a graph (gpu/step.cu reads the cache
    position on the device; the products go through the decoder's own cuBLAS handle): greedy steps
    give the logits of the same ops launched from Python every step within fp16 rounding (2e-2 of
    the logits' scale, as the decode tests above: the two handles may pick different cuBLAS
    algorithms), and the same ids; whole generations repeat, and greedy ones equal the host loop's
    bytes past the context (restarts re-prefill the cache under the live graph)."""
    import cupy as cp
    from bytemodel.ops import cuda_decode
    cfg, _, _, gpu16 = pair
    tok = Tokenizer()
    monkeypatch.setattr(cuda_decode, "GRAPH_MAX_BATCH", 1)
    prompt = cp.asarray(np.array([[256, 65, 67], [256, 70, 71], [256, 1, 2]]))
    W = gpu16.weights()
    runs = []
    for captured in (True, False):
        monkeypatch.setattr(cuda_decode, "BLAS_GRAPH", captured)
        d = cuda_decode.Decoder(gpu16, 3, 257, 5, 0.0, 0, 1.0, graph=False)
        assert d.blas_graph == captured and not d.use_graph
        lg = d.run_prefill(lambda: gpu16.forward_cached(prompt, d.cache, 0, W))
        d.begin(lg[:, -1, :], 3, W)
        logits = []
        for _ in range(8):
            d.step(1)
            d.stream.synchronize()      # the logits are written on the decoder's stream, not the null one
            logits.append(cp.asnumpy(d.logits))
        runs.append((np.stack(logits), d.tokens(0, 8)))
        assert captured is (1 in d._graphs)
    (a, ta), (b, tb) = runs
    assert np.abs(a - b).max() <= 2e-2 * np.abs(b).max(), np.abs(a - b).max()
    assert np.array_equal(ta, tb)
    monkeypatch.setattr(cuda_decode, "BLAS_GRAPH", True)
    n = 2 * cfg.context + 9
    graph = generate(gpu16, tok, n, b"AC", seed=7, samples=3)
    assert generate(gpu16, tok, n, b"AC", seed=7, samples=3) == graph and len(set(graph)) == 3
    assert generate(gpu16, tok, 120, b"AC", samples=3, temperature=0) == \
        [generate(gpu16, tok, 120, b"AC", temperature=0, engine="host")] * 3


def test_one_document_stops_on_gpu(pair):
    cfg, cpu, gpu32, _ = pair
    tok = Tokenizer()
    out = generate(gpu32, tok, 500, b"", seed=9, stop_at_doc_end=True, samples=3)
    assert out == generate(cpu, tok, 500, b"", seed=9, stop_at_doc_end=True, samples=3)


def test_several_steps_per_graph(pair, monkeypatch):
    """Graphs of several captured steps (GRAPH_STEPS) give the same bytes as one step per graph."""
    from bytemodel.ops import cuda_decode
    cfg, cpu, gpu32, _ = pair
    tok = Tokenizer()
    one = generate(gpu32, tok, 150, b"AC", seed=6, samples=2)
    monkeypatch.setattr(cuda_decode, "GRAPH_STEPS", 4)
    assert generate(gpu32, tok, 150, b"AC", seed=6, samples=2) == one


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("B", [1, 3])
def test_pdl_launches_give_the_same_logits_and_ids(B, precision, monkeypatch):
    """The kernel path launched with programmatic dependent launch (ops/cuda_launch.py; compute
    capability 9.0+) against the same kernels launched the ordinary way: every step's logits and
    sampled ids bit for bit, to the end of the cache (the same arithmetic; a missing wait would
    read a buffer before the kernel before has written it). On a 9.0+ GPU PDL must be the one
    that ran."""
    from bytemodel.ops import gpu_capability
    (a, ta), (b, tb) = _kernel_path_on_and_off(CONFIGS[2], precision, B, "PDL", monkeypatch,
                                               lambda d, on: (d.pdl is not None) == (on and gpu_capability() >= (9, 0)))
    assert np.array_equal(a, b) and np.array_equal(ta, tb)


def _kernel_path_on_and_off(config, precision, B, flag, monkeypatch, ran):
    """The kernel path's steps (graph decoder, a 4-token prompt, sampled ids fed back, to the end of
    the cache) with cuda_decode.<flag> on, then off: [(logits every step, ids)] for each; ran(d, on)
    must hold for each decoder (the path asked for is the one built)."""
    import cupy as cp
    from bytemodel.ops import cuda_decode
    cfg = ModelConfig(**config)
    _, gpu = models(cfg, precision, seed=2)
    prompt = cp.asarray(np.random.default_rng(B).integers(0, cfg.vocab_size, (B, 4)))
    W = gpu.weights()
    runs = []
    for on in (True, False):
        monkeypatch.setattr(cuda_decode, flag, on)
        d = cuda_decode.Decoder(gpu, B, cfg.vocab_size, seed=3, temperature=0.9, top_k=0, top_p=1.0, graph=True)
        assert ran(d, on)
        lg = d.run_prefill(lambda: gpu.forward_cached(prompt, d.cache, 0, W))
        d.begin(lg[:, -1, :], 4, W)
        logits = []
        for _ in range(cfg.context - 4):
            d.step(1)
            d.stream.synchronize()
            logits.append(cp.asnumpy(d.logits))
        runs.append((np.stack(logits), d.tokens(0, cfg.context - 4)))
    return runs


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("B", [1, 2, 3, 4])
@pytest.mark.parametrize("ci", range(len(CONFIGS)))
def test_persistent_step_gives_the_launches_bits(ci, B, precision, monkeypatch):
    """The model step as one persistent kernel (gpu/decode.cu dec_step, cuda_decode.PERSIST)
    against the same kernels launched one by one: every step's logits and sampled ids bit for bit,
    to the end of the cache (the same arithmetic; a barrier too few, a block reading a stale copy
    of what another wrote, or a wrong weight row would differ). With PERSIST on it must be the
    path that ran."""
    (a, ta), (b, tb) = _kernel_path_on_and_off(CONFIGS[ci], precision, B, "PERSIST", monkeypatch,
                                               lambda d, on: (d.persist is not None) == on)
    assert np.array_equal(a, b) and np.array_equal(ta, tb)


@pytest.mark.parametrize("B", [8, 37])
def test_mma_products_bf16_and_repeat(B):
    """bf16 (no float64 bound holds for bf16 activations over many steps, see the cuBLAS step's
    test): the tensor-core path's first-step logits within 0.2 of the logits' scale of the warp
    kernels' (a wrong operand type or fragment gives noise far past it), and a second run gives
    the same bytes for 40 steps."""
    import cupy as cp
    from bytemodel.ops.cuda_decode import Decoder
    cfg = ModelConfig(**CONFIGS[2])
    _, gpu = models(cfg, "bf16", seed=2)
    prompt = cp.asarray(np.random.default_rng(B).integers(0, cfg.vocab_size, (B, 4)))
    W = gpu.weights()
    runs = []
    for mma in (True, True, False):
        d = Decoder(gpu, B, cfg.vocab_size, seed=1, temperature=0.0, top_k=0, top_p=1.0, graph=True, mma=mma)
        assert d.mma == mma
        lg = d.run_prefill(lambda: gpu.forward_cached(prompt, d.cache, 0, W))
        d.begin(lg[:, -1, :], 4, W)
        out = []
        for _ in range(40):
            d.step(1)
            d.stream.synchronize()
            out.append(cp.asnumpy(d.logits))
        runs.append(np.stack(out))
    assert np.array_equal(runs[0], runs[1])
    assert np.isfinite(runs[0]).all()
    # the first step only: both paths sample the same id from the same prefill logits there; later
    # greedy ids may part at a near tie, and then the logits are of different inputs
    assert np.abs(runs[0][0] - runs[2][0]).max() <= 0.2 * np.abs(runs[2][0]).max()


def test_cli_speculative_on_a_gpu_samples_with_the_device_decoder(tmp_path, monkeypatch):
    """`generate --speculative` on a GPU: its verify pass runs op by op, 5-12x slower than the
    on-device decoder (benchmarks/README.md), so the CLI samples with the decoder instead, from the
    same distribution, and says so: the bytes are the plain command's, and no drafts are reported."""
    from typer.testing import CliRunner
    from bytemodel.cli import app
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toy.txt").write_bytes(b"ACGTTGCAAGCT" * 400)
    r = CliRunner().invoke(app, ["train", "--source", "toy.txt", "--steps", "6", "--context", "32",
                                 "--batch-size", "4", "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
                                 "--d-ff", "48", "--mtp", "3", "--out", "run", "-q", "--no-baseline"])
    assert r.exit_code == 0, r.output
    args = ["generate", "-c", "run", "--bytes", "60", "--seed", "3", "--device", "cuda"]
    spec = CliRunner().invoke(app, args + ["--speculative"])
    plain = CliRunner().invoke(app, args)
    assert spec.exit_code == 0 and plain.exit_code == 0, (spec.output, plain.output)
    assert "note: on a GPU the on-device decoder" in spec.output
    assert "drafts accepted" not in spec.output
    assert spec.stdout_bytes == plain.stdout_bytes and len(plain.stdout_bytes) >= 60


def test_chat_samples_on_the_device_as_the_host_loop(monkeypatch):
    """Chat on a GPU runs the on-device decoder (decode.generate.device_ids): in fp32 the replies
    of a conversation are the CPU's, one reply after another from one generator, so each reply
    leaves that generator where the host loop leaves it (the decoder samples ahead in chunks; replies
    of random lengths here, ended by a special id or max_bytes); past the context too (a long system
    message). The host loop is made to fail for the GPU's chat."""
    from bytemodel import chat as chat_mod
    from bytemodel.chat import Chat
    from bytemodel.chat_template import chat_tokenizer
    from bytemodel.ops import get_backend
    tok = chat_tokenizer(Tokenizer())
    cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=64, n_layers=2, n_heads=4, d_ff=96, context=48)
    ref = Model(cfg, numpy_ops)
    ref.init_weights(7)
    flat = ref.ops.to_numpy(ref.params).astype(np.float32) * 3
    ref.load_flat(flat)
    gpu = Model(cfg, get_backend("cuda", "fp32"))
    gpu.load_flat(flat)
    turns = (b"hello", b"and then?", b"more", b"x" * 30)
    for kw in (dict(temperature=0.9, seed=3), dict(temperature=0.7, top_k=20, top_p=0.9, seed=4), dict(temperature=0)):
        a = Chat(ref, tok, b"sys " * 6, max_bytes=70, **kw)
        want = [a.reply(t) for t in turns]
        plain = chat_mod.plain_ids
        monkeypatch.setattr(chat_mod, "plain_ids", lambda *x, **k: (_ for _ in ()).throw(AssertionError("host loop")))
        b = Chat(gpu, tok, b"sys " * 6, max_bytes=70, **kw)
        got = [b.reply(t) for t in turns]
        monkeypatch.setattr(chat_mod, "plain_ids", plain)
        assert got == want, kw
        assert b.rng.bit_generator.state == a.rng.bit_generator.state, kw
        assert len(set(map(len, want))) > 1 or kw.get("temperature") == 0, want   # replies end in different places
