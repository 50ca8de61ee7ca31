"""GPU decoding: B sequences, one token each per step, over a KV cache (kernels: gpu/decode.cu).

A step (sample from the current logits, feed the sampled ids through every layer, write new
logits) is a fixed sequence of launches that reads the cache position from device memory, so it
is captured once as a CUDA graph and replayed; the host reads nothing between steps. Sampling
(temperature, top-k, top-p) runs on the device with the CPU's seed semantics: sequence i draws
from the PCG64 stream of np.random.default_rng(seed + i), one double per sampled token, as
Generator.choice does on the CPU (see decode/generate.py).

Up to GRAPH_MAX_BATCH sequences the products are warp-per-output dot products over transposed
weight copies (made once per Decoder); with MMA_MAX_BATCH set, batches above that up to it use the
same kernel path with the products on tensor cores (dec_*_m*, off by default until measured).
Above that the step is the backend's own ops (cuBLAS products,
as Model.forward_cached runs them) with the two position-dependent pieces, RoPE's row and the
cache write, read from device memory (gpu/step.cu), so that step too is captured once as a graph
and replayed; its products go through the decoder's own cuBLAS handle by ctypes (_RawBlas), since
CuPy's wrappers refuse to bind a handle to a capturing stream. Without that (fp32, or BLAS_GRAPH
off) batches above KERNEL_MAX_BATCH run the backend's cached forward from Python every step.
That cuBLAS step (BlasStep) also serves the compressor: LockstepGraph is decode/lockstep.py's
sliding step over a ring cache, with the compressor's quantiser in the same graph.

Shapes: B batch, C d_model, H heads, K kv heads, D head dim, F d_ff, V vocab, S cache length.
"""
from __future__ import annotations

import math
import os

import numpy as np
import cupy as cp

from .cuda_ops import _cublas, _module, _scale_log2

GRAPH_MAX_BATCH = 4            # these kernels up to this batch, above it the captured cuBLAS step: at base on
                               # the H200 a kernel step costs ~0.25 + 0.097 B ms, the captured cuBLAS step
                               # ~0.67 + 0.0027 B ms (B = 1, 16 and 64, 128, 256 measured: benchmarks/README.md,
                               # issue 24), equal near B = 4.5
KERNEL_MAX_BATCH = 64          # where the captured step is not available (fp32, BLAS_GRAPH off) these kernels
                               # still beat the cuBLAS step launched from Python (~8 ms a step) up to here
GRAPH_STEPS = 1                # steps captured per graph (a launch replays this many)
PDL = True                     # the kernel path's launches with programmatic dependent launch on compute
                               # capability 9.0+ (ops/cuda_launch.py): each kernel reads its weights while the
                               # one before finishes; the same bits. H200, base fp16: batch 1 2,867 -> 3,449
                               # tokens/s, batch 4 level (benchmarks/README.md). False (or BYTEMODEL_PDL=0): off
PERSIST = False                # the kernel path's model step as one persistent kernel (gpu/decode.cu dec_step:
                               # its launches become phases between grid-wide barriers, launched cooperatively),
                               # where it fits (_persist_setup); the same bits. Off, as measured (H100, base fp16,
                               # 512 tokens: batch 1 2,868 against 3,309 tokens/s with the PDL launches, batch 4
                               # 6,129 against 6,027; bf16 batch 1 2,141 against 3,360: benchmarks/README.md).
                               # True turns it on; BYTEMODEL_PERSIST=0 keeps it off whatever this says
BLAS_GRAPH = True              # above GRAPH_MAX_BATCH: the cuBLAS step captured as a graph (gpu/step.cu makes
                               # it position-free); False: the same ops launched from Python every step
MMA_MAX_BATCH = 0              # batches GRAPH_MAX_BATCH < B <= this: the kernel path with tensor-core products
                               # (dec_*_m*, fp16/bf16) instead of the captured cuBLAS step; 0: off, as measured
                               # (H200, base fp16: B 16 24,704 against 23,526 tokens/s, B 64 33,377 against
                               # 71,134: every CTA re-stages and re-normalises the whole batch; generate.py --mma)
STEP_VIEWS = os.environ.get("BYTEMODEL_STEP_FUSED", "1") != "0"   # (BYTEMODEL_STEP_FUSED=0: neither, for the CLI)
                               # the captured cuBLAS step reads k, v and q where the projection left them: RoPE
                               # and the cache write in one pass (step_rope_cache) and the attention on the
                               # act_t query, writing act_t (dec_attn_act_d*), with no copies or casts around
                               # them: 5 launches a layer fewer, the same bits (H200, base fp16, generate.py
                               # --views: B 16 23,936 -> 29,208 tokens/s, B 64 75,826 -> 87,731)
STEP_ADD_NORM = STEP_VIEWS     # ... and each residual add with the RMSNorm after it in one kernel
                               # (step_add_rmsnorm: 2 launches a layer fewer, the same bits as add_v8 then
                               # rmsnorm_fwd_v8): B 16 30,653, B 64 88,417 with both; the compressor at base
                               # 236 -> 277 KB/s compressing, 175 -> 204 decompressing (400 kB, compress.py)
MMA_MAX_IN = 2048              # widest input of a tensor-core product (a warp holds its chunks in registers)
MMA_SMEM = 100 * 1024          # shared memory a tensor-core CTA may take
SAMPLE_MAX_VOCAB = 8192        # the sampler keeps a row in shared memory
ATTN_HEAD_DIMS = (16, 32, 64, 128, 256)
_THREADS = 256
_FILE = "decode.cu"
_STEP_FILE = "step.cu"


