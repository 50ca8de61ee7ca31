"""Kernel launches with programmatic dependent launch (PDL), through the CUDA driver by ctypes.

CuPy launches a kernel only after the one before it in the stream has finished. On compute
capability 9.0 and up, a launch with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may
start while the kernel before it still runs, once every block of that kernel has executed
`griddepcontrol.launch_dependents`; the new kernel's `griddepcontrol.wait` then holds it until
the kernel before has finished and its writes are visible. A kernel that does the work that
needs nothing from its predecessor before the wait (the decoder's kernels read their weight rows
there, gpu/decode.cu) hides its launch and its first DRAM latency behind the kernel before.
The arithmetic is the same, so are the results; in a CUDA graph the dependency is captured as a
programmatic edge.

CuPy (14.x) has no launch with attributes, so `launch` calls cuLaunchKernelEx itself: the
structures below are cuda.h's CUlaunchConfig and CUlaunchAttribute (CUDA 12 and 13; their
layout is checked in tests/test_cuda_launch.py). This module imports no CuPy: the caller passes
the function handle, the stream handle and the arguments (device pointers as ints, NumPy scalars).
"""
from __future__ import annotations

import ctypes

import numpy as np

COOPERATIVE = 2                           # CUlaunchAttributeID (cuda.h): every block resident at once
PROGRAMMATIC_STREAM_SERIALIZATION = 6     # CUlaunchAttributeID (cuda.h)


class LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte union (its first int here)."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("rest", ctypes.c_char * 60)]


class LaunchConfig(ctypes.Structure):
    """CUlaunchConfig."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_C = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
      np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
      np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}


def kernel_args(args) -> list:
    """Each argument as the ctypes value the kernel's parameter takes: an object with a device
    pointer (`.data.ptr`, a CuPy array) -> void*, a NumPy scalar -> its own type."""
    out = []
    for a in args:
        ptr = getattr(getattr(a, "data", None), "ptr", None)
        if ptr is not None:
            out.append(ctypes.c_void_p(int(ptr)))
        elif isinstance(a, np.generic) and a.dtype in _C:
            out.append(_C[a.dtype](a.item()))
        else:
            raise TypeError(f"kernel argument of type {type(a).__name__}: pass a device array or a NumPy scalar")
    return out


class Launcher:
    """cuLaunchKernelEx with one launch attribute set: programmatic stream serialization allowed
    (the default), or COOPERATIVE (a grid whose blocks wait for each other: the driver refuses
    the launch unless every block can be resident at once)."""

    def __init__(self, attribute: int = PROGRAMMATIC_STREAM_SERIALIZATION):
        self._lib = ctypes.CDLL("libcuda.so.1")
        self._fn = self._lib.cuLaunchKernelEx
        self._fn.restype = ctypes.c_int
        self._fn.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                             ctypes.c_void_p]
        self._attr = LaunchAttribute(id=attribute, value=1)

    def blocks_per_sm(self, function_ptr: int, block: int, shared_mem: int) -> int:
        """How many blocks of this kernel one multiprocessor holds at once
        (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
        n = ctypes.c_int(0)
        fn = self._lib.cuOccupancyMaxActiveBlocksPerMultiprocessor
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        err = fn(ctypes.byref(n), ctypes.c_void_p(int(function_ptr)), int(block), int(shared_mem))
        if err:
            raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor: error {err}")
        return n.value

    def __call__(self, function_ptr: int, grid, block, args, shared_mem: int, stream_ptr: int) -> None:
        grid, block = tuple(grid) + (1,) * (3 - len(grid)), tuple(block) + (1,) * (3 - len(block))
        cfg = LaunchConfig(*grid, *block, int(shared_mem), ctypes.c_void_p(int(stream_ptr)),
                           ctypes.pointer(self._attr), 1)
        vals = kernel_args(args)
        params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        err = self._fn(ctypes.byref(cfg), ctypes.c_void_p(int(function_ptr)), params, None)
        if err:
            name = ctypes.c_char_p()
            self._lib.cuGetErrorName(err, ctypes.byref(name))
            raise RuntimeError(f"cuLaunchKernelEx: {(name.value or b'?').decode()} ({err})")
