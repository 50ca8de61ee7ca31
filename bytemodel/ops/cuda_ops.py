"""The CUDA backend: the ops of numpy_ops.py on an NVIDIA GPU, with CuPy, cuBLAS and hand-written
kernels (gpu/*.cu, compiled at run time by NVRTC for the GPU's own architecture; on Hopper the
forward attention of gpu/flash_hopper.cu for sm_90a, see _hopper_module).

Same op names and signatures as the NumPy reference (the oracle); the model never branches on the
device. The kernels live one op to a file: gpu/embedding.cu, rmsnorm.cu, rope.cu, flash_attn.cu,
swiglu.cu, residual.cu, cross_entropy.cu, optim.cu (decode.cu is cuda_decode's).

Deterministic: the same inputs give the same bits on the same GPU model, every run. No kernel
adds floating-point numbers with atomics in an order that can change (the embedding backward
sums each row in one block, RMSNorm's dg goes through per-block partial rows summed in block
order, FlashAttention's dQ adds come in key-block order through counters, the norm is a fixed
tree), and cuBLAS runs with atomics not allowed on one stream (_deterministic_cublas).

Precision (`CudaBackend(precision)`):
    fp16  activations and compute weights in float16, every product on tensor cores with fp32
          accumulation (cuBLAS GemmEx, FlashAttention with mma.sync), fp32 master weights, fp32
          gradients (matmul weight gradients accumulate straight into the fp32 buffer, beta = 1).
    bf16  the same with bfloat16.
    fp32  float32 everywhere (cuBLAS SGEMM, attention through cuBLAS + softmax): the slow, exact
          path for checks.

Dimension legend as in numpy_ops: B batch, T time, S key length, C d_model, H query heads,
K kv heads, D head dim, F d_ff, V vocab, N = B*T rows.

Accumulation: every d<param> argument is an fp32 view into the flat gradient buffer and is
accumulated into (+=); activation gradients are returned fresh.

The op table's flat-buffer entries (bytemodel.ops.OPS; see docs/GPU.md), here without a host wait:
    compute_weights(flat_fp32) -> flat buffer in the compute dtype (a cast copy)
    global_norm(grads) -> 0-d fp32 device array, the L2 norm (inf/nan if any gradient is)
    adamw_step(params, grads, m, v, decay_mask, lr, beta1, beta2, eps, weight_decay, step,
               grad_scale=1.0, clip=0.0, norm=None)   one launch over the flat buffer
    fetch_async(*arrays) -> a function giving their values (pinned copies, an event)
"""
from __future__ import annotations

import math
import os

import numpy as np
import cupy as cp

try:  # where CuPy keeps its cuBLAS bindings differs between releases; either place works
    from cupy_backends.cuda.libs import cublas as _cublas
except ImportError:  # pragma: no cover
    from cupy.cuda import cublas as _cublas

from .gpu_source import DECODE_HEAD_DIMS, MACRO as _MACRO, hopper_options, module_options, source as _source

# cuBLAS / CUDA enum values (cublas_api.h, library_types.h); stable across CUDA 11-13
_OP_N, _OP_T = 0, 1
_COMPUTE_32F = 68
_R_32F, _R_16F, _R_16BF = 0, 2, 14
_GEMM_DEFAULT = -1
_ATOMICS_NOT_ALLOWED = 0

# The FlashAttention kernels of flash_attn.cu, one per head dim: head dim -> tiles.
# forward (flash_fwd_d{D}): BM query rows per CTA, BN keys per tile; backward (flash_bwd_d{D}):
# BN keys per CTA, BM queries per tile, and the query rows per dQ counter (two tiles: the ordered
# dQ reduction's unit). Chosen by benchmarks/kernels/flash_attn.py on the H200, where the other
# configurations (benchmarks/kernels/flash_variants.cu) are timed.
FLASH_FWD = {32: (128, 64), 64: (128, 64), 128: (128, 32)}
FLASH_BWD = {32: (32, 128, 64), 64: (32, 128, 64), 128: (32, 64, 64)}


# The Hopper forward (gpu/flash_hopper.cu, wgmma; compute capability 9.x only): head dim ->
# (kernel, BM query rows = 64 per warpgroup, BN keys a tile, shared-memory stages of K and V).
# Chosen by benchmarks/kernels/flash_attn.py on the H200 among the kernels of that file
# (HOPPER_FWD_KERNELS). With attention dropout the kernel of the same name + "_drop" (the same
# tiles); other head dims keep FLASH_FWD.
HOPPER_FWD_KERNELS = {
    "flash_fwd_h64_bs": (64, 128, 64, 2), "flash_fwd_h128_bs": (128, 128, 128, 2),
    # the study variants of benchmarks/kernels/flash_hopper_variants.cu
    "flash_fwd_h64_a": (64, 128, 128, 2), "flash_fwd_h64_b": (64, 128, 64, 2),
    "flash_fwd_h64_as": (64, 128, 128, 2), "flash_fwd_h64_cs": (64, 64, 64, 2),
    "flash_fwd_h64_ds": (64, 64, 64, 3), "flash_fwd_h64_es": (64, 64, 128, 3),
    "flash_fwd_h64_fs": (64, 128, 64, 3), "flash_fwd_h64_gs": (64, 128, 128, 3),
    "flash_fwd_h128_b": (128, 128, 128, 2), "flash_fwd_h128_as": (128, 128, 64, 2),
    "flash_fwd_h128_cs": (128, 64, 64, 2), "flash_fwd_h128_ds": (128, 64, 64, 3),
    "flash_fwd_h128_es": (128, 128, 64, 3),
    "flash_fwd_h64_bsp": (64, 128, 64, 2), "flash_fwd_h128_bsp": (128, 128, 128, 2),   # ping-pong
    "flash_fwd_h128_asp": (128, 128, 64, 2), "flash_fwd_h64_asp": (64, 128, 128, 2),
    "flash_fwd_h64_bsp1": (64, 128, 64, 2)}
FLASH_FWD_HOPPER = {64: "flash_fwd_h64_bs", 128: "flash_fwd_h128_bsp"}
# The Hopper forward fed by the tensor memory accelerator with a producer warp (gpu/flash_tma.cu's
# flash_fwd_w, issue 28): kernel -> (D, BM query rows = 64 per math warpgroup, BN keys a tile, stages,
# math warpgroups); 128 threads a math warpgroup + one producer warp. FLASH_FWD_TMA (head dim ->
# kernel) runs it instead of FLASH_FWD_HOPPER's wgmma forward, whose bytes it gives (the same key
# tile, the same arithmetic a row), 1.31-1.47x SDPA's speed where the wgmma forward ran 0.94-1.04x
# (H100, benchmarks/README.md, "The forward fed by the tensor memory accelerator"). Without attention
# dropout only: dropout runs the wgmma forward's _drop twins. BYTEMODEL_FWD_TMA=none runs the wgmma
# forward everywhere (=name,name: those kernels, the studies too, as if shipped).
TMA_FWD_KERNELS = {"flash_fwd_w64": (64, 128, 64, 3, 2), "flash_fwd_w64_n128": (64, 128, 128, 2, 2),
                   "flash_fwd_w64_m192": (64, 192, 128, 2, 3), "flash_fwd_w128": (128, 128, 128, 2, 2),
                   "flash_fwd_w128_n64": (128, 128, 64, 3, 2)}
