"""Backends: modules (or objects) with the same op names and signatures.

numpy_ops is the reference and runs everywhere. The CUDA backend (cuda_ops) needs CuPy and an
NVIDIA GPU; it is imported only when asked for, so the CPU path never needs CuPy.
"""
from __future__ import annotations

from ..errors import ConfigError

DEVICES = ("cpu", "cuda", "auto")
PRECISIONS = ("fp32", "fp16", "bf16")


def cuda_available() -> bool:
    try:
        import cupy  # noqa: F401
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def resolve_device(device: str) -> str:
    if device not in DEVICES:
        raise ConfigError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise ConfigError("device 'cuda' asked for, but CuPy or an NVIDIA GPU is not available "
                          "(pip install 'bytemodel[gpu]')")
    return device


def get_backend(device: str = "cpu", precision: str = "fp32"):
    """The ops for a device: numpy_ops on the CPU, the CUDA backend on a GPU."""
    device = resolve_device(device)
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if device == "cpu":
        if precision != "fp32":
            raise ConfigError("the CPU backend computes in fp32 only (use --precision fp32)")
        from . import numpy_ops
        return numpy_ops
    from .cuda_ops import CudaBackend
    return CudaBackend(precision)
