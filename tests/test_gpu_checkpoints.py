"""One checkpoint format for both devices: a CPU run resumes on the GPU, and a GPU run's
checkpoint generates the same bytes on the CPU. Skipped without CuPy and a GPU."""
import numpy as np
import pytest

from conftest import gpu_marks

cp = pytest.importorskip("cupy")
pytestmark = gpu_marks(cp)

import bytemodel  # noqa: E402
from bytemodel import checkpoint as ck  # noqa: E402
from tests.conftest import FAST  # noqa: E402


def test_cpu_run_resumes_on_gpu_and_generates_on_cpu(tmp_path, dna_file):
    settings = {**FAST, "model": dict(FAST["model"])}
    first = bytemodel.train(dna_file, tmp_path / "run", steps=10, stop_at=4, **settings)
    assert first.step == 4
    cpu_params = ck.load(tmp_path / "run").params
    resumed = bytemodel.train(None, tmp_path / "run", resume=True, device="cuda", precision="fp16")
    assert resumed.step == 10 and np.isfinite(resumed.val_bpb)
    after = ck.load(tmp_path / "run")
    assert after.params.dtype == np.float32 and not np.array_equal(after.params, cpu_params)
    a = bytemodel.load(tmp_path / "run").generate(64, seed=3)
    b = bytemodel.load(tmp_path / "run", device="cuda", precision="fp32").generate(64, seed=3)
    assert len(a) == 64 and a == b
