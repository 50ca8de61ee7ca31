"""gpu/decode.cu's rule for programmatic dependent launch, held in the PTX NVRTC makes (no GPU
needed): a kernel launched with PDL starts before the kernel it waits for has finished, so what
that kernel wrote must not be read by read-only loads (ld.global.nc, what the compiler makes of a
`const __restrict__` pointer), which are only promised for data that does not change while the
kernel runs. On an H100 the sampler, reading the step counter that way, drew into the wrong column
in a graph of four steps (thirty-first session). After `griddepcontrol.wait`:
    - the products that add into the residual stream or make the logits (dec_proj_*) and gate/up
      (dec_gateup_*) make no read-only load at all: their weights are read before the wait, and
      their input (the residual stream, the attention's or SwiGLU's output) was written by the
      kernel before;
    - the attention over the cache (dec_attn_*) makes none either: q, the new cache row and the
      step counter were written by dec_qkv;
    - the sampler (dec_sample) reads read-only only the byte mask (bytes: .u8), never the logits
      or the step counter.
Skipped without NVRTC (the test extra's nvidia-cuda-nvrtc-cu12 wheel)."""
from __future__ import annotations

import re

import pytest

from nvrtc_compile import Nvrtc

from bytemodel.ops.gpu_source import module_options, source

ARCH = ("-arch=sm_90",)


@pytest.fixture(scope="module", params=["fp16", "bf16", "fp32"])
def ptx(request):
    nv = Nvrtc.find()
    if nv is None:
        pytest.skip("no NVRTC: pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12 (the test extra)")
    out = []
    ok, log = nv.compile(source("decode.cu"), "decode.cu", module_options("decode.cu", request.param) + ARCH, out)
    assert ok, log
    return out[0]


def after_wait(ptx: str, entry: str) -> str:
    """The PTX of kernel `entry` from its griddepcontrol.wait on."""
    i = ptx.index(f".entry {entry}(")
    j = ptx.find(".entry ", i + 1)
    body = ptx[i:j if j > 0 else len(ptx)]
    assert "griddepcontrol.wait" in body, entry
    return body[body.index("griddepcontrol.wait"):]


def entries(ptx: str, prefix: str) -> list[str]:
    return re.findall(rf"\.entry ({prefix}\w*)\(", ptx)


def test_products_read_nothing_read_only_after_the_wait(ptx):
    names = entries(ptx, "dec_proj_") + entries(ptx, "dec_gateup_")
    assert len(names) >= 8, names            # the warp kernels at R = 1, 2, 4, 8 at least
    for name in names:
        nc = re.findall(r"ld\.global\.nc\S*", after_wait(ptx, name))
        assert not nc, (name, nc)


def test_the_sampler_reads_only_the_mask_read_only(ptx):
    nc = set(re.findall(r"ld\.global\.nc(\S*)", after_wait(ptx, "dec_sample")))
    assert nc == {".u8"}, nc


def test_the_attention_reads_nothing_read_only_after_the_wait(ptx):
    """dec_attn reads the query and the cache row dec_qkv wrote just before it (and the step
    counter): all plain loads."""
    names = entries(ptx, "dec_attn_")
    assert len(names) >= 10, names           # d16 .. d256, and their act_ twins
    for name in names:
        nc = re.findall(r"ld\.global\.nc\S*", after_wait(ptx, name))
        assert not nc, (name, nc)
