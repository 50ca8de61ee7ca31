"""Every gpu/*.cu module compiles through NVRTC as the loaders compile it at run time: the same
source text and options (ops/gpu_source.py), on a machine with no GPU and no CuPy. nvcc accepts
some C++ that NVRTC refuses (a generic lambda in device code: NVRTC took it for a host function),
and at run time a refused module only shows as a kernel that falls back to a slower path.

The builds, one test each (all compiled at once in a thread pool; each test waits for its own):
    cuda_ops._module's files (every gpu/*.cu without a loader of its own, so cuda_decode.py's and
        cuda_score.py's too) at fp16, bf16 and fp32
    decode.cu's dec_step, a module per (R, D) (cuda_decode.py, with PERSIST on): R the rows of
        decode.cu's products (its DEC_GEMV_KERNELS), D one of DECODE_HEAD_DIMS. All 60 builds
        of R x D x precision cost ~130 s of one core, so a sample: every R, every D and every
        precision at least once, the largest (R, D) among them
    flash_hopper.cu with flash_tma.cu after it (cuda_ops._hopper_module) at fp16 and bf16, the
        precisions with the flash path
    mix_step.cu for ctx3f's context count, scatter.cu for each value type, mixer.cu
    benchmarks/kernels/flash_attn.py's study modules: flash_variants.cu after flash_attn.cu and
        flash_hopper_variants.cu after flash_hopper.cu, at fp16 (its only precision)

CuPy adds -arch for the GPU at hand: here sm_90 (the H100 and H200 the project runs on); the
Hopper module names sm_90a itself. NVRTC and its headers come from the nvidia-cuda-nvrtc-cu12 and
nvidia-cuda-runtime-cu12 wheels, CUDA 12's as the gpu extra's CuPy (tests/nvrtc_compile.py says
why the release matters); without them every test here is skipped.
"""
from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nvrtc_compile import Nvrtc

from bytemodel.ops.gpu_source import (DECODE_HEAD_DIMS, MACRO, MIXER_OPTIONS, SCATTER_KINDS, hopper_options,
                                      mix_options, module_options, scatter_options, source, tma_source)
from bytemodel.resources import gpu_dir

ARCH = ("-arch=sm_90",)        # what CuPy adds on an H100 / H200 (flash_hopper.cu names its own)
PRECISIONS = tuple(MACRO)      # fp16, bf16, fp32
OWN_LOADER = ("flash_hopper.cu", "flash_tma.cu", "mix_step.cu", "scatter.cu", "mixer.cu")   # not cuda_ops._module's
BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "kernels"


@dataclass(frozen=True)
class Build:
    """One module as a loader hands it to NVRTC."""
    id: str
    file: str               # the name NVRTC reports errors under
    source: str = field(repr=False)
    options: tuple


def _with(file: str, extra: str) -> str:
    """gpu/<file> with a benchmark's study kernels after it (flash_attn.py's "\\n" + the file)."""
    return source(file) + "\n" + (BENCH / extra).read_text()


def _mix_k() -> int:
    """The context count cuda_mix compiles mix_step.cu for: ctx3f's (its K, from a tiny mixer)."""
    from bytemodel.compress.mix3f import ContextMix3F
    return ContextMix3F([4], 3).K


def _dec_steps():
    """(R, D, precision) of the dec_step sample (module doc): D in order, R in order up to the
    largest, the precisions in turn."""
    rows = [int(r) for r in re.findall(r"^DEC_GEMV_KERNELS\((\d+)\)", source("decode.cu"), re.M)]
    assert rows, "decode.cu's DEC_GEMV_KERNELS(R) lines: the parser needs a look"
    return [(rows[min(i, len(rows) - 1)], D, PRECISIONS[i % len(PRECISIONS)])
            for i, D in enumerate(sorted(DECODE_HEAD_DIMS))]


