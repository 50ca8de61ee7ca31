"""--adapt on the GPU: the decoder repeats the encoder's updates bit for bit (the CUDA kernels are
deterministic on one GPU model), for a fresh model (fp16 by default, or --precision's; decoding
at the header's) and for a CPU-trained run loaded at fp16 and bf16, with AdamW and with SGD; the
same bytes from two compressions; what adapting gains on the device; and a GPU file refused on
the CPU. Skipped without CuPy, a GPU or the coder (CI)."""
from __future__ import annotations

import pytest

from conftest import cli, gpu_marks

cp = pytest.importorskip("cupy")
pytestmark = gpu_marks(cp)
pytest.importorskip("constriction")

import bytemodel  # noqa: E402
from bytemodel import compress as bmz  # noqa: E402
from bytemodel.compress.adapt import Fresh, settings  # noqa: E402
from bytemodel.errors import CompressError  # noqa: E402

FAST = dict(preset="tiny", context=32, batch_size=4, eval_every=40, eval_tokens=256, warmup=2,
            model={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64})
SMALL = dict(d_model=64, n_layers=2, n_heads=1, d_ff=128)     # head dim 64: FlashAttention's kernel at fp16/bf16
TEXT = (b"To adapt is to learn the file while coding it; the decoder repeats every step. " * 12)[:900]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("adapt-gpu")
    src = d / "toy.txt"
    src.write_bytes(b"ACGTTGCAAGGT" * 400)
    bytemodel.train(str(src), str(d / "run"), steps=20, lr=3e-3, device="cpu",
                    **{**FAST, "model": dict(FAST["model"], d_model=64, n_heads=1, d_ff=128)})
    return d / "run"


def test_a_fresh_model_adapts_on_the_gpu():
    fresh = Fresh("tiny", "cuda", **SMALL)
    a = settings(fresh, segment=8, lr=1e-2)
    st_a, st_s = {}, {}
    blob = bmz.compress(fresh, TEXT, adapt=a, streams=4, stats=st_a)
    h = bmz.read(blob)[0]
    assert h["backend"]["device"] == "cuda" and h["layout"]["engine"] == "lockstep"
    assert blob == bmz.compress(Fresh("tiny", "cuda", **SMALL), TEXT, adapt=a, streams=4)
    assert bmz.decompress(Fresh("tiny", "cuda", **SMALL), blob) == TEXT
    bmz.compress(fresh, TEXT, streams=4, stats=st_s)
    assert st_a["model_bits"] < 0.6 * st_s["model_bits"], (st_a["model_bits"], st_s["model_bits"])
    with pytest.raises(CompressError, match="compressed on cuda"):
        bmz.decompress(Fresh("tiny", **SMALL), blob)             # the CPU refuses a GPU file


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_a_fresh_model_codes_at_the_precision_asked(tmp_path, precision):
    # compress builds the fresh model at --precision; decompress at the header's (were it to take
    # its default, fp16, instead, the bf16 and fp32 files would be refused as made on another backend)
    src, bmz_file, back = tmp_path / "t.txt", tmp_path / "t.txt.bmz", tmp_path / "back.txt"
    src.write_bytes(TEXT)
    code, out = cli(["compress", src, "--adapt", "--preset", "tiny", "--device", "cuda", "--precision", precision,
                     "-o", bmz_file])
    assert code == 0, out
    assert bmz.read(bmz_file.read_bytes())[0]["backend"]["precision"] == precision
    code, out = cli(["decompress", bmz_file, "-o", back])
    assert code == 0, out
    assert back.read_bytes() == TEXT


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("optimizer,lr", [("adamw", 3e-3), ("sgd", 0.05)])
def test_a_run_adapts_on_the_gpu(run_dir, precision, optimizer, lr):
    lm = bytemodel.load(run_dir, device="cuda", precision=precision)
    data = b"ACGTTGCAAGGT" * 30 + b"a different tail " * 12
    a = settings(lm, segment=4, optimizer=optimizer, lr=lr)
    st_a, st_s = {}, {}
    blob = bmz.compress(lm, data, adapt=a, streams=2, stats=st_a)
    assert blob == bmz.compress(lm, data, adapt=a, streams=2)
    again = bytemodel.load(run_dir, device="cuda", precision=precision)
    assert bmz.decompress(again, blob) == data
    bmz.compress(lm, data, streams=2, stats=st_s)
    assert st_a["model_bits"] < st_s["model_bits"], (st_a["model_bits"], st_s["model_bits"])


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("mix", ["ctx3f", "none"])
def test_the_graphed_adapt_step_writes_the_launched_files(monkeypatch, precision, mix):
    # under --adapt the lanes' step runs as a CUDA graph whose captured weights are refreshed in
    # place after every update (driver._adapt_steppers); with GPU_GRAPH off, Lockstep launches it
    # from Python. The files must be the same bytes, each decoding the other's: a stale weight
    # buffer (no refresh) or a push out of order with the mixer's work would change the bits.
    # window 8 and segment 8 over ~110-token streams: the ring and a dozen updates.
    from bytemodel.compress import driver
    made, orig = [], driver._adapt_steppers
    monkeypatch.setattr(driver, "_adapt_steppers", lambda *a: made.append(orig(*a)) or made[-1])
    fresh = lambda: Fresh("tiny", "cuda", precision=precision, **SMALL)   # noqa: E731
    a = settings(fresh(), segment=8, lr=1e-2, mix=mix, stride=1)
    opts = dict(adapt=a, streams=8, window=8)
    monkeypatch.setattr(driver, "GPU_GRAPH", False)
    launched = bmz.compress(fresh(), TEXT, **opts)
    assert made[-1] is None
    monkeypatch.setattr(driver, "GPU_GRAPH", True)
    graphed = bmz.compress(fresh(), TEXT, **opts)
    assert made[-1] is not None and all(g.captured for g in made[-1]), [g.capture_error for g in made[-1]]
    assert graphed == launched
    assert bmz.decompress(fresh(), launched) == TEXT          # decoded through the graph
    monkeypatch.setattr(driver, "GPU_GRAPH", False)
    assert bmz.decompress(fresh(), graphed) == TEXT           # and launched
