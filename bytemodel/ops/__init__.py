"""Backends, and the op table every backend defines: the only place the device shows.

A backend is a module (numpy_ops, the reference, runs everywhere) or an object (cuda_ops.CudaBackend,
needs CuPy and an NVIDIA GPU; imported only when asked for, so the CPU path never needs CuPy). Each
defines exactly the names below with numpy_ops' signatures; the model, the optimizer and the
training loop call them and never ask which device they run on. tests/test_op_table.py checks
both backends against this list.
"""
from __future__ import annotations

from ..errors import ConfigError, named

OPS = (
    # the layers, each a forward/backward pair (shapes in numpy_ops.py)
    "embedding_forward", "embedding_backward",
    "rmsnorm_forward", "rmsnorm_backward",
    "matmul_forward", "matmul_backward",
    "qkv_rope_forward", "qkv_rope_backward",
    "merge_heads_forward", "merge_heads_backward",
    "attention_forward", "attention_backward",
    "attention_decode",         # one query per sequence against a KV cache (generation, the compressor)
    "swiglu_forward", "swiglu_backward",
    "cross_entropy_forward", "cross_entropy_backward",
    "dropout_forward", "dropout_backward",   # training only: masks from a counter-based hash
    "add",                      # the residual stream's update
    "log_softmax",              # sampling and scoring
    # arrays and precision
    "describe",                 # {"device", "precision", library versions} for records
    "asarray", "to_numpy",      # host arrays in, host arrays out
    "activation_dtype",         # the dtype activations (and the KV cache, RoPE tables) use
    "compute_weights",          # the master buffer as the forward pass reads it (maybe a cast copy)
    # the optimizer and the loop, over the flat buffers
    "global_norm",              # 0-d array, no wait for the host
    "adamw_step",               # clip and skip of a non-finite step included
    "fetch_async",              # read 0-d results later, so the loop can run a step ahead
)
ATTRIBUTES = (
    "name",                     # "numpy", "cuda"
    "xp",                       # the array module (numpy, cupy)
    "cpu_threads",              # True: batch slices may run on CPU threads (training/runner.py, CoreParallel)
)
# host-side helpers of numpy_ops: the plain rotation (rope_forward / rope_backward) is the oracle
# the fused qkv_rope pair is built from; the dropout masks' rules (residual and attention), which the
# CUDA twins reproduce.
# (The RoPE tables are host maths, made on the host for every backend: ops/host.py.)
REFERENCE_ONLY = ("rope_forward", "rope_backward", "dropout_threshold", "dropout_keep",
                  "attn_drop_threshold", "attn_keep", "attn_dropped")

DEVICES = ("cpu", "cuda", "auto")
PRECISIONS = ("fp32", "fp16", "bf16")


def cuda_available() -> bool:
    try:
        import cupy  # noqa: F401
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def gpu_capability() -> tuple[int, int]:
    """The current GPU's compute capability, e.g. (9, 0) on an H200."""
    import cupy
    cc = cupy.cuda.Device().compute_capability   # e.g. "90"
    return int(cc[:-1]), int(cc[-1])


def resolve_device(device: str) -> str:
    if device not in DEVICES:
        raise ConfigError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise ConfigError("device 'cuda' asked for, but CuPy or an NVIDIA GPU is not available "
                          "(pip install 'bytemodel[gpu]')")
    return device


def get_backend(device: str = "cpu", precision: str = "fp32", strict: bool = True):
    """The ops for a device: numpy_ops on the CPU, the CUDA backend on a GPU.

    strict=False (loading a model to use it, where precision is a GPU option): on the CPU, which
    computes in fp32 only, another precision becomes fp32 instead of an error.
    """
    device = resolve_device(device)
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if device == "cpu":
        if precision != "fp32" and strict:
            raise ConfigError("the CPU backend computes in fp32 only (use " + named('--precision fp32', 'precision="fp32"') + ")")
        from . import numpy_ops
        return numpy_ops
    from .cuda_ops import CudaBackend
    return CudaBackend(precision)


def device_decoder(ops):
    """The backend's on-device decoder module (bytemodel.ops.cuda_decode) or None, in which case
    generation samples on the host (the NumPy backend)."""
    if getattr(ops, "name", "") != "cuda":
        return None
    from . import cuda_decode
    return cuda_decode