# With attention dropout too (the kernels' name + "_drop", the wgmma _drop forward's mask and bytes):
# off until their GPU tests have passed (written without device time; BYTEMODEL_FWD_TMA_DROP=1 runs them)
TMA_DROP = os.environ.get("BYTEMODEL_FWD_TMA_DROP", "") == "1"
_TMA_ASKED = os.environ.get("BYTEMODEL_FWD_TMA", "")
FLASH_FWD_TMA = ({64: "flash_fwd_w64", 128: "flash_fwd_w128"} if not _TMA_ASKED else
                 {TMA_FWD_KERNELS[n][0]: n for n in _TMA_ASKED.split(",") if n in TMA_FWD_KERNELS})
# The Hopper backward (gpu/flash_hopper.cu): head dim -> (kernel, (BM queries a tile, BN keys a CTA,
# query rows per dQ counter, floats of the dQ exchange)), FLASH_BWD's meaning for the first three;
# 256 threads (two warpgroups of 64 keys). With attention dropout the kernel of the same name +
# "_drop". At D = 128 the dQ product is split by columns (MODE 256): no exchange.
FLASH_BWD_HOPPER = {64: ("flash_bwd_h64", (64, 128, 128, 64 * 64)), 128: ("flash_bwd_h128", (64, 128, 128, 0))}


def _hopper_bwd_smem(D: int, BM: int, BN: int, exchange: int) -> int:
    """Shared memory of flash_bwd_h: K, V tiles, two stages of Q and dO, dS, the dQ exchange
    (`exchange` floats: FLASH_BWD_HOPPER's; the study variants of benchmarks/kernels/flash_attn.py
    say their own), two stages of lse and delta, and the 1024 bytes that align the first tile."""
    return (2 * BN * D + 4 * BM * D + BM * BN) * 2 + exchange * 4 + 4 * BM * 4 + 1024


GRID_Y_MAX = 65535   # CUDA's limit on a grid's y dimension


def _scale_log2(D: int) -> float:
    """Attention's 1/sqrt(D) times log2(e): the kernels take scores in base 2 (exp2f)."""
    return (1.0 / math.sqrt(D)) * 1.4426950408889634

def _bf16_dtype():
    try:
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    except Exception as e:  # pragma: no cover
        raise RuntimeError("bf16 needs the ml_dtypes package next to CuPy") from e


_MODULES: dict = {}


def _module(file: str, precision: str, defines: tuple = ()):
    """file compiled for precision (once a process; CuPy keeps the binaries on disk), with -D defines."""
    key = (file, precision, defines)
    if key not in _MODULES:
        _MODULES[key] = cp.RawModule(code=_source(file), options=module_options(file, precision, defines))
    return _MODULES[key]


_HOPPER_MODULES: dict = {}

# CUtensorMap: 128 bytes passed to a kernel by value (a one-element array of this dtype is how CuPy
# passes a struct); gpu/flash_hopper.cu's TmaMap
TMA_MAP_DTYPE = np.dtype({"names": ["w"], "formats": [("<u8", (16,))]})
_ENCODE = []


def _tma_map(x, strides, rows: int, box_rows: int):
    """A tensor map of x, a (B, heads, rows, D) fp16/bf16 view with element strides `strides`
    (batch, head, row; D contiguous), for boxes of 64 columns x box_rows rows x 1 x 1 in the
    128-byte swizzle (Lay<D, 1>'s layout), rows past the end read as zeros: cuTensorMapEncodeTiled
    of the driver, through ctypes (CuPy does not wrap it). -> TMA_MAP_DTYPE, shape (1,)."""
    import ctypes
    if not _ENCODE:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        _ENCODE.append(fn)
    B, Hh, _, D = x.shape
    isz = x.dtype.itemsize
    raw = ctypes.create_string_buffer(128 + 64)
    at = (ctypes.addressof(raw) + 63) & ~63                     # CUtensorMap is 64-byte aligned
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    dims = (u64 * 4)(D, rows, Hh, B)
    st = (u64 * 3)(*(int(v) * isz for v in (strides[2], strides[1], strides[0])))   # row, head, batch bytes
    box = (u32 * 4)(64, box_rows, 1, 1)
    one = (u32 * 4)(1, 1, 1, 1)
    dtype = 9 if x.dtype.name == "bfloat16" else 6               # CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 / FLOAT16
    # interleave none (0), 128-byte swizzle (3), L2 promotion 128 bytes (2), out of bounds: zeros (0)
    r = _ENCODE[0](ctypes.c_void_p(at), ctypes.c_int(dtype), u32(4), ctypes.c_void_p(int(x.data.ptr)),
                   dims, st, box, one, ctypes.c_int(0), ctypes.c_int(3), ctypes.c_int(2), ctypes.c_int(0))
    if r != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({r}) for shape {x.shape}, strides {strides}")
    return np.frombuffer(ctypes.string_at(at, 128), dtype=np.uint64).copy().view(TMA_MAP_DTYPE)