def builds() -> list[Build]:
    files = sorted(p.name for p in gpu_dir().glob("*.cu"))
    out = [Build(f"{f}-{p}", f, source(f), module_options(f, p) + ARCH)
           for f in files if f not in OWN_LOADER for p in PRECISIONS]
    out += [Build(f"decode.cu-dec_step_r{R}_d{D}-{p}", "decode.cu", source("decode.cu"),
                  module_options("decode.cu", p, (f"DEC_STEP_R={R}", f"DEC_STEP_D={D}")) + ARCH)
            for R, D, p in _dec_steps()]
    out += [Build(f"flash_hopper.cu-{p}", "flash_hopper.cu+flash_tma.cu", source("flash_hopper.cu") + tma_source(),
                  hopper_options(p)) for p in ("fp16", "bf16")]
    K = _mix_k()
    out.append(Build(f"mix_step.cu-K{K}", "mix_step.cu", source("mix_step.cu"), mix_options(K) + ARCH))
    out += [Build(f"scatter.cu-kind{k}", "scatter.cu", source("scatter.cu"), scatter_options(k) + ARCH)
            for k in sorted(set(SCATTER_KINDS.values()))]
    out.append(Build("mixer.cu", "mixer.cu", source("mixer.cu"), MIXER_OPTIONS + ARCH))
    out.append(Build("flash_attn.cu+flash_variants.cu-fp16", "flash_attn.cu", _with("flash_attn.cu", "flash_variants.cu"),
                     module_options("flash_attn.cu", "fp16") + ARCH))
    out.append(Build("flash_hopper.cu+flash_hopper_variants.cu-fp16", "flash_hopper.cu",
                     source("flash_hopper.cu") + tma_source() + "\n" + (BENCH / "flash_hopper_variants.cu").read_text(),
                     hopper_options("fp16")))
    return out


BUILDS = builds()


@pytest.fixture(scope="module")
def compiled(request):
    """(NVRTC, {build id: future (ok, log)}): the session's selected builds queued at once, a thread
    per core, the longest sources first."""
    nv = Nvrtc.find()
    if nv is None:
        pytest.skip("no NVRTC: pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 (the test extra; Linux x86_64)")
    chosen = [item.callspec.params["build"] for item in request.session.items
              if getattr(item, "callspec", None) and isinstance(item.callspec.params.get("build"), Build)]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    pool = ThreadPoolExecutor(max_workers=cores)
    jobs = {b.id: pool.submit(nv.compile, b.source, b.file, b.options)
            for b in sorted(chosen, key=lambda b: -len(b.source))}
    yield nv, jobs
    pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("build", BUILDS, ids=[b.id for b in BUILDS])
def test_module_compiles(build, compiled):
    nv, jobs = compiled
    ok, log = jobs[build.id].result()
    assert ok, (f"{build.file} does not compile through NVRTC {nv.version()} ({nv.library}):\n"
                f"options: -I{nv.include} {' '.join(build.options)}\n"
                f"(line numbers count gpu/common.cuh's lines, pasted in place of its #include)\n{log}")


def test_every_module_is_built():
    """A gpu/*.cu file that no build compiles would go unchecked (a new loader must add its builds)."""
    assert {p.name for p in gpu_dir().glob("*.cu")} <= {f for b in BUILDS for f in b.file.split("+")}
    assert len({b.id for b in BUILDS}) == len(BUILDS)


@pytest.mark.parametrize("build", [b for b in BUILDS if b.id.startswith("flash_hopper.cu-")],
                         ids=lambda b: b.id)
def test_no_shipped_wgmma_is_serialized(build, compiled):
    """ptxas serializes every wgmma of a kernel where a warpgroup's accumulator registers are
    touched in a divergent path between a product's issue and its wait (its note C7518, "wgmma.mma_async
    instructions are serialized"): the kernel then runs, right but slower (the deferred dQ adds'
    variant flash_bwd_h64_m8 did, benchmarks/README.md). No shipped Hopper kernel may have it."""
    nv, jobs = compiled
    ok, log = jobs[build.id].result()
    assert ok and "C7518" not in log, f"ptxas serializes wgmma in {build.file} ({build.id}):\n{log}"
