"""Fault injection: hostile and unlucky input (issue 17), each case a test that failed before its fix.

Every item of the issue has its section below. Slow things are kept small: a 2-layer, 32-wide model,
context 32, and a handful of subprocesses (those that must die or run with a closed stdout or a
memory limit). Nothing here needs a GPU or the network.
"""
from __future__ import annotations

import bz2
import gzip
import json
import lzma
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bytemodel import checkpoint as ck
from bytemodel.cli import app
from bytemodel.errors import BytemodelError, CheckpointError, ConfigError, SourceError

runner = CliRunner()
MODEL = ["--context", "32", "--batch-size", "4", "--eval-every", "5", "--eval-tokens", "256",
         "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--d-ff", "64", "-q", "--no-baseline"]
API = dict(preset="tiny", context=32, batch_size=4, eval_every=5, eval_tokens=256, warmup=2,
           model={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64})
CORE_FILES = {"checkpoint.safetensors", "tokens.u16", "corpus.json", "metrics.jsonl"}


def cli(args, **kw):
    r = runner.invoke(app, [str(a) for a in args], **kw)
    return r.exit_code, r.output


def one_error_line(code, out, *words):
    """Exit status 2, exactly one line, starting 'error: ', no traceback, naming the words."""
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    ok = code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out
    return ok and all(w.lower() in out.lower() for w in words)


def ends_in_error_line(code, out, *words):
    """Like one_error_line, for commands that print progress first: the last line is the error."""
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    return bool(lines) and one_error_line(code, lines[-1], *words) and "Traceback" not in out


