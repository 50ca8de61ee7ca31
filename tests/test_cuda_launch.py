"""ops/cuda_launch.py's structures against cuda.h's CUlaunchConfig / CUlaunchAttribute (CUDA 12 and 13),
and its argument conversion. No GPU needed (the launches themselves: tests/test_decode_gpu.py)."""
import ctypes

import numpy as np
import pytest

from bytemodel.ops import cuda_launch as cl


def test_structures_have_cuda_h_layout():
    # CUlaunchAttribute: id (4 bytes) + pad to 8, then a 64-byte union (its first member an int)
    assert ctypes.sizeof(cl.LaunchAttribute) == 72
    assert cl.LaunchAttribute.value.offset == 8
    # CUlaunchConfig: 7 unsigned ints, then the stream handle at 32, attrs at 40, numAttrs at 48
    assert cl.LaunchConfig.hStream.offset == 32 and cl.LaunchConfig.attrs.offset == 40
    assert cl.LaunchConfig.numAttrs.offset == 48 and ctypes.sizeof(cl.LaunchConfig) == 56
    assert cl.PROGRAMMATIC_STREAM_SERIALIZATION == 6


class _Buf:
    class data:
        ptr = 0x7F00_0000_1000


def test_kernel_args():
    a = cl.kernel_args([_Buf(), np.int32(-3), np.float32(0.5), np.float64(0.25), np.uint64(0)])
    assert [type(x) for x in a] == [ctypes.c_void_p, ctypes.c_int32, ctypes.c_float, ctypes.c_double, ctypes.c_uint64]
    assert a[0].value == 0x7F00_0000_1000 and a[1].value == -3 and a[2].value == 0.5 and a[4].value == 0
    with pytest.raises(TypeError):
        cl.kernel_args([3])         # a bare Python int: its width would be a guess
