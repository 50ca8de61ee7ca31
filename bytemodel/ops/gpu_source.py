"""What NVRTC is given for each gpu/*.cu module: the source as the loaders build it, and the options
they pass. Kept apart from CuPy (this imports NumPy alone) so that one place says what is compiled,
for the loaders (ops/cuda_ops.py's _module and _hopper_module, cuda_mix.py, cuda_scatter.py; and
cuda_decode.py, cuda_score.py through _module) and for tests/test_gpu_compile.py, which compiles
the same text with the same options through NVRTC on a machine without a GPU or CuPy.

CuPy adds its own include directory and an -arch for the GPU at hand to every RawModule's options;
flash_hopper.cu names its architecture itself (hopper_options), since CuPy's own compile path
cannot name sm_90a.
"""
from __future__ import annotations

import os

import numpy as np

from ..resources import gpu_dir

_GPU_DIR = str(gpu_dir())

# common.cuh's activation type of each precision (act_t: half, __nv_bfloat16, float)
MACRO = {"fp16": "ACT_F16", "bf16": "ACT_BF16", "fp32": "ACT_F32"}
DECODE_HEAD_DIMS = (16, 32, 64, 128, 256)   # the head dims gpu/decode.cu's attention is built for
# gpu/scatter.cu's VAL_KIND of each type add_rows takes (one module per type: cuda_scatter.py)
SCATTER_KINDS = {np.dtype(np.float64): 0, np.dtype(np.float32): 1, np.dtype(np.int64): 2,
                 np.dtype(np.int32): 3, np.dtype(np.uint16): 4}
MIXER_OPTIONS = ("-std=c++17",)              # gpu/mixer.cu: no variants


def source(name: str) -> str:
    """gpu/<name> with gpu/common.cuh pasted in place of its `#include "common.cuh"` (NVRTC is
    given one string; CuPy's include path does not hold gpu/)."""
    with open(os.path.join(_GPU_DIR, "common.cuh")) as f:
        common = f.read()
    with open(os.path.join(_GPU_DIR, name)) as f:
        src = f.read()
    return src.replace('#include "common.cuh"', common)


def tma_source() -> str:
    """gpu/flash_tma.cu as it follows gpu/flash_hopper.cu in the Hopper module (cuda_ops._hopper_module)."""
    with open(os.path.join(_GPU_DIR, "flash_tma.cu")) as f:
        return "\n" + f.read()


def module_options(file: str, precision: str, defines: tuple = ()) -> tuple:
    """cuda_ops._module's options for gpu/<file> at precision, with -D of each of `defines`."""
    opts = ("-std=c++17", f"-D{MACRO[precision]}") + tuple(f"-D{d}" for d in defines)
    if file == "flash_attn.cu":
        opts += ("--use_fast_math",)     # ex2.approx / rcp.approx in the softmax; ftz
    return opts


def hopper_options(precision: str) -> tuple:
    """gpu/flash_hopper.cu's (cuda_ops._hopper_module, before CuPy's include directory is added):
    sm_90a, the architecture-specific target that wgmma needs."""
    return ("-std=c++17", f"-D{MACRO[precision]}", "--use_fast_math", "-arch=sm_90a")


def mix_options(K: int) -> tuple:
    """gpu/mix_step.cu's for a mixer of K contexts (cuda_mix.kernel: one module per K)."""
    return ("-std=c++17", f"-DMIX_K={int(K)}")


def scatter_options(kind: int) -> tuple:
    """gpu/scatter.cu's for the value type of VAL_KIND `kind` (a value of SCATTER_KINDS)."""
    return ("-std=c++17", f"-DVAL_KIND={kind}")