def dna(path: Path, n: int = 6000, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    motifs = ["".join(rng.choice(list("ACGT"), 12)) for _ in range(8)]
    path.write_text("".join(motifs[i] for i in rng.integers(0, 8, n // 12)))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 5-step run (checkpoint at step 5) that tests copy before changing it."""
    import bytemodel
    base = tmp_path_factory.mktemp("trained")
    src = dna(base / "toy.txt")
    bytemodel.train(src, base / "run", steps=5, **API)
    return base / "run"


@pytest.fixture
def run_copy(trained, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(trained, dst)
    return dst


def tensor_span(path: Path, name: str) -> tuple[int, int]:
    """Byte range of one tensor's data inside a safetensors file."""
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    a, b = header[name]["data_offsets"]
    return 8 + n + a, 8 + n + b


def rewrite_meta(path: Path, edit) -> None:
    """Re-save a checkpoint with its metadata changed by edit(meta) (tensors untouched)."""
    from safetensors.numpy import load, save
    blob = path.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    meta = json.loads(json.loads(blob[8:8 + n])["__metadata__"]["bytemodel"])
    meta = edit(meta)
    path.write_bytes(save(load(blob), metadata={"bytemodel": json.dumps(meta)}))


def subprocess_env():
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def leftovers(folder: Path) -> list[str]:
    """Temporary files a writer left behind."""
    return sorted(p.name for p in folder.iterdir() if "tmp" in p.name.lower())


# ================================================================================================
# 3. the checksum covers every tensor (AdamW moments included) and all metadata
# ================================================================================================
@pytest.mark.parametrize("tensor", ["optim.m", "optim.v", "wte"])
def test_a_flipped_byte_in_any_tensor_is_refused(run_copy, tensor):
    path = run_copy / ck.CKPT_NAME
    a, b = tensor_span(path, tensor)
    blob = bytearray(path.read_bytes())
    blob[(a + b) // 2] ^= 0x10
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="corrupt"):
        ck.load(run_copy)


@pytest.mark.parametrize("edit", [
    lambda m: {**m, "train": {**m["train"], "step": 4}},
    lambda m: {**m, "config": {**m["config"], "context": 16}},
    lambda m: {**m, "config": {**m["config"], "rope_theta": 500.0}},
    lambda m: {**m, "config": {**m["config"], "norm_eps": 1e-3}},
    lambda m: {**m, "train": {**m["train"], "config": {**m["train"]["config"], "lr": 0.5}}},
    lambda m: {**m, "train": {**m["train"], "config": {**m["train"]["config"], "seed": 7}}},
    lambda m: {**m, "tokenizer": {**m["tokenizer"], "pre_split": "text"}},
], ids=["step", "context", "rope_theta", "norm_eps", "lr", "seed", "tokenizer"])
def test_edited_metadata_is_refused(run_copy, edit):
    rewrite_meta(run_copy / ck.CKPT_NAME, edit)
    with pytest.raises(CheckpointError, match="corrupt"):
        ck.load(run_copy)


def test_untouched_checkpoint_still_loads_with_moments(trained):
    ld = ck.load(trained)
    assert ld.m is not None and ld.train["step"] == 5 and np.isfinite(ld.params).all()


# ================================================================================================
# 4. a WAV header that lies about its rate cannot make memory explode
# ================================================================================================
def _wav(path: Path, rate: int, n_samples: int) -> Path:
    data = (np.sin(np.arange(n_samples) / 7) * 8000).astype("<i2").tobytes()
    hdr = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE"
    hdr += b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    path.write_bytes(hdr + b"data" + struct.pack("<I", len(data)) + data)
    return path


def test_wav_declaring_1_hz_is_refused_within_bounded_memory(tmp_path):
    pytest.importorskip("soundfile")
    wav = _wav(tmp_path / "liar.wav", 1, 32768)   # 64 KB of samples "at 1 Hz": 262M samples at 8 kHz
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from bytemodel.readers import read_documents\n"
        "from bytemodel.errors import SourceError\n"
        "try:\n"
        "    docs = list(read_documents(sys.argv[1]))\n"
        "    print('read', sum(map(len, docs)))\n"
        "except SourceError as e:\n"
        "    print('refused:', e)\n"
        "print('maxrss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    r = subprocess.run([sys.executable, "-c", script, str(wav)], capture_output=True, text=True,
                       timeout=120, env=subprocess_env())
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused:" in r.stdout and "rate" in r.stdout, r.stdout
    rss_mb = int(r.stdout.split("maxrss_kb")[1]) / 1024
    assert rss_mb < 500, rss_mb   # imports take ~100 MB; the 4.8 GB of the bug is far away


def test_wav_at_a_low_but_real_rate_still_reads(tmp_path):
    pytest.importorskip("soundfile")
    from bytemodel.readers import read_documents
    wav = _wav(tmp_path / "slow.wav", 2000, 2000)   # one second at 2 kHz -> 8000 samples at 8 kHz
    (doc,) = read_documents(wav)
    assert len(doc) == 8000


# ================================================================================================
# 5. pipes, FIFOs and devices as sources, prompts, tokenizers and checkpoints
# ================================================================================================


# the CLI in a child that cannot take more than 3 GB of memory nor write a file past 64 MB: before
# the fixes some cases read /dev/zero (or wrote it to disk) without end
LIMITED_CLI = ("import resource, sys\n"
               "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
               "resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))\n"
               "from bytemodel.cli import main\nsys.argv = ['bytemodel'] + sys.argv[1:]\nmain()\n")


def test_checkpoint_symlinked_to_dev_zero_is_refused(tmp_path):
    link = tmp_path / "checkpoint.safetensors"
    link.symlink_to("/dev/zero")
    script = LIMITED_CLI
    for args in (["info", str(tmp_path)], ["generate", "-c", str(link), "--bytes", "3"]):
        p = subprocess.run([sys.executable, "-c", script] + args, capture_output=True, text=True,
                           timeout=120, env=subprocess_env())
        assert one_error_line(p.returncode, p.stderr, "not a regular file"), p.stderr[-3000:]


# ================================================================================================
# 6. one `error:` line instead of a traceback
# ================================================================================================


@pytest.mark.parametrize("meta", ["null", "[1, 2]", '"text"', "{\"format\": \"bytemodel-checkpoint\", "
                                  "\"version\": 2, \"config\": [], \"tokenizer\": null, \"train\": 3}"])
def test_checkpoint_metadata_of_the_wrong_shape(run_copy, meta):
    from safetensors.numpy import load, save
    path = run_copy / ck.CKPT_NAME
    path.write_bytes(save(load(path.read_bytes()), metadata={"bytemodel": meta}))
    for args in (["info", run_copy], ["generate", "-c", run_copy, "--bytes", "3"],
                 ["train", "--resume", "--out", run_copy, "--steps", "8", "-q"]):
        assert one_error_line(*cli(args), str(run_copy)), args