class _RawBlas:
    """The two cuBLAS calls cuda_ops._gemm makes (setPointerMode, gemmEx), through the libcublas CuPy
    loaded, by ctypes, without touching the handle's stream: for a handle bound to a capturing stream."""
    _one = None

    def __init__(self):
        import ctypes
        import re
        path = None
        with open("/proc/self/maps") as f:
            for line in f:
                q = line.split()[-1]
                if re.search(r"/libcublas\.so[.0-9]*$", q):
                    path = q
                    break
        self.lib = ctypes.CDLL(path or "libcublas.so")
        vp, ci = ctypes.c_void_p, ctypes.c_int
        self.lib.cublasSetPointerMode_v2.argtypes = [vp, ci]
        self.lib.cublasGemmEx.argtypes = [vp, ci, ci, ci, ci, ci, vp, vp, ci, ci, vp, ci, ci, vp, vp, ci, ci, ci, ci]

    @classmethod
    def get(cls):
        if cls._one is None:
            cls._one = cls()
        return cls._one

    def setPointerMode(self, handle, mode):
        st = self.lib.cublasSetPointerMode_v2(handle, mode)
        if st:
            raise RuntimeError(f"cublasSetPointerMode failed (status {st})")

    def gemmEx(self, handle, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, compute, algo):
        st = self.lib.cublasGemmEx(handle, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc,
                                   compute, algo)
        if st:
            raise RuntimeError(f"cublasGemmEx failed (status {st})")


class StreamBlas:
    """A cuBLAS handle of its own, bound to `stream` once, and the context (use()) in which the
    backend's products go through it straight to libcublas (_RawBlas): CuPy's wrappers set the
    handle's stream on every call and refuse to while the stream captures a CUDA graph. BlasStep's
    products; benchmarks/gpu_train.py --graph's captured training step."""

    def __init__(self, stream):
        self._handle = _cublas.create()
        _cublas.setStream(self._handle, stream.ptr)

    def __del__(self):
        h = getattr(self, "_handle", None)
        if h is not None:
            self._handle = None
            try:
                _cublas.destroy(h)
            except Exception:   # pragma: no cover  (interpreter shutdown)
                pass

    def use(self):
        import contextlib
        from . import cuda_ops
        dev, handle = cp.cuda.device, self._handle

        @contextlib.contextmanager
        def swap():
            orig_handle, orig_blas = dev.get_cublas_handle, cuda_ops._cublas
            dev.get_cublas_handle = lambda: handle
            cuda_ops._cublas = _RawBlas.get()
            try:
                yield
            finally:
                dev.get_cublas_handle, cuda_ops._cublas = orig_handle, orig_blas
        return swap()