def _hopper_module(precision: str, extra: str = ""):
    """gpu/flash_hopper.cu and gpu/flash_tma.cu after it (+ `extra` source: the benchmarks' variants) compiled by NVRTC for
    sm_90a (wgmma needs the architecture-specific target, which CuPy's own compile path cannot
    name) and loaded from the cubin. The cubin is kept in CuPy's kernel cache directory
    (CUPY_CACHE_DIR, else ~/.cupy/kernel_cache) under the hash of the source, the options and
    NVRTC's version, written atomically, so only a process's first use of a new source compiles."""
    key = (precision, extra)
    if key not in _HOPPER_MODULES:
        import hashlib
        from cupy._core.core import assemble_cupy_compiler_options
        from cupy_backends.cuda.libs import nvrtc
        from .gpu_source import tma_source
        src = _source("flash_hopper.cu") + tma_source() + extra   # the TMA forward after the wgmma kernels
        opts = assemble_cupy_compiler_options(hopper_options(precision))
        tag = hashlib.sha256(repr((src, opts, nvrtc.getVersion())).encode()).hexdigest()[:32]
        cache = os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser(os.path.join("~", ".cupy", "kernel_cache"))
        path = os.path.join(cache, f"bytemodel_flash_hopper_{tag}.cubin")
        if not os.path.exists(path):
            prog = nvrtc.createProgram(src, "flash_hopper.cu", (), ())
            try:
                try:
                    nvrtc.compileProgram(prog, opts)
                except nvrtc.NVRTCError as e:
                    raise RuntimeError(f"flash_hopper.cu did not compile: {e}\n{nvrtc.getProgramLog(prog)}") from None
                cubin = nvrtc.getCUBIN(prog)
            finally:
                nvrtc.destroyProgram(prog)
            os.makedirs(cache, exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(cubin)
            os.replace(tmp, path)
        mod = cp.RawModule(path=path)
        mod.get_function(FLASH_FWD_HOPPER[64])   # loads the module now
        _HOPPER_MODULES[key] = mod
    return _HOPPER_MODULES[key]


def _attn_drop(drop, B, H, T, S):
    """attention_forward/backward's drop = (p, key, offset) -> the flash kernels' dropout arguments
    (offset, k0, k1, threshold, scale) as a tuple of host scalars, or None without dropout (None,
    p = 0). The reference's checks first (numpy_ops.attn_drop_threshold: p's range, the counter)."""
    from .numpy_ops import attn_drop_threshold, attn_dropped
    if not attn_dropped(drop):
        return None
    thr, scale = attn_drop_threshold(drop, B, H, T, S)
    p, key, offset = drop
    return int(offset), np.uint32(key[0]), np.uint32(key[1]), np.uint32(thr), _f32(scale)


def _i32(x):
    return np.int32(x)


def _i64(x):
    return np.int64(x)


def _f32(x):
    return np.float32(x)


def _ptr(a):
    """A device array as a kernel argument, or a null pointer for None (an optional input)."""
    return np.uint64(0) if a is None else a


def _blocks(total: int, per: int = 256, cap: int = 132 * 16) -> int:
    return max(1, min(cap, (total + per - 1) // per))


class CudaBackend:
    """The GPU twin of numpy_ops, for one precision."""

    name = "cuda"
    xp = cp
    cpu_threads = False  # one device runs the whole batch

    def __init__(self, precision: str = "fp16", flash: bool = True, hopper: bool | None = None):
        if precision not in _MACRO:
            raise ValueError(f"unknown precision {precision!r}")
        self.precision = precision
        if precision == "fp16":
            self.act_dtype = np.dtype(np.float16)
        elif precision == "fp32":
            self.act_dtype = np.dtype(np.float32)
        else:
            self.act_dtype = _bf16_dtype()
        self._ctype = {"fp16": _R_16F, "bf16": _R_16BF, "fp32": _R_32F}[precision]
        self.flash = flash and precision != "fp32"
        self.decode_attention = self.flash   # attention_decode's kernel (fp32 keeps the reference path)
        # the wgmma forward (gpu/flash_hopper.cu) on compute capability 9.x; hopper=False (or
        # BYTEMODEL_HOPPER=0 in the environment) keeps the FlashAttention-2 kernels everywhere
        if hopper is None:
            hopper = (int(cp.cuda.Device().compute_capability) // 10 == 9
                      and os.environ.get("BYTEMODEL_HOPPER", "1") != "0")
        self.hopper = self.flash and bool(hopper)
        self.tma = True        # the TMA forward where FLASH_FWD_TMA has one (off, said once, if it cannot run)
        self._positions = None               # 0, 1, 2, ... on the device: attention_decode's key counts
        self._fns: dict = {}
        self._alpha = np.ones(1, dtype=np.float32)
        self._beta0 = np.zeros(1, dtype=np.float32)
        self._beta1 = np.ones(1, dtype=np.float32)
        self._cw = None                 # compute-dtype copy of the master weights
        self._cw_fresh = None           # data pointer of the params adamw_step last cast into _cw
        self._norm_partial = None
        self._bufs: dict = {}           # _scratch buffers (the RMSNorm backward's dg partials)
        self.sm_count = cp.cuda.Device().attributes["MultiProcessorCount"]
        self._det_handle = None
        self._deterministic_cublas(cp.cuda.device.get_cublas_handle())

    # ------------------------------------------------------------------ plumbing
    def _fn(self, name: str, file: str):
        """Kernel `name` of gpu/`file` (one file per op: the file names are the op table)."""
        if (file, name) not in self._fns:
            self._fns[file, name] = _module(file, self.precision).get_function(name)
        return self._fns[file, name]

    def _scratch(self, key: str, n: int, dtype):
        """A reusable device buffer of at least n elements (n of them returned), one per key."""
        buf = self._bufs.get(key)
        if buf is None or buf.size < n:
            buf = self._bufs[key] = cp.empty((max(n, 1),), dtype=dtype)
        return buf[:n]

    def asarray(self, a, dtype=None):
        return cp.asarray(a, dtype=dtype)

    def to_numpy(self, a):
        return cp.asnumpy(a)

    def describe(self) -> dict:
        """What computes here: device, precision, the GPU and the CuPy version."""
        dev = cp.cuda.Device()
        name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"]
        get_mode = getattr(_cublas, "getAtomicsMode", None)
        handle = cp.cuda.device.get_cublas_handle()
        return {"device": "cuda", "precision": self.precision,
                "gpu": name.decode() if isinstance(name, bytes) else str(name),
                "sm_count": int(dev.attributes["MultiProcessorCount"]), "cupy": cp.__version__,
                "cublas_atomics": None if get_mode is None else int(get_mode(handle))}

    def activation_dtype(self, master_dtype):
        """The dtype activations are computed in: the precision's (fp16, bf16, fp32)."""
        return self.act_dtype

    def _act(self, a):
        """A C-contiguous array of the activation dtype."""
        if type(a) is cp.ndarray and a.dtype == self.act_dtype and a.flags.c_contiguous:
            return a                        # the common case, kept cheap: ops are launch-bound
        a = cp.asarray(a)
        if a.dtype != self.act_dtype:
            a = a.astype(self.act_dtype)
        return cp.ascontiguousarray(a)

    def _empty(self, shape, dtype=None):
        return cp.empty(shape, dtype=dtype or self.act_dtype)

    def compute_weights(self, flat):
        """flat fp32 master buffer (P,) -> the compute-dtype copy (P,), refreshed each call
        unless adamw_step wrote it already."""
        if self.precision == "fp32" and flat.dtype == np.float32:
            return flat
        n = flat.shape[0]
        if self._cw is None or self._cw.shape[0] != n:
            self._cw = self._empty((n,))
            self._cw_fresh = None
        if self._cw_fresh != flat.data.ptr:     # not written by the last adamw_step
            self._fn("cast_f32_act", "optim.cu")((_blocks(n // 4),), (256,),
                                      (cp.ascontiguousarray(flat, dtype=cp.float32), self._cw, _i64(n)))
        self._cw_fresh = None                   # cast again next time unless a step writes it
        return self._cw

    # ------------------------------------------------------------------ cuBLAS
    def _deterministic_cublas(self, handle):
        """cuBLAS without atomics (CUBLAS_ATOMICS_NOT_ALLOWED), on every handle this backend
        multiplies through. cuBLAS promises the same bits at every run on GPUs of one
        architecture and SM count for one toolkit version, with one stream active and atomics
        not allowed; its split-K GEMMs then reduce through a workspace in a fixed order.
        Training issues everything on one stream. NOT_ALLOWED is cuBLAS's default and nothing
        here changes it; where CuPy exposes cublasSetAtomicsMode (14.2 does not) it is also set
        explicitly."""
        if handle == self._det_handle:
            return
        set_mode = getattr(_cublas, "setAtomicsMode", None)
        if set_mode is not None:
            set_mode(handle, _ATOMICS_NOT_ALLOWED)
        self._det_handle = handle

    @staticmethod
    def _desc(x):
        """2-D array -> (row_major, ld) in elements, or None if neither layout."""
        r, c = x.shape
        isz = x.itemsize
        s0, s1 = x.strides
        if s1 == isz or c == 1:
            if r == 1 or s0 % isz == 0 and s0 // isz >= c:
                return True, max(s0 // isz if r > 1 else c, 1)
        if s0 == isz or r == 1:
            if c == 1 or s1 % isz == 0 and s1 // isz >= r:
                return False, max(s1 // isz if c > 1 else r, 1)
        return None

    def _gemm(self, a, b, c, beta: float = 0.0):
        """c (M, N) = a (M, K) @ b (K, N) + beta * c, with fp32 accumulation. a, b, c may be
        row- or column-major (a transposed view is free); inputs of another layout are copied."""
        M, K = a.shape
        N = b.shape[1]
        assert b.shape[0] == K and c.shape == (M, N), (a.shape, b.shape, c.shape)
        if M == 0 or N == 0:
            return c
        if K == 0:
            c *= beta
            return c
        da, db, dc = self._desc(a), self._desc(b), self._desc(c)
        if da is None:
            a = cp.ascontiguousarray(a); da = self._desc(a)
        if db is None:
            b = cp.ascontiguousarray(b); db = self._desc(b)
        if dc is None:
            raise ValueError("gemm output must be row- or column-major")
        (ra, lda), (rb, ldb), (rc, ldc) = da, db, dc
        if rc:   # C^T (N x M) = B^T A^T in column-major terms
            m, n = N, M
            first, f_op, f_ld, f_t = b, (_OP_N if rb else _OP_T), ldb, b.dtype
            second, s_op, s_ld, s_t = a, (_OP_N if ra else _OP_T), lda, a.dtype
        else:    # C (M x N) = A B
            m, n = M, N
            first, f_op, f_ld, f_t = a, (_OP_T if ra else _OP_N), lda, a.dtype
            second, s_op, s_ld, s_t = b, (_OP_T if rb else _OP_N), ldb, b.dtype
        handle = cp.cuda.device.get_cublas_handle()
        self._deterministic_cublas(handle)
        _cublas.setPointerMode(handle, 0)
        beta_p = self._beta1 if beta == 1.0 else (self._beta0 if beta == 0.0 else
                                                  np.full(1, beta, dtype=np.float32))
        _cublas.gemmEx(handle, f_op, s_op, m, n, K,
                       self._alpha.ctypes.data, first.data.ptr, self._dt(f_t), f_ld,
                       second.data.ptr, self._dt(s_t), s_ld,
                       beta_p.ctypes.data, c.data.ptr, self._dt(c.dtype), ldc,
                       _COMPUTE_32F, _GEMM_DEFAULT)
        return c

    def _dt(self, dtype):
        if dtype == np.float32:
            return _R_32F
        if dtype == np.float16:
            return _R_16F
        if dtype == self.act_dtype:
            return self._ctype
        raise TypeError(f"gemm dtype {dtype} not supported")

    # ------------------------------------------------------------------ embedding
    def embedding_forward(self, wte, idx):
        """wte (V, C), idx (B, T) int -> out (B, T, C), cache (idx as int32)."""
        idx = cp.ascontiguousarray(cp.asarray(idx), dtype=cp.int32)
        B, T = idx.shape
        C = wte.shape[1]
        out = self._empty((B, T, C))
        self._fn("embedding_fwd", "embedding.cu")((_blocks(B * T * C),), (256,),
                                  (self._act(wte), idx, out, _i64(B * T), _i32(C)))
        return out, idx

    def embedding_backward(self, dout, cache, dwte):
        """dout (B, T, C); dwte (V, C) fp32 += the sum of the dout rows at each id.

        Deterministic: each vocabulary row is summed by one block, its positions in increasing
        order, no atomics. V <= 8192 and C % 8 == 0 (every preset): a block per row scans the ids
        (embedding_bwd_rows); otherwise the positions are sorted by id first (CuPy's argsort,
        a radix sort: the same order every run) and a thread per (row, column) sums its slice."""
        idx = cache
        C = dout.shape[-1]
        n = idx.size
        assert dwte.flags.c_contiguous and dwte.dtype == np.float32
        V = dwte.shape[0]
        if C % 8 == 0 and C <= 8 * 1024 and V <= 8192:
            threads = max(256, min(1024, (C // 8 + 31) // 32 * 32))
            self._fn("embedding_bwd_rows", "embedding.cu")((V,), (threads,),
                                                           (self._act(dout), idx, dwte, _i64(n), _i32(C)))
            return
        flat = idx.reshape(-1)
        order = cp.argsort(flat).astype(cp.int32)                     # (n,) positions by id
        starts = cp.searchsorted(flat[order], cp.arange(V + 1, dtype=cp.int32)).astype(cp.int32)
        threads = min(256, (C + 31) // 32 * 32)
        self._fn("embedding_bwd_sorted", "embedding.cu")((V, (C + threads - 1) // threads), (threads,),
                                                         (self._act(dout), order, starts, dwte, _i32(C)))

    # ------------------------------------------------------------------ RMSNorm
    def rmsnorm_forward(self, x, g, eps):
        """x (N, C), g (C,) -> out (N, C), cache (x, rstd (N,) fp32, g)."""
        x = self._act(x)
        g = self._act(g)
        N, C = x.shape
        out = self._empty((N, C))
        rstd = cp.empty((N,), dtype=cp.float32)
        name = "rmsnorm_fwd_v8" if C % 8 == 0 else "rmsnorm_fwd"
        self._fn(name, "rmsnorm.cu")(((N + 7) // 8,), (256,), (x, g, out, rstd, _i64(N), _i32(C), _f32(eps)))
        return out, (x, rstd, g)

    def rmsnorm_backward(self, dout, cache, dg, residual=None, drop=None):
        """dout (N, C) -> dx (N, C); dg (C,) fp32 += sum over rows of dout * xhat.

        With `residual` (N, C) the result is residual + dx, in the same pass (the residual
        stream's gradient), as in numpy_ops. With `drop` (a dropout_forward cache) the result is
        (dx, dropout_backward(dx, drop)): the residual branch's gradient written in the same pass
        where the register kernel runs (every preset's width), the same bits as the two calls."""
        x, rstd, g = cache
        dout = self._act(dout)
        res = np.uint64(0) if residual is None else self._act(residual)
        N, C = x.shape
        dx = self._empty((N, C))
        assert dg.flags.c_contiguous and dg.dtype == np.float32
        rpb = 64                     # rows per block: one partial dg row per 64 rows
        nblk = (N + rpb - 1) // rpb
        partial = self._scratch("rmsnorm_dg", nblk * C, cp.float32)   # (nblk, C)
        ddx = None
        if C % 8 == 0 and C <= 1024:  # dg partials in registers (every preset's width)
            if drop is not None and int(drop[0]) % 4 == 0:
                ddx = self._empty((N, C))
            dargs = (_i64(0), np.uint32(0), np.uint32(0), np.uint32(0), _f32(0.0)) if ddx is None else drop
            self._fn(f"rmsnorm_bwd_r{(C + 255) // 256}", "rmsnorm.cu")(
                (nblk,), (256,), (dout, x, rstd, g, dx, partial, _i64(N), _i32(C), _i32(rpb), res,
                                  np.uint64(0) if ddx is None else ddx) + tuple(dargs),
                shared_mem=8 * 4 * C)
        else:                         # any other width: dx, then the partials column by column
            self._fn("rmsnorm_bwd", "rmsnorm.cu")(
                (nblk,), (256,), (dout, x, rstd, g, dx, _i64(N), _i32(C), _i32(rpb), res))
            self._fn("rmsnorm_dg_part", "rmsnorm.cu")(
                (nblk, (C + 255) // 256), (256,), (dout, x, rstd, partial, _i64(N), _i32(C), _i32(rpb)))
        self._fn("rmsnorm_dg_reduce", "rmsnorm.cu")(((C + 31) // 32,), (256,), (partial, _i32(nblk), _i32(C), dg))
        if drop is None:
            return dx
        return dx, (ddx if ddx is not None else self.dropout_backward(dx, drop))

    # ------------------------------------------------------------------ matmul (cuBLAS)
    def matmul_forward(self, x, w):
        """x (N, Cin), w (Cin, Cout) -> out (N, Cout)."""
        x = cp.asarray(x)
        out = self._empty((x.shape[0], w.shape[1]))
        return self._gemm(x, w, out)

    def matmul_backward(self, dout, x, w, dw):
        """dout (N, Cout) -> dx (N, Cin); dw (Cin, Cout) fp32 += x^T @ dout (beta = 1)."""
        self._gemm(x.T, dout, dw, beta=1.0)
        dx = self._empty((dout.shape[0], w.shape[0]))
        return self._gemm(dout, w.T, dx)

    # ------------------------------------------------------------------ qkv split + RoPE
    def qkv_rope_forward(self, qkv, cos, sin, B, T, H, K):
        """qkv (B*T, (H + 2K) * D) -> q (B, H, T, D), k, v (B, K, T, D); rope on q, k."""
        qkv = self._act(qkv)
        cos, sin = self._act(cos), self._act(sin)
        D = qkv.shape[-1] // (H + 2 * K)
        if D % 16 == 0:
            # rotate q and k into one new (B*T, (H+K)*D) buffer and leave v in qkv: q, k, v are
            # strided (B, heads, T, D) views, which the attention kernels take as they are
            qk = self._empty((B * T, (H + K) * D))
            total = B * T * (H + K) * (D // 16)
            self._fn("rope_qk_fwd_v8", "rope.cu")((_blocks(total),), (256,),
                                       (qkv, cos, sin, qk, _i32(B), _i32(T), _i32(H), _i32(K), _i32(D)))
            qk4 = qk.reshape(B, T, H + K, D)
            q = qk4[:, :, :H].transpose(0, 2, 1, 3)
            k = qk4[:, :, H:].transpose(0, 2, 1, 3)
            v = qkv.reshape(B, T, H + 2 * K, D)[:, :, H + K:].transpose(0, 2, 1, 3)
            return q, k, v
        q = self._empty((B, H, T, D))
        k = self._empty((B, K, T, D))
        v = self._empty((B, K, T, D))
        vw = 2 if D % 4 == 0 else 1    # elements per thread and half (D % 16 == 0 went above)
        total = B * T * (H + 2 * K) * (D // 2 // vw)
        self._fn({2: "qkv_rope_fwd_v2", 1: "qkv_rope_fwd"}[vw], "rope.cu")(
            (_blocks(total),), (256,),
            (qkv, cos, sin, q, k, v, _i32(B), _i32(T), _i32(H), _i32(K), _i32(D)))
        return q, k, v

    def qkv_rope_backward(self, dq, dk, dv, cos, sin):
        """dq (B, H, T, D), dk/dv (B, K, T, D) -> dqkv (B*T, (H + 2K) * D).
        dq may be fp32 (the flash backward's accumulator): read as it is, no cast pass."""
        B, H, T, D = dq.shape
        K = dk.shape[1]
        cos, sin = self._act(cos), self._act(sin)
        if dq.dtype == np.float32 and self.act_dtype != np.float32 and D % 16 == 0:
            dq = cp.ascontiguousarray(dq)
            dk, dv = self._act(dk), self._act(dv)
            dqkv = self._empty((B * T, (H + 2 * K) * D))
            total = B * T * (H + 2 * K) * (D // 16)
            self._fn("qkv_rope_bwd_v8_f32q", "rope.cu")((_blocks(total),), (256,),
                                             (dq, dk, dv, cos, sin, dqkv, _i32(B), _i32(T), _i32(H),
                                              _i32(K), _i32(D)))
            return dqkv
        dq, dk, dv = self._act(dq), self._act(dk), self._act(dv)
        dqkv = self._empty((B * T, (H + 2 * K) * D))
        vw = 8 if D % 16 == 0 else (2 if D % 4 == 0 else 1)    # elements per thread and half
        total = B * T * (H + 2 * K) * (D // 2 // vw)
        self._fn({8: "qkv_rope_bwd_v8", 2: "qkv_rope_bwd_v2", 1: "qkv_rope_bwd"}[vw], "rope.cu")(
            (_blocks(total),), (256,),
            (dq, dk, dv, cos, sin, dqkv, _i32(B), _i32(T), _i32(H), _i32(K), _i32(D)))
        return dqkv

    def add(self, a, b):
        """a + b (the residual stream), one vectorised pass; same shapes, activation dtype.
        (A hook: the model may call ops.add where it has `x + y`.)"""
        if a.dtype != self.act_dtype or b.dtype != self.act_dtype or a.shape != b.shape or a.size % 8:
            return a + b
        a, b = cp.ascontiguousarray(a), cp.ascontiguousarray(b)
        out = self._empty(a.shape)
        n8 = a.size // 8
        self._fn("add_v8", "residual.cu")((_blocks(n8),), (256,), (a, b, out, _i64(n8)))
        return out

    def dropout_forward(self, x, p, key, offset=0, residual=None):
        """x (N, C) -> [residual +] dropout(x) (N, C), cache: the mask's rule, no mask (gpu/dropout.cu
        draws it again in the backward pass; numpy_ops has the rule and the shapes)."""
        from .numpy_ops import dropout_keep, dropout_threshold
        dropout_keep(0, key, offset + x.size, p)            # the reference's checks on p and the counter
        thr, scale = dropout_threshold(p)
        cache = (_i64(offset), np.uint32(key[0]), np.uint32(key[1]), np.uint32(thr), _f32(scale))
        return self._dropout(x, residual, cache), cache

    def dropout_backward(self, dout, cache):
        """dout (N, C) -> dx (N, C) = dropout(dout), the forward's mask drawn again."""
        return self._dropout(dout, None, cache)

    def _dropout(self, x, res, cache):
        x = self._act(x)
        out = self._empty(x.shape)
        vw = 8 if x.size % 8 == 0 and int(cache[0]) % 4 == 0 else 1
        args = (x,) if res is None else (x, self._act(res))
        self._fn(f"dropout_{'mul' if res is None else 'res'}_v{vw}", "dropout.cu")(
            (_blocks(x.size // vw),), (256,), (*args, out, _i64(x.size)) + cache)
        return out

    def merge_heads_forward(self, a):
        """a (B, H, T, D) -> (B*T, H*D). Free when a is a (B, T, H, D) buffer seen as
        (B, H, T, D), which is how the flash forward returns its output."""
        B, H, T, D = a.shape
        t = a.transpose(0, 2, 1, 3)
        if not t.flags.c_contiguous:
            t = cp.ascontiguousarray(t)
        return t.reshape(B * T, H * D)

    def merge_heads_backward(self, dout, B, H, T, D):
        """dout (B*T, H*D) -> da (B, H, T, D), a strided view (no copy): the attention kernels
        take (batch, head, row) strides."""
        return dout.reshape(B, T, H, D).transpose(0, 2, 1, 3)

    # ------------------------------------------------------------------ attention
    def _flash_ok(self, q, k):
        D = q.shape[-1]
        return self.flash and D in FLASH_FWD and q.dtype == self.act_dtype and k.dtype == self.act_dtype

    def _flash_kernel(self, kind: str, D: int, drop: bool = False):
        """(kernel, tiles) of the FlashAttention kernel for "fwd" (BM, BN) or "bwd" (BM, BN, rows per dQ counter);
        drop: its twin with attention dropout (flash_{kind}_d{D}_drop, the same tiles).
        (benchmarks/kernels/flash_attn.py overrides it to time the variants kept for study.)"""
        tiles = FLASH_FWD[D] if kind == "fwd" else FLASH_BWD[D]
        return self._fn(f"flash_{kind}_d{D}{'_drop' if drop else ''}", "flash_attn.cu"), tiles

    @staticmethod
    def _strides(x):
        """(batch, head, row) strides in elements of a (B, H, T, D) array with unit last stride,
        16-byte aligned rows; None if it must be copied first."""
        isz = x.itemsize
        s = x.strides
        if s[3] != isz or any(v % 16 for v in s[:3]) or x.data.ptr % 16:
            return None
        return tuple(_i64(v // isz) for v in s[:3])

    def _bhtd(self, x):
        st = self._strides(x)
        if st is None:
            x = cp.ascontiguousarray(x)
            st = self._strides(x)
        return x, st

    def attention_forward(self, q, k, v, block=None, drop=None):
        """q (B, H, T, D), k/v (B, K, S, D) -> out (B, H, T, D), lse (B, H, T) fp32 (natural log).

        FlashAttention-2 on tensor cores (fp16/bf16, D in {32, 64, 128}); on Hopper (self.hopper)
        at D in {64, 128}, the wgmma forward of gpu/flash_hopper.cu (the same contract, dropout
        too); otherwise cuBLAS + softmax.
        The flash output is a (B, T, H, D) buffer viewed as (B, H, T, D), so merge_heads is free.
        drop (training only): (p, key, offset), numpy_ops.attention_forward's: the probabilities
        dropped after the softmax (the row sum and lse stay P's), the mask of numpy_ops.attn_keep
        drawn inside the kernel (flash_fwd_d*_drop, flash_fwd_h*_drop), bit for bit the reference's.
        """
        B, H, T, D = q.shape
        K, S = k.shape[1], k.shape[2]
        dr = _attn_drop(drop, B, H, T, S)
        if not self._flash_ok(q, k):
            return self._attention_forward_ref(q, k, v, drop if dr else None)
        q, qs = self._bhtd(q)
        k, ks = self._bhtd(k)
        v, vs = self._bhtd(v)
        obuf = self._empty((B, T, H, D))
        out = obuf.transpose(0, 2, 1, 3)
        os_ = self._strides(out)
        lse = cp.empty((B, H, T), dtype=cp.float32)
        if self.hopper and self.tma and (dr is None or TMA_DROP) and D in FLASH_FWD_TMA:
            try:   # the tensor maps are made before anything is launched: a refusal launches nothing
                self._attention_forward_tma(self._tma_kernel(FLASH_FWD_TMA[D], drop=dr is not None),
                                            q, qs, k, ks, v, vs, out, os_, lse, dr)
                return out, lse
            except (ImportError, AttributeError, OSError, RuntimeError, cp.cuda.driver.CUDADriverError) as e:
                import sys
                why = (str(e).splitlines() or [type(e).__name__])[0][:200]
                print(f"warning: the TMA attention forward is unavailable ({why}); using the wgmma forward",
                      file=sys.stderr)
                self.tma = False
        hop = None
        if self.hopper and D in FLASH_FWD_HOPPER:
            hop = self._hopper_or_none(lambda: self._hopper_kernel(D, drop=dr is not None))
        if hop is not None:
            fn, (BM, BN, stages) = hop
            smem, threads = (BM * D + 2 * stages * BN * D) * 2 + 1024, 2 * BM   # + the 1024-byte alignment
        else:
            fn, (BM, BN) = self._flash_kernel("fwd", D, dr is not None)
            smem, threads = (BM * (D + 8) + 4 * BN * (D + 8)) * 2, 128
        if fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem
        scale_log2 = _scale_log2(D)
        nb = max(1, GRID_Y_MAX // H)   # grid y is (batch, head): at most 65535, so many streams go in slices
        for b0 in range(0, B, nb):
            b1 = min(B, b0 + nb)
            # the slice's first element in the mask's counter: batch row b0
            extra = () if dr is None else (_i64(dr[0] + b0 * H * T * S),) + dr[1:]
            fn(((T + BM - 1) // BM, (b1 - b0) * H), (threads,),
               (q[b0:b1], k[b0:b1], v[b0:b1], out[b0:b1], lse[b0:b1], _i32(H), _i32(K), _i32(T), _i32(S),
                *qs, *ks, *vs, *os_, _f32(scale_log2)) + extra, shared_mem=smem)
        return out, lse

    def _tma_kernel(self, name: str, drop: bool = False):
        """A forward of gpu/flash_tma.cu (flash_fwd_w, TMA_FWD_KERNELS; in the Hopper module after
        gpu/flash_hopper.cu, whose helpers it uses) and its tiles; drop: its twin with attention dropout."""
        fname = name + ("_drop" if drop else "")
        key = ("flash_hopper.cu", fname)
        if key not in self._fns:
            self._fns[key] = _hopper_module(self.precision).get_function(fname)
        return self._fns[key], TMA_FWD_KERNELS[name]

    def _attention_forward_tma(self, kernel, q, qs, k, ks, v, vs, out, os_, lse, dr=None):
        """attention_forward through a TMA-fed forward (flash_fwd_w): the tensor maps of q, k and v
        made here (each names the whole tensor; a launch in slices of the batch passes its first
        batch row), the same outputs as the wgmma forward. dr: _attn_drop's arguments (the _drop
        twin), the mask's counter moved to each slice's first batch row as attention_forward's."""
        fn, (D, BM, BN, stages, cw) = kernel
        B, H, T, _ = q.shape
        K, S = k.shape[1], k.shape[2]
        mq, mk, mv = _tma_map(q, qs, T, BM), _tma_map(k, ks, S, BN), _tma_map(v, vs, S, BN)
        smem = (BM * D + 2 * stages * BN * D) * 2 + 8 * (1 + 2 * stages) + 1024
        if fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem
        nb = max(1, GRID_Y_MAX // H)
        for b0 in range(0, B, nb):
            b1 = min(B, b0 + nb)
            extra = () if dr is None else (_i64(dr[0] + b0 * H * T * S),) + dr[1:]
            fn(((T + BM - 1) // BM, (b1 - b0) * H), (128 * cw + 32,),
               (mq, mk, mv, out, lse, _i32(H), _i32(K), _i32(T), _i32(S), _i32(b0), *os_,
                _f32(_scale_log2(D))) + extra, shared_mem=smem)

    def _hopper_or_none(self, get):
        """get() -> a Hopper kernel and its tiles; None, said once, where the sm_90a module cannot
        be had (a CuPy without the NVRTC entry points used, or an NVRTC that cannot build
        sm_90a): the caller runs FlashAttention-2 (the same contract), from then on."""
        try:
            return get()
        except (ImportError, AttributeError, RuntimeError, cp.cuda.driver.CUDADriverError) as e:
            import sys
            why = (str(e).splitlines() or [type(e).__name__])[0][:200]
            print(f"warning: the Hopper attention kernels are unavailable ({why}); "
                  "using FlashAttention-2", file=sys.stderr)
            self.hopper = False
            return None

    def _hopper_bwd_kernel(self, D: int, drop: bool = False):
        """The wgmma backward for head dim D (drop: its twin with attention dropout) and its
        (BM, BN, rows per dQ counter, floats of its dQ exchange).
        (benchmarks/kernels/flash_attn.py overrides it to time FA2's in its place.)"""
        name, tiles = FLASH_BWD_HOPPER[D]
        name += "_drop" if drop else ""
        key = ("flash_hopper.cu", name)
        if key not in self._fns:
            self._fns[key] = _hopper_module(self.precision).get_function(name)
        return self._fns[key], tiles

    def _hopper_kernel(self, D: int, name: str | None = None, drop: bool = False):
        """The wgmma forward for head dim D (or the kernel `name`; drop: its twin with attention
        dropout) and its (BM, BN, stages).
        (benchmarks/kernels/flash_attn.py overrides it to time the others.)"""
        name = name or FLASH_FWD_HOPPER[D]
        fname = name + ("_drop" if drop else "")
        key = ("flash_hopper.cu", fname)
        if key not in self._fns:
            self._fns[key] = _hopper_module(self.precision).get_function(fname)
        return self._fns[key], HOPPER_FWD_KERNELS[name][1:]

    def attention_decode(self, q, kc, vc, n):
        """q (B, H, 1, D); kc/vc (B, K, S, D) cache buffers, keys 0..n-1 filled -> out (B, H, 1, D).

        The decode kernel of gpu/decode.cu (one block of 4 warps per (sequence, head), keys read
        as 16-byte vectors, fp32 online softmax; no split of the keys, so no atomics and the same
        bits on every run) instead of FlashAttention, whose 64-row query tiles a step fills one
        row of. Other shapes go through attention_forward on the first n keys.
        """
        B, H, T, D = q.shape
        K, S = kc.shape[1], kc.shape[2]
        if (not self.decode_attention or T != 1 or D not in DECODE_HEAD_DIMS or not 1 <= n <= S
                or kc.dtype != self.act_dtype or not kc.flags.c_contiguous or not vc.flags.c_contiguous):
            return self.attention_forward(q, kc[:, :, :n], vc[:, :, :n])[0]
        qf = cp.ascontiguousarray(q[:, :, 0], dtype=cp.float32).reshape(B * H, D)
        if self._positions is None or self._positions.size < S:
            self._positions = cp.arange(max(S, 4096), dtype=cp.int32)
        state = self._positions[n - 1:]      # the kernel reads state[0] + 1 keys; no copy from the host
        att = cp.empty((B * H, D), dtype=cp.float32)
        fn = self._fn(f"dec_attn_d{D}", "decode.cu")
        scale_log2 = _scale_log2(D)
        fn((B * H, 1), (128,), (qf, kc, vc, att, att, att, state, _i32(H), _i32(K), _i32(S), _i32(S),
                                _f32(scale_log2)))   # one split: `part` and `tickets` are not touched
        return att.astype(self.act_dtype).reshape(B, H, 1, D)

    def attention_backward(self, dout, q, k, v, out, lse, block=None, drop=None):
        """dout (B, H, T, D) -> dq (B, H, T, D), dk (B, K, S, D), dv (B, K, S, D).
        On the flash path dq is fp32 (the kernel's scaled accumulator; qkv_rope_backward reads it
        as it is, with no cast pass), dk and dv the activation dtype. drop: the forward's; its mask
        drawn again in flash_bwd_d*_drop / flash_bwd_h*_drop (dV from P Z, dS = P (Z dP - delta), delta = rowsum(dO O)
        of the dropped O, as numpy_ops.attention_backward)."""
        B, H, T, D = q.shape
        K, S = k.shape[1], k.shape[2]
        dr = _attn_drop(drop, B, H, T, S)
        if not self._flash_ok(q, k):
            return self._attention_backward_ref(dout, q, k, v, out, lse, drop if dr else None)
        q, qs = self._bhtd(q)
        k, ks = self._bhtd(k)
        v, vs = self._bhtd(v)
        dout, ds = self._bhtd(self._act(dout) if dout.dtype != self.act_dtype else dout)
        out, os_ = self._bhtd(out)
        lse = cp.ascontiguousarray(lse, dtype=cp.float32)
        hop = None
        if self.hopper and D in FLASH_BWD_HOPPER:
            hop = self._hopper_or_none(lambda: self._hopper_bwd_kernel(D, drop=dr is not None))
        if hop is not None:
            fn, (BM, BN, RC, exchange) = hop
            smem, threads = _hopper_bwd_smem(D, BM, BN, exchange), 2 * BN   # a warpgroup per 64 keys
        else:
            fn, (BM, BN, RC) = self._flash_kernel("bwd", D, dr is not None)
            SD = D + 8
            smem, threads = (2 * BN * SD + 4 * BM * SD + BN * (BM + 8)) * 2 + 4 * BM * 4, 128
        rows = B * H * T
        delta = cp.empty((rows,), dtype=cp.float32)
        dq_acc = cp.empty((B, H, T, D), dtype=cp.float32)
        # the ordered dQ reduction's counters, one per (b, h, RC query rows), then a CTA ticket
        dq_sem = cp.empty((B * H * ((T + RC - 1) // RC) + 1,), dtype=cp.int32)
        self._fn("flash_bwd_pre", "flash_attn.cu")(
            ((rows + 7) // 8,), (256,),
            (dout, out, delta, dq_acc, dq_sem, _i32(RC), _i32(H), _i32(T), _i32(D), *ds, *os_, _i64(rows)))
        dk = self._empty((B, K, S, D))
        dv = self._empty((B, K, S, D))
        nkb = (S + BN - 1) // BN
        # a group's key blocks heaviest first while they surely fit on the GPU at once (one CTA
        # per SM); else lightest first, where no block waits on one that started after it
        heavy_first = nkb <= self.sm_count
        if fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem
        scale = 1.0 / math.sqrt(D)
        fn((nkb, B * K), (threads,),
           (q, k, v, dout, lse, delta, dq_acc, dq_sem, dk, dv, _i32(H), _i32(K), _i32(T), _i32(S),
            *qs, *ks, *vs, *ds, _f32(scale), _f32(scale * 1.4426950408889634), _i32(heavy_first))
           + (() if dr is None else (_i64(dr[0]),) + dr[1:]), shared_mem=smem)
        return dq_acc, dk, dv

    # the simple path: cuBLAS products and CuPy softmax, blocked over queries as the reference,
    # computed in fp32 (fp64 stays fp64); drop: the mask of numpy_ops.attn_keep drawn per block
    # with CuPy (the same integer arithmetic), in the forward and again in the backward
    _REF_BLOCK = 512

    @staticmethod
    def _ref_z(drop, B, K, G, T, S, q0, q1, kend, wt):
        """Z = keep * scale (B, K, G, q1 - q0, kend) in dtype wt, or None without dropout."""
        if drop is None:
            return None
        from .numpy_ops import attn_keep
        keep, sc = attn_keep(drop, B, K * G, T, S, q0, q1, kend, xp=cp)
        return keep.reshape(B, K, G, q1 - q0, kend).astype(wt) * wt(sc)

    def _attention_forward_ref(self, q, k, v, drop=None):
        B, H, T, D = q.shape
        K, S = k.shape[1], k.shape[2]
        G = H // K
        wt = cp.float64 if q.dtype == np.float64 else cp.float32
        scale = 1.0 / math.sqrt(D)
        qg = q.astype(wt).reshape(B, K, G, T, D)
        kf, vf = k.astype(wt), v.astype(wt)
        out = cp.empty((B, K, G, T, D), dtype=wt)
        lse = cp.empty((B, K, G, T), dtype=cp.float32)
        for q0 in range(0, T, self._REF_BLOCK):
            q1 = min(T, q0 + self._REF_BLOCK)
            kend = S - T + q1
            s = cp.matmul(qg[:, :, :, q0:q1], kf[:, :, None, :kend].swapaxes(-1, -2)) * scale
            s = self._mask(s, q0, S, T)
            m = s.max(axis=-1, keepdims=True)
            p = cp.exp(s - m)
            l = p.sum(axis=-1, keepdims=True)
            z = self._ref_z(drop, B, K, G, T, S, q0, q1, kend, wt)   # after the sum: lse is P's
            if z is not None:
                p = p * z
            out[:, :, :, q0:q1] = cp.matmul(p, vf[:, :, None, :kend]) / l
            lse[:, :, :, q0:q1] = (m + cp.log(l))[..., 0]
        return out.reshape(B, H, T, D).astype(q.dtype), lse.reshape(B, H, T)

    @staticmethod
    def _mask(s, q0, S, T):
        b, kend = s.shape[-2], s.shape[-1]
        cols = cp.arange(kend)[None, :]
        rows = (S - T + q0) + cp.arange(b)[:, None]
        return cp.where(cols > rows, -cp.inf, s)

    def _attention_backward_ref(self, dout, q, k, v, out, lse, drop=None):
        B, H, T, D = q.shape
        K, S = k.shape[1], k.shape[2]
        G = H // K
        wt = cp.float64 if q.dtype == np.float64 else cp.float32
        scale = 1.0 / math.sqrt(D)
        qg = q.astype(wt).reshape(B, K, G, T, D)
        dog = dout.astype(wt).reshape(B, K, G, T, D)
        kf, vf = k.astype(wt), v.astype(wt)
        lseg = lse.astype(wt).reshape(B, K, G, T)
        delta = cp.sum(dout.astype(wt) * out.astype(wt), axis=-1).reshape(B, K, G, T)
        dq = cp.empty_like(qg)
        dk = cp.zeros(kf.shape, dtype=wt)
        dv = cp.zeros(vf.shape, dtype=wt)
        for q0 in range(0, T, self._REF_BLOCK):
            q1 = min(T, q0 + self._REF_BLOCK)
            kend = S - T + q1
            qb, dob = qg[:, :, :, q0:q1], dog[:, :, :, q0:q1]
            s = cp.matmul(qb, kf[:, :, None, :kend].swapaxes(-1, -2)) * scale
            s = self._mask(s, q0, S, T)
            p = cp.exp(s - lseg[:, :, :, q0:q1, None])
            z = self._ref_z(drop, B, K, G, T, S, q0, q1, kend, wt)
            dv[:, :, :kend] += cp.matmul((p if z is None else p * z).swapaxes(-1, -2), dob).sum(axis=2)
            dp = cp.matmul(dob, vf[:, :, None, :kend].swapaxes(-1, -2))
            if z is not None:
                dp *= z
            dsc = p * (dp - delta[:, :, :, q0:q1, None]) * scale
            dq[:, :, :, q0:q1] = cp.matmul(dsc, kf[:, :, None, :kend])
            dk[:, :, :kend] += cp.matmul(dsc.swapaxes(-1, -2), qb).sum(axis=2)
        return (dq.reshape(B, H, T, D).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype))

    # ------------------------------------------------------------------ SwiGLU
    def swiglu_forward(self, h):
        """h (N, 2F) -> out (N, F), cache h."""
        h = self._act(h)
        N, F2 = h.shape
        F = F2 // 2
        out = self._empty((N, F))
        self._swiglu("fwd", N, F, h, out)
        return out, h

    def swiglu_backward(self, dout, cache):
        """dout (N, F) -> dh (N, 2F)."""
        h = cache
        dout = self._act(dout)
        N, F2 = h.shape
        F = F2 // 2
        dh = self._empty((N, F2))
        self._swiglu("bwd", N, F, dout, h, dh)
        return dh

    def _swiglu(self, kind: str, N: int, F: int, *arrays) -> None:
        """Launch gpu/swiglu.cu's forward or backward ("fwd", "bwd") over N rows of F outputs: the
        8-wide kernel where F is a multiple of 8, else the one-element kernel."""
        vec = F % 8 == 0
        total = N * F // (8 if vec else 1)
        self._fn(f"swiglu_{kind}_v8" if vec else f"swiglu_{kind}", "swiglu.cu")((_blocks(total),), (256,),
                                                                     (*arrays, _i64(N), _i32(F)))

    # ------------------------------------------------------------------ cross-entropy
    def cross_entropy_forward(self, logits, targets, mask=None):
        """logits (N, V), targets (N,) int -> losses (N,) fp32 in nats, cache (logits, targets,
        row log-sum-exp, mask): no probability tensor is kept. mask (N,) or None: rows where it
        is 0 get loss 0 and a zero gradient, and skip the softmax (gpu/cross_entropy.cu: the
        mask is a pointer, null for none)."""
        logits = self._act(logits)
        targets = cp.ascontiguousarray(cp.asarray(targets), dtype=cp.int32)
        N, V = logits.shape
        losses = cp.empty((N,), dtype=cp.float32)
        lse = cp.empty((N,), dtype=cp.float32)
        if mask is not None:
            mask = (cp.asarray(mask).reshape(-1) != 0).astype(cp.uint8)
        self._fn("ce_fwd", "cross_entropy.cu")(((N + 7) // 8,), (256,),
                                               (logits, targets, _ptr(mask), losses, lse, _i64(N), _i32(V)))
        return losses, (logits, targets, lse, mask)

    def cross_entropy_backward(self, dlosses, cache):
        """dlosses (N,) -> dlogits (N, V) = (softmax - onehot) * dlosses (0 on masked rows)."""
        logits, targets, lse, mask = cache
        N, V = logits.shape
        dl = cp.ascontiguousarray(cp.asarray(dlosses), dtype=cp.float32)
        d = self._empty((N, V))
        self._fn("ce_bwd", "cross_entropy.cu")((_blocks(N * V),), (256,),
                                               (logits, targets, _ptr(mask), lse, dl, d, _i64(N), _i32(V)))
        return d

    def log_softmax(self, logits):
        """logits (..., V) -> log-probabilities (fp32), for sampling and scoring."""
        x = cp.asarray(logits).astype(cp.float32)
        m = x.max(axis=-1, keepdims=True)
        z = x - m
        return z - cp.log(cp.exp(z).sum(axis=-1, keepdims=True))

    # ------------------------------------------------------------------ optimizer hooks
    def fetch_async(self, *arrays):
        """Start copying small device arrays (0-d: a loss, a norm) into pinned host memory and
        return a function that waits for those copies only (an event recorded right after them,
        not the work queued later) and gives their values as floats. Lets the training loop read
        step s-1 while step s runs."""
        import cupyx
        hosts = []
        for a in arrays:
            h = cupyx.empty_pinned(a.shape, dtype=a.dtype)
            cp.asnumpy(a, out=h, blocking=False)
            hosts.append(h)
        done = cp.cuda.Event(disable_timing=True)
        done.record()

        def result():
            done.synchronize()
            return tuple(float(h) for h in hosts)
        return result

    def global_norm(self, grads):
        """grads (P,) fp32 -> 0-d fp32 device array: sqrt(sum(grads^2)); inf/nan when any
        gradient is non-finite. Deterministic (fixed grid, two passes). No host sync."""
        n = grads.shape[0]
        nb = 2 * self.sm_count
        if self._norm_partial is None:
            self._norm_partial = cp.empty((nb,), dtype=cp.float32)
        out = cp.empty((), dtype=cp.float32)
        self._fn("sumsq_partial", "optim.cu")((nb,), (512,), (grads, _i64(n), self._norm_partial))
        self._fn("sumsq_final", "optim.cu")((1,), (1024,), (self._norm_partial, _i32(nb), out))
        return out

    def adamw_step(self, params, grads, m, v, decay_mask, lr, beta1, beta2, eps, weight_decay,
                   step, grad_scale=1.0, clip=0.0, norm=None):
        """One AdamW step over the flat fp32 buffers, in one launch (PyTorch's AdamW formula).

        grads are multiplied by grad_scale (1 / loss scale, times a clip factor the caller may
        have folded in) and, if clip > 0 and the unscaled norm (norm * grad_scale, with norm
        from global_norm) exceeds clip, also by clip / that norm (clipping on the device).
        If norm is given and not finite the kernel changes nothing: the step is skipped on the
        device (the caller reads the norm when it likes to adjust the loss scale).
        Also refreshes the compute-dtype weight copy that compute_weights returns next.
        """
        n = params.shape[0]
        assert n % 4 == 0 and params.dtype == np.float32
        bc1 = 1.0 - beta1 ** step
        bc2 = 1.0 - beta2 ** step
        pc = np.uint64(0)
        if self.precision != "fp32":
            if self._cw is None or self._cw.shape[0] != n:
                self._cw = self._empty((n,))
            pc = self._cw
        if norm is None:
            norm_arg = np.uint64(0)
        else:
            norm_arg = norm
        self._fn("adamw_step", "optim.cu")((_blocks(n // 4, 256, self.sm_count * 8),), (256,),
                               (params, grads, m, v, decay_mask, pc, _i64(n), _f32(lr),
                                _f32(beta1), _f32(beta2), _f32(eps), _f32(weight_decay),
                                _f32(bc1), _f32(bc2), norm_arg, _f32(grad_scale), _f32(clip)))
        if self.precision != "fp32":
            self._cw_fresh = params.data.ptr