def _blocks_of(n: int) -> int:
    return max(1, min(1024, (n + _THREADS - 1) // _THREADS))

# The ModelConfig fields this copy of the block follows, and those that cannot change its logits
# (as model.FOLLOWS; checked by tests/test_engines.py)
FOLLOWS = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "context", "rope_theta",
           "norm_eps", "tie_embeddings")
IGNORES = {"init_std": "training only", "mtp": "the next-token logits only: the multi-token heads are not run",
           "mtp_design": "the multi-token heads are not run", "mtp_weight": "training only",
           "dropout": "training steps only (Model.forward with a Dropout)",
           "dropout_attn": "training steps only (Model.forward with a Dropout)"}


def mma_supports(cfg, precision: str) -> str | None:
    """None if the tensor-core products (gpu/decode.cu, dec_*_m*) take this model, else why not."""
    C, F, H, D = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.head_dim
    if precision not in ("fp16", "bf16"):
        return "tensor-core products need fp16 or bf16"
    if any(n % 32 or n > MMA_MAX_IN for n in (C, F, H * D)):
        return f"d_model, d_ff and n_heads * head_dim must be multiples of 32 up to {MMA_MAX_IN}"
    if D % 16:
        return "head dim must be a multiple of 16"
    return None


def _mma_nt(B: int, cin: int) -> int:
    """Batch tiles of 8 rows a CTA stages at once for an input of width cin (shared memory bound)."""
    nt = min(4, max(1, -(-B // 8)))
    while nt > 1 and _mma_smem(nt, cin) > MMA_SMEM:
        nt //= 2
    return nt


def _mma_smem(nt: int, cin: int) -> int:
    """Bytes of shared memory: the staged rows (act_t, padded) and the warps' partial tiles."""
    return (nt * 8 * (cin + 8) + 1) // 2 * 4 + 8 * 32 * nt * 4 * 4


def supports(cfg, vocab: int) -> str | None:
    """None if the decode kernels take this model, else the reason they do not."""
    C, F, H, D = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.head_dim
    if C % 8 or F % 8 or (H * D) % 8:
        return "d_model, d_ff and n_heads * head_dim must be multiples of 8"
    if D not in ATTN_HEAD_DIMS:
        return f"head dim {D} is not one of {ATTN_HEAD_DIMS}"
    if vocab > SAMPLE_MAX_VOCAB:
        return f"vocabulary {vocab} is larger than {SAMPLE_MAX_VOCAB}"
    return None


def _rows(B: int) -> int:
    return 1 if B == 1 else 2 if B == 2 else 4 if B <= 4 else 8


class Sampler:
    """The device sampler alone: logits (B, ld) fp32 -> ids, with per-sequence PCG64 streams.
    allowed: None, or bool (vocab,): the ids that may be drawn (generation's byte mask); the others
    count as -inf logits, as the host's sampler sees them. streams: None (sequence i starts where
    np.random.default_rng(seed + i) does), or (B, 4) uint64 PCG64 states to start from
    (sampling.rng_words: where a host generator stands)."""

    def __init__(self, backend, vocab: int, B: int, seed: int, cap: int, allowed=None, streams=None):
        self.ops, self.V, self.B, self.cap = backend, vocab, B, cap
        allowed = None if allowed is None else np.asarray(allowed, dtype=bool)   # (vocab,): generate checked it
        self.allowed = None if allowed is None or allowed.all() else cp.asarray(allowed.astype(np.uint8))
        self.P2 = 1 << max(1, (vocab - 1).bit_length())
        from ..sampling import rng_states
        self.rng = cp.asarray(rng_states(seed, B) if streams is None else np.asarray(streams, dtype=np.uint64).reshape(B, 4))
        self.ids = cp.zeros((B,), dtype=cp.int32)
        self.out = cp.zeros((B, cap), dtype=cp.int32)
        self.fn = _module(_FILE, backend.precision).get_function("dec_sample")
        self.smem = vocab * 8 + self.P2 * 8
        if self.smem > 48 * 1024 and self.fn.max_dynamic_shared_size_bytes < self.smem:
            self.fn.max_dynamic_shared_size_bytes = self.smem

    def __call__(self, logits, state, temperature: float, top_k: int, top_p: float, launch=None) -> None:
        args = (logits, np.int32(logits.shape[-1]), np.int32(self.V), np.int32(self.P2),
                np.float32(temperature), np.int32(top_k), np.float64(top_p), self.rng, self.ids,
                self.out, np.int32(self.cap), state, np.uint64(0) if self.allowed is None else self.allowed)
        if launch is None:
            self.fn((self.B,), (_THREADS,), args, shared_mem=self.smem)
        else:
            launch(self.fn, (self.B,), (_THREADS,), args, self.smem)


class BlasStep:
    """Model.forward_cached of one token per sequence (T = 1) through the backend's own ops, in
    its order, with the three position-dependent pieces read from device memory, so that a step
    can be captured once as a CUDA graph and replayed (gpu/step.cu):
      - RoPE's row: row rope_at[0] of the tables cos_t, sin_t (the rows forward_cached would use);
      - the cache slot the new keys and values go to: slot_at[0];
      - the keys attended: slots 0..keys_at[0] (attention_decode's kernel, one split).
    Its products go through its own cuBLAS handle, bound to `stream` once, here (CuPy's wrappers
    refuse to set a handle's stream while the stream captures; _RawBlas calls libcublas without),
    and what runs inside context() allocates from its own memory pool, kept as long as it lives.
    Two users: Decoder (generation, N > GRAPH_MAX_BATCH) and LockstepGraph (the compressor)."""

    def __init__(self, model, stream, W=None):
        ops, cfg = model.ops, model.cfg
        D = cfg.head_dim
        self.model, self.ops, self.cfg = model, ops, cfg
        self.W = model.weights() if W is None else W     # one cast, before capture: a graph reads these buffers
        dt = ops.activation_dtype(model.dtype)
        self.cos1 = cp.zeros((1, D // 2), dtype=dt)
        self.sin1 = cp.zeros((1, D // 2), dtype=dt)
        mod = _module(_STEP_FILE, ops.precision)
        self.k_rope_row = mod.get_function("step_rope_row")
        self.k_cache_write = mod.get_function("step_cache_write")
        self.k_rope_cache = mod.get_function("step_rope_cache") if STEP_VIEWS else None
        C = cfg.d_model
        self.k_add_norm = mod.get_function("step_add_rmsnorm") if STEP_ADD_NORM and C % 8 == 0 else None
        self.k_attn1 = _module(_FILE, ops.precision).get_function(f"dec_attn_d{D}")
        self.k_attn_act = _module(_FILE, ops.precision).get_function(f"dec_attn_act_d{D}") if STEP_VIEWS else None
        self.unused = cp.zeros((1,), dtype=cp.float32)    # the split buffers a one-split attention never touches
        self.scale_log2 = _scale_log2(D)
        self.pool = cp.cuda.MemoryPool()
        self.blas = StreamBlas(stream)

    def own_handle(self):
        """A context in which the backend's products use this step's cuBLAS handle (StreamBlas)."""
        return self.blas.use()

    def forward(self, ids, cache, cos_t, sin_t, rope_at, slot_at, keys_at):
        """ids (B, 1) int on the device -> logits (B, V) in the activation dtype (a new buffer).
        cache: the layers' (keys, values) (B, K, S, D). Nothing here reads a position on the host."""
        m, o, cfg = self.model, self.ops, self.cfg
        B = ids.shape[0]
        H, K, D, C = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
        W, eps, i32 = self.W, cfg.norm_eps, np.int32
        S = cache[0][0].shape[2]
        self.k_rope_row((1,), (max(32, D // 2),), (cos_t, sin_t, self.cos1, self.sin1, rope_at, i32(D // 2)))
        x, _ = o.embedding_forward(W["wte"], ids)
        x = x.reshape(B, C)
        h1, _ = o.rmsnorm_forward(x, W["layers.0.attn_norm"], eps)
        for i in range(cfg.n_layers):
            p = f"layers.{i}."
            kc, vc = cache[i]
            q = self._qkv_to_cache(o.matmul_forward(h1, W[p + "wqkv"]), kc, vc, slot_at, B, S)
            it = q.itemsize
            if self.k_attn_act is not None and q.strides[3] == it:   # q as it is, the output in act_t
                a = cp.empty((B, H * D), dtype=o.act_dtype)
                self.k_attn_act((B * H, 1), (128,), (q, np.int64(q.strides[0] // it), np.int64(q.strides[1] // it),
                                                     kc, vc, self.unused, self.unused, a, keys_at, i32(H), i32(K),
                                                     i32(S), i32(S), np.float32(self.scale_log2)))
            else:
                qf = cp.ascontiguousarray(q[:, :, 0], dtype=cp.float32).reshape(B * H, D)
                att = cp.empty((B * H, D), dtype=cp.float32)
                self.k_attn1((B * H, 1), (128,), (qf, kc, vc, att, att, att, keys_at, i32(H), i32(K), i32(S),
                                                  i32(S), np.float32(self.scale_log2)))
                a = att.astype(o.act_dtype).reshape(B, H * D)
            x, h2 = self._add_norm(x, o.matmul_forward(a, W[p + "wo"]), W[p + "mlp_norm"])
            u = o.matmul_forward(h2, W[p + "w_gateup"])
            sw, _ = o.swiglu_forward(u)
            nxt = W[f"layers.{i + 1}.attn_norm"] if i + 1 < cfg.n_layers else W["norm_f"]
            x, h1 = self._add_norm(x, o.matmul_forward(sw, W[p + "w_down"]), nxt)
        return o.matmul_forward(h1, m.head(W)[0])

    def _qkv_to_cache(self, qkv, kc, vc, slot_at, B, S):
        """The projection's (B, (H + 2K) * D) -> q (B, H, 1, D) rotated, the keys rotated and the values
        written into the cache at slot_at[0]: qkv_rope_forward then the cache write from copies, or
        step_rope_cache's one pass (STEP_VIEWS; every head dim the decoder takes is a multiple of 16)."""
        o, cfg, i32 = self.ops, self.cfg, np.int32
        H, K, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        if self.k_rope_cache is not None and D % 16 == 0 and qkv.dtype == o.act_dtype and qkv.flags.c_contiguous:
            q = cp.empty((B, H, 1, D), dtype=o.act_dtype)
            self.k_rope_cache((_blocks_of(B * (H + 2 * K) * (D // 16)),), (_THREADS,),
                              (qkv, self.cos1, self.sin1, q, kc, vc, slot_at, i32(B), i32(H), i32(K), i32(S), i32(D)))
            return q
        q, k, v = o.qkv_rope_forward(qkv, self.cos1, self.sin1, B, 1, H, K)
        kk = cp.ascontiguousarray(k.reshape(B * K, D))
        vv = cp.ascontiguousarray(v.reshape(B * K, D))
        self.k_cache_write((_blocks_of(B * K * D),), (_THREADS,), (kk, vv, kc, vc, slot_at, i32(B * K),
                                                                  i32(S), i32(D)))
        return q

    def _add_norm(self, x, y, g):
        """(x + y, rmsnorm(x + y) * g): ops.add then ops.rmsnorm_forward, or step_add_rmsnorm's one
        launch giving the same bits (STEP_ADD_NORM)."""
        o, (N, C) = self.ops, x.shape
        if self.k_add_norm is None or x.dtype != o.act_dtype or y.dtype != o.act_dtype or not y.flags.c_contiguous:
            x = o.add(x, y)
            return x, o.rmsnorm_forward(x, g, self.cfg.norm_eps)[0]
        xo, out = cp.empty_like(x), cp.empty_like(x)
        self.k_add_norm(((N + 7) // 8,), (256,), (cp.ascontiguousarray(x), y, o._act(g), xo, out, np.int64(N),
                                                 np.int32(C), np.float32(self.cfg.norm_eps)))
        return xo, out


class Decoder:
    """Decoding state for B sequences of one model: transposed weights, KV cache, buffers, graph.

    Usage (the driver is bytemodel.decode.generate): load logits into `logits` (B, V) and the position
    into `state[0]`, then `step()` any number of times (each samples one token per sequence into
    out[:, state[1]] and advances the model by it), reading `sampler.out` when needed.
    allowed: None, or bool (vocab,): the only ids drawn; streams: the sampler's start states (Sampler).
    """

    def __init__(self, model, B: int, vocab: int, seed: int, temperature: float, top_k: int,
                 top_p: float, graph: bool | None = None, mma: bool | None = None, allowed=None, streams=None):
        ops, cfg = model.ops, model.cfg
        why = supports(cfg, vocab)
        if why:
            raise ValueError(why)
        self.model, self.ops, self.cfg, self.B = model, ops, cfg, B
        self.sampling = (float(temperature), int(top_k), float(top_p))
        # the captured cuBLAS step needs attention_decode's kernel (fp32 keeps the reference path)
        blas_graph = BLAS_GRAPH and ops.decode_attention
        limit = GRAPH_MAX_BATCH if blas_graph else KERNEL_MAX_BATCH
        # mma: the kernel path's products on tensor cores (None: for GRAPH_MAX_BATCH < B <= MMA_MAX_BATCH)
        if mma is None:
            mma = graph is None and GRAPH_MAX_BATCH < B <= MMA_MAX_BATCH
        self.mma = bool(mma) and mma_supports(cfg, ops.precision) is None
        self.use_graph = (B <= limit or self.mma) if graph is None else graph
        self.mma = self.mma and self.use_graph
        self.blas_graph = not self.use_graph and blas_graph
        S = cfg.context
        C, F, H, K, D, Vm = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size
        # the graph path replays on its own stream (capture needs one); the cuBLAS path stays on
        # the null stream, where the backend's cuBLAS handle runs
        self.stream = cp.cuda.Stream(non_blocking=True) if self.use_graph or self.blas_graph else cp.cuda.Stream.null
        # buffers and weight copies are made on the null stream, then waited for
        self.cache = model.new_cache(B, S)
        self.state = cp.zeros((4,), dtype=cp.int32)
        self.logits = cp.zeros((B, Vm), dtype=cp.float32)
        self.sampler = Sampler(ops, vocab, B, seed, S + 1, allowed, streams)
        self.pdl = None
        if self.use_graph:
            self._kernel_setup(model, B, S, C, F, H, K, D, Vm)
            self.pdl = self._pdl_setup()
        elif self.blas_graph:
            self._blas_graph_setup(model, B, S, H, D)
        cp.cuda.Stream.null.synchronize()
        self._graphs = {}

    # ------------------------------------------------------------------ the kernel path
    def _kernel_setup(self, model, B, S, C, F, H, K, D, Vm):
        cfg = self.cfg
        W = model.weights()
        t = lambda a: cp.ascontiguousarray(a.T)                      # noqa: E731  (in, out) -> (out, in)
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"layers.{i}."
            self.layers.append(dict(g1=W[p + "attn_norm"], wqkv=t(W[p + "wqkv"]), wo=t(W[p + "wo"]),
                                    g2=W[p + "mlp_norm"], wgu=t(W[p + "w_gateup"]), wd=t(W[p + "w_down"])))
        self.wte = W["wte"]
        self.head = W["wte"] if cfg.tie_embeddings else t(W["lm_head"])  # (V, C) either way
        self.g_f = W["norm_f"]
        from .host import rope_tables
        cos, sin = rope_tables(np.arange(S), D, cfg.rope_theta, np.float32)
        self.cos, self.sin = cp.asarray(cos), cp.asarray(sin)
        self.x = cp.zeros((B, C), dtype=cp.float32)
        self.q = cp.zeros((B, H, D), dtype=cp.float32)
        self.att = cp.zeros((B, H * D), dtype=cp.float32)
        self.s = cp.zeros((B, F), dtype=cp.float32)
        # attention splits: enough blocks to cover the SMs twice, at least 64 keys per split
        sms = self.ops.sm_count
        max_splits = max(1, math.ceil(S / 64))
        self.NS = max(1, min(max_splits, math.ceil(2 * sms / (B * H))))
        self.CH = math.ceil(S / self.NS)
        self.part = cp.zeros((B * H * self.NS * (D + 2),), dtype=cp.float32)
        self.tickets = cp.zeros((B * H,), dtype=cp.int32)
        mod = _module(_FILE, self.ops.precision)
        self.k_attn = mod.get_function(f"dec_attn_d{D}")
        if self.mma:     # one kernel per input width: its batch tile (NT x 8 rows) fits shared memory
            width = {"C": C, "F": F, "A": H * D}
            nt = {k: _mma_nt(B, w) for k, w in width.items()}
            self.smem = {k: _mma_smem(nt[k], width[k]) for k in width}
            self.k_qkv = mod.get_function(f"dec_qkv_m{nt['C']}")
            self.k_gu = mod.get_function(f"dec_gateup_m{nt['C']}")
            self.k_proj_w = {k: mod.get_function(f"dec_proj_m{nt[k]}") for k in width}
            fns = [self.k_qkv, self.k_gu, *self.k_proj_w.values()]
        else:
            R = _rows(B)
            while R > 1 and R * max(C, F, H * D) * 4 > 160 * 1024:
                R //= 2
            self.R = R
            self.k_qkv = mod.get_function(f"dec_qkv_r{R}")
            self.k_proj = mod.get_function(f"dec_proj_r{R}")
            self.k_gu = mod.get_function(f"dec_gateup_r{R}")
            self.k_proj_w = {k: self.k_proj for k in ("C", "F", "A")}
            self.smem = {"C": R * C * 4, "F": R * F * 4, "A": R * H * D * 4}
            fns = [self.k_qkv, self.k_proj, self.k_gu]
        for fn in fns:
            need = max(self.smem.values())
            if need > 48 * 1024 and fn.max_dynamic_shared_size_bytes < need:
                fn.max_dynamic_shared_size_bytes = need
        self.scale_log2 = _scale_log2(D)
        self.persist = None if self.mma else self._persist_setup(B, C, F, H, K, D, Vm)

    def _persist_setup(self, B, C, F, H, K, D, Vm):
        """The launch of dec_step (the whole model step in one grid, compiled for R and D) when it applies, else
        None: one staging a phase (B <= R), a warp an output in every product and two attention
        blocks a CTA (the grid G below), and G blocks resident at once on this GPU."""
        if not PERSIST or os.environ.get("BYTEMODEL_PERSIST") == "0" or self.R < B:
            return None
        from .cuda_ops import DECODE_HEAD_DIMS
        if D not in DECODE_HEAD_DIMS:
            return None
        try:
            from .cuda_launch import COOPERATIVE, Launcher
            launcher = Launcher(COOPERATIVE)
            fn = _module(_FILE, self.ops.precision, (f"DEC_STEP_R={self.R}", f"DEC_STEP_D={D}")).get_function("dec_step")
            smem = self.R * max(C, F, H * D) * 4
            if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
                fn.max_dynamic_shared_size_bytes = smem
            w = _THREADS // 32
            G = max(-(-((H + 2 * K) * D // 2) // w), -(-C // w), -(-F // w), -(-Vm // w), -(-(B * H * self.NS) // 2))
            if launcher.blocks_per_sm(fn.kernel.ptr, _THREADS, smem) * self.ops.sm_count < G:
                return None
        except Exception:       # no driver entry point: the launches one by one
            return None
        ptrs = []
        for L, (kc, vc) in zip(self.layers, self.cache):
            ptrs += [int(a.data.ptr) for a in (L["g1"], L["wqkv"], L["wo"], L["g2"], L["wgu"], L["wd"], kc, vc)]
        self.lp = cp.asarray(np.array(ptrs, dtype=np.uint64))
        self.bar = cp.zeros((2,), dtype=cp.uint32)
        return launcher, fn, G, smem

    def _pdl_setup(self):
        """A cuda_launch.Launcher when this GPU launches with PDL (compute capability 9.0+, a probe
        kernel launched that way ran), else None: the ordinary launches."""
        from . import gpu_capability
        if not PDL or os.environ.get("BYTEMODEL_PDL") == "0" or gpu_capability() < (9, 0):
            return None
        try:
            from .cuda_launch import Launcher
            launcher = Launcher()
            flag = cp.zeros((1,), dtype=cp.int32)
            cp.cuda.Stream.null.synchronize()       # the zeros (null stream) before the probe (self.stream)
            probe = _module(_FILE, self.ops.precision).get_function("dec_pdl_probe")
            launcher(probe.kernel.ptr, (1,), (32,), (flag,), 0, self.stream.ptr)
            self.stream.synchronize()
            return launcher if int(flag[0]) == 1 else None
        except Exception:       # no driver entry point, no handle: the ordinary launches
            return None

    def _k(self, fn, grid, block, args, shared_mem: int = 0) -> None:
        """Launch one kernel of the kernel path on the decoder's stream (with PDL when set up)."""
        if self.pdl is None:
            fn(grid, block, args, shared_mem=shared_mem)
        else:
            self.pdl(fn.kernel.ptr, grid, block, args, shared_mem, self.stream.ptr)   # RawKernel -> CUfunction

    def _launch_model(self):
        """Feed sampler.ids through the model at state[0]: logits, then pos += 1, t += 1."""
        cfg, B = self.cfg, self.B
        C, F, H, K, D, Vm = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.vocab_size
        S, eps, null = cfg.context, np.float32(cfg.norm_eps), np.uint64(0)
        i32 = np.int32
        if self.persist is not None:
            launcher, fn, G, smem = self.persist
            launcher(fn.kernel.ptr, (G,), (_THREADS,),
                     (self.x, self.sampler.ids, self.wte, self.lp, i32(cfg.n_layers), self.head, self.g_f, self.cos,
                      self.sin, self.q, self.att, self.s, self.part, self.tickets, self.logits, self.state,
                      self.bar, i32(B), i32(C), i32(H), i32(K), i32(S), i32(F), i32(Vm), i32(self.NS),
                      i32(self.CH), eps, np.float32(self.scale_log2)), smem, self.stream.ptr)
            return
        wb = lambda n: ((n + 7) // 8,)                               # noqa: E731  one warp per item
        if self.mma:     # a CTA per 16 output rows (8 RoPE or gate/up pairs)
            g_qkv, g_gu = ((H + 2 * K) * D // 16,), ((F + 7) // 8,)
            g_out = lambda n: ((n + 15) // 16,)                      # noqa: E731
        else:            # a warp per output (pair), 8 warps a block
            g_qkv, g_gu = wb((H + 2 * K) * D // 2), wb(F)
            g_out = wb
        kp = self.k_proj_w
        for i, L in enumerate(self.layers):
            kc, vc = self.cache[i]
            ids = self.sampler.ids if i == 0 else null
            self._k(self.k_qkv, g_qkv, (_THREADS,),
                    (self.x, self.x if i == 0 else null, ids, self.wte, L["g1"], L["wqkv"], self.cos,
                     self.sin, self.q, kc, vc, self.state, i32(B), i32(C), i32(H), i32(K), i32(D),
                     i32(S), eps), self.smem["C"])
            self._k(self.k_attn, (B * H, self.NS), (128,),
                    (self.q, kc, vc, self.part, self.tickets, self.att, self.state, i32(H), i32(K),
                     i32(S), i32(self.CH), np.float32(self.scale_log2)))
            self._k(kp["A"], g_out(C), (_THREADS,), (self.att, L["wo"], self.x, null, i32(B), i32(H * D),
                                                     i32(C), i32(1), eps, null), self.smem["A"])
            self._k(self.k_gu, g_gu, (_THREADS,), (self.x, L["g2"], L["wgu"], self.s, i32(B), i32(C), i32(F),
                                                   eps), self.smem["C"])
            self._k(kp["F"], g_out(C), (_THREADS,), (self.s, L["wd"], self.x, null, i32(B), i32(F), i32(C),
                                                     i32(1), eps, null), self.smem["F"])
        self._k(kp["C"], g_out(Vm), (_THREADS,), (self.x, self.head, self.logits, self.g_f, i32(B), i32(C),
                                                  i32(Vm), i32(0), eps, self.state), self.smem["C"])

    def _launch_step(self):
        self.sampler(self.logits, self.state, *self.sampling, launch=None if self.pdl is None else self._k)
        self._launch_model()

    # ------------------------------------------------------------------ the cuBLAS path (large B)
    def _blas_step(self, pos: int):
        V = self.logits.shape[1]
        self.sampler(self.logits, self.state, *self.sampling)
        lg = self.model.forward_cached(self.sampler.ids.reshape(self.B, 1), self.cache, pos, self._W)
        self.logits[...] = lg[:, 0, :V]
        self.state += 1   # pos and t (pos is unused on this path)

    # ------------------------------------------------------------------ the cuBLAS path as a graph
    def _blas_graph_setup(self, model, B, S, H, D):
        """The backend's ops with the position-dependent pieces read from state[0] on the device
        (BlasStep: RoPE's row, the cache write, the keys attended). Same ops, same order as
        Model.forward_cached, so the same logits."""
        self._step = BlasStep(model, self.stream)
        self._Wg = self._step.W
        self.cos_t, self.sin_t = model.rope(S, 0, self.ops.activation_dtype(model.dtype))   # (S, D/2)
        self._pool = self._step.pool        # the graph's own memory: never handed to anyone else

    def _own_handle(self):
        return self._step.own_handle()

    def _launch_blas_model(self):
        """Feed sampler.ids through the model at state[0] with the backend's ops: logits, then
        pos += 1, t += 1. Nothing here reads the position on the host."""
        st = self.state
        self.logits[...] = self._step.forward(self.sampler.ids.reshape(self.B, 1), self.cache, self.cos_t,
                                              self.sin_t, st, st, st)
        self.state[:2] += 1

    def _launch_blas_step(self):
        self.sampler(self.logits, self.state, *self.sampling)
        self._launch_blas_model()

    # ------------------------------------------------------------------ driving
    def begin(self, logits_row, pos: int, W=None):
        """Start a segment: logits (B, V) or (V,) for every sequence; the cache holds pos tokens."""
        with self.stream:
            self.logits[...] = cp.asarray(logits_row, dtype=cp.float32)
            self.state[...] = cp.asarray(np.array([pos, 0, 0, 0], dtype=np.int32))
        self._pos = pos
        self._W = W

    def step(self, n: int = 1) -> None:
        """n steps: n tokens sampled per sequence, each fed through the model."""
        with self.stream:
            while n > 0:
                if self.blas_graph:
                    with cp.cuda.using_allocator(self._pool.malloc), self._own_handle():
                        if not getattr(self, "_eager_done", False):
                            self._launch_blas_step()    # eagerly once: modules load, the pool fills
                            self._eager_done = True
                        else:
                            if 1 not in self._graphs:
                                self.stream.begin_capture()
                                try:
                                    self._launch_blas_step()
                                finally:
                                    graph = self.stream.end_capture()
                                self._graphs[1] = graph
                            self._graphs[1].launch(self.stream)
                    k = 1
                elif not self.use_graph:
                    self._blas_step(self._pos)
                    k = 1
                elif not getattr(self, "_eager_done", False):
                    self._launch_step()          # the first step eagerly: modules load, launches checked
                    self._eager_done = True
                    k = 1
                else:
                    k = GRAPH_STEPS if n >= GRAPH_STEPS else 1
                    if k not in self._graphs:
                        self.stream.begin_capture()
                        for _ in range(k):
                            self._launch_step()
                        self._graphs[k] = self.stream.end_capture()
                    self._graphs[k].launch(self.stream)
                self._pos += k
                n -= k

    def sample_only(self) -> None:
        """Sample one more token per sequence without feeding it (the cache is full)."""
        with self.stream:
            self.sampler(self.logits, self.state, *self.sampling)

    def tokens(self, t0: int, t1: int) -> np.ndarray:
        """(B, t1 - t0) int: the tokens sampled at steps t0..t1-1 of this segment (waits for them)."""
        with self.stream:
            out = cp.asnumpy(self.sampler.out[:, t0:t1])
        return out

    def run_prefill(self, fn):
        """Run fn() (the backend's cached forward over a prompt, cuBLAS on the null stream) after
        this decoder's queued work, and queue this decoder's later work after it."""
        self.stream.synchronize()
        out = fn()
        if self.stream is not cp.cuda.Stream.null:
            ev = cp.cuda.Event(disable_timing=True)
            ev.record(cp.cuda.Stream.null)
            self.stream.wait_event(ev)
        return out



def lockstep_graph_ok(model, window: int) -> str | None:
    """None if LockstepGraph takes this model and window, else the reason it does not (then the
    compressor launches decode/lockstep.py's step from Python: the same bits)."""
    ops, cfg = model.ops, model.cfg
    if not getattr(ops, "decode_attention", False):
        return "the decode attention kernel is off (fp32 keeps the reference path)"
    from .cuda_ops import DECODE_HEAD_DIMS
    if cfg.head_dim not in DECODE_HEAD_DIMS:
        return f"head dim {cfg.head_dim} is not one of {DECODE_HEAD_DIMS}"
    if window < 1:
        return "no window"
    return None


class LockstepGraph:
    """decode/lockstep.py's sliding-window push (slide=True) for B streams as one CUDA graph a step,
    with a function of the logits in the same graph (the compressor's quantiser, `post`, whose
    (B, cols) result is what comes back): ids in from the host, post's table out to the host, one
    copy each way, all on this object's stream.

        G = LockstepGraph(model, B, window, steps, post, cols)
        G.enqueue(ids)      # (B,) ints: queue one push (at most two in flight)
        table = G.result()  # (B, cols) float32 host array of the oldest push in flight (waits for it)

    The cache is a ring of `window` slots (Model.block's T = 1 rule): position pos writes slot
    pos % window and attends to slots 0..min(pos, window - 1); RoPE's row at pos is the one
    forward_cached takes (the context's table below the context, the position's own table past
    it), so a push computes forward_cached's logits bit for bit (the same ops in the same order;
    tests/test_compress_gpu.py holds the captured, the eagerly launched and the Lockstep step to
    one another). state on the device: [0] pos, [1] its slot, [2] the last key attended.
    Two host buffers each way (pinned): push t's ids are copied from, and its table to, buffer
    t % 2, so the host may code push t while push t + 1 runs; result() must be taken before a third
    push is queued. graph False: every push launched eagerly (the same launches, for tests).

    host False (the compressor under --adapt, whose mixer and optimizer work on the device): post's
    table stays on the device, and the push is a drop-in for Lockstep.push, in order with the
    caller's stream both ways:

        out = G.push(ids)   # (B, cols) float32 on the device, valid until the next push
        G.refresh(W)        # after an optimizer step: the new weights copied into the captured ones
    """

    def __init__(self, model, B: int, window: int, steps: int, post, cols: int, weights=None, graph: bool = True,
                 host: bool = True):
        ops, cfg = model.ops, model.cfg
        why = lockstep_graph_ok(model, window)
        if why:
            raise ValueError(why)
        self.model, self.ops, self.B, self.Wn, self.post, self.cols = model, ops, int(B), int(window), post, int(cols)
        self.use_graph = bool(graph)
        self.stream = cp.cuda.Stream(non_blocking=True)
        # made on the null stream, then waited for
        self.cache = model.new_cache(self.B, self.Wn)
        dt = ops.activation_dtype(model.dtype)
        n, ctx = max(int(steps), 1), cfg.context
        cos, sin = model.rope(ctx, 0, dt)
        cs, ss = [cos[:min(n, ctx)]], [sin[:min(n, ctx)]]
        for p in range(ctx, n):                        # past the context: forward_cached's rope(1, pos)
            c1, s1 = model.rope(1, p, dt)
            cs.append(c1)
            ss.append(s1)
        self.cos_t = cp.ascontiguousarray(cp.concatenate(cs))       # (steps, D/2)
        self.sin_t = cp.ascontiguousarray(cp.concatenate(ss))
        self.steps = n
        self.step = BlasStep(model, self.stream, weights)
        self.state = cp.zeros((4,), dtype=cp.int32)
        self.ids = cp.zeros((self.B, 1), dtype=cp.int32)
        self.out = cp.zeros((self.B, self.cols), dtype=cp.float32)
        self._pinned = []
        self.host_ids = [self._host((self.B,), np.int32) for _ in range(2)]
        self.host_out = [self._host((self.B, self.cols), np.float32) for _ in range(2)] if host else None
        self.done = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
        self.ready = cp.cuda.Event(disable_timing=True)     # host False: the caller's work before a push
        self.queued = 0          # pushes queued
        self.taken = 0           # results taken
        self.graph = None
        self.captured = False
        self.capture_error = None    # why the capture failed (then every push is launched eagerly)
        cp.cuda.Stream.null.synchronize()

    def _host(self, shape, dtype):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        mem = cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        self._pinned.append(mem)
        return np.frombuffer(mem, dtype=dtype, count=int(np.prod(shape))).reshape(shape)

    def _launch(self):
        """One push, position-free: slot and last key from state[0], the step, post's table into
        `out`, then pos += 1."""
        st, W = self.state, self.Wn
        cp.remainder(st[0:1], np.int32(W), out=st[1:2])
        cp.minimum(st[0:1], np.int32(W - 1), out=st[2:3])
        lg = self.step.forward(self.ids, self.cache, self.cos_t, self.sin_t, st[0:], st[1:], st[2:])
        self.out[...] = self.post(lg)
        st[0:1] += np.int32(1)

    def _run(self):
        with cp.cuda.using_allocator(self.step.pool.malloc), self.step.own_handle():
            if not self.use_graph or self.queued == 0:
                self._launch()          # eagerly (the first push also loads modules and fills the pool)
                return
            if self.graph is None:
                self.stream.begin_capture()
                err = graph = None
                try:
                    self._launch()
                except Exception as e:     # something in the step cannot be captured
                    err = e
                try:
                    graph = self.stream.end_capture()
                except Exception as e:
                    err = err or e
                if err is not None:        # then every push is launched eagerly (the same launches)
                    self.capture_error = f"{type(err).__name__}: {err}"
                    self.use_graph = False
                    self._launch()
                    return
                self.graph, self.captured = graph, True
            self.graph.launch(self.stream)

    def enqueue(self, ids) -> None:
        """Queue the next push: ids (B,) ints (copied now)."""
        if self.queued - self.taken >= 2:
            raise RuntimeError("two pushes are in flight: take a result first")
        if self.queued >= self.steps:
            raise RuntimeError(f"made for {self.steps} pushes")
        k = self.queued % 2
        h = self.host_ids[k]
        h[...] = np.asarray(ids).reshape(self.B)
        rt = cp.cuda.runtime
        with self.stream:
            rt.memcpyAsync(self.ids.data.ptr, h.ctypes.data, h.nbytes, rt.memcpyHostToDevice, self.stream.ptr)
            self._run()
            o = self.host_out[k]
            rt.memcpyAsync(o.ctypes.data, self.out.data.ptr, o.nbytes, rt.memcpyDeviceToHost, self.stream.ptr)
            self.done[k].record(self.stream)
        self.queued += 1

    def push(self, ids):
        """host False: one push of ids (B,) ints after the caller's stream's work so far (a weight
        refresh, the reads of the last table) -> post's table (B, cols) float32 on the device, which
        the caller's stream's later work sees complete. Nothing waits on the host but the ids' buffer
        of two pushes ago."""
        if self.host_out is not None:
            raise RuntimeError("push is for host=False; enqueue and result copy to the host")
        if self.queued >= self.steps:
            raise RuntimeError(f"made for {self.steps} pushes")
        k = self.queued % 2
        if self.queued >= 2:
            self.done[k].synchronize()         # push t - 2 has read its ids from this buffer
        h = self.host_ids[k]
        h[...] = np.asarray(ids).reshape(self.B)
        caller = cp.cuda.get_current_stream()
        self.ready.record(caller)
        self.stream.wait_event(self.ready)
        rt = cp.cuda.runtime
        with self.stream:
            rt.memcpyAsync(self.ids.data.ptr, h.ctypes.data, h.nbytes, rt.memcpyHostToDevice, self.stream.ptr)
            self._run()
            self.done[k].record(self.stream)
        caller.wait_event(self.done[k])
        self.queued += 1
        self.taken += 1
        return self.out

    def refresh(self, weights) -> None:
        """The weights the step computes with, copied in place on the caller's stream (the graph
        reads these buffers; the next push waits for the copies): a model after an optimizer step
        gives the bits Lockstep gives with the new weights() (the cache keeps what the old computed)."""
        W = self.step.W
        if set(weights) != set(W):
            raise ValueError("refresh needs the same weights by name")
        for name, w in weights.items():
            if W[name] is not w:
                W[name][...] = w

    def result(self) -> np.ndarray:
        """(B, cols) float32: post's table of the oldest push in flight (waits for it). A view of a
        host buffer that the push two after it overwrites."""
        if self.taken >= self.queued:
            raise RuntimeError("no push in flight")
        k = self.taken % 2
        self.done[k].synchronize()
        self.taken += 1
        return self.host_out[k]

    def close(self) -> None:
        """Wait for the stream, then let the cache, the graph and the pool go."""
        self.stream.synchronize()
        self.graph = None
        self.cache = None
        self.step.pool.free_all_blocks()
