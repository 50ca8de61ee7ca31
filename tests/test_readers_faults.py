"""Readers under fault injection (issue 17): a lying WAV header, unreadable folders, garbage after a
compressed stream. Nothing here needs a GPU or the network."""
from __future__ import annotations

import bz2
import gzip
import lzma
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bytemodel.errors import SourceError
from conftest import MODEL_FLAGS, PEAK_KB, cli, refused, subprocess_env


# ================================================================================================
# a WAV header that lies about its rate cannot make memory explode
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
    script = PEAK_KB + (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "from bytemodel.readers import read_documents\n"
        "from bytemodel.errors import SourceError\n"
        "try:\n"
        "    docs = list(read_documents(sys.argv[1]))\n"
        "    print('read', sum(map(len, docs)))\n"
        "except SourceError as e:\n"
        "    print('refused:', e)\n"
        "print('maxrss_kb', peak_kb())\n")
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
# unreadable folders are not empty ones
# ================================================================================================
def test_unreadable_directory_is_not_reported_as_empty(tmp_path, monkeypatch):
    from bytemodel.readers import source_files
    d = tmp_path / "locked"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "a.txt").write_text("x")
    real = os.scandir

    def scandir(path="."):
        if Path(path) == d / "sub":
            raise PermissionError(13, "Permission denied", str(path))
        return real(path)
    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(SourceError, match="Permission denied") as e:
        source_files(d)
    assert "no files" not in str(e.value)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads unreadable folders")
def test_unreadable_directory_for_real(tmp_path):
    d = tmp_path / "locked"
    d.mkdir()
    (d / "a.txt").write_text("x")
    d.chmod(0)
    try:
        code, out = cli(["train", "--source", d, "--out", tmp_path / "r", "--steps", "1"] + MODEL_FLAGS)
        assert refused(code, out, "permission"), out
    finally:
        d.chmod(0o755)



# ================================================================================================
# compressed streams: trailing garbage refused, xz padding accepted
# ================================================================================================
@pytest.mark.parametrize("kind", ["xz", "bz2", "gz"])
def test_trailing_garbage_after_a_compressed_stream_is_refused(tmp_path, kind):
    from bytemodel.readers import read_documents
    body = b">r1\nACGTACGT\n"
    comp = {"xz": lzma.compress, "bz2": bz2.compress, "gz": gzip.compress}[kind](body)
    f = tmp_path / f"x.fa.{kind}"
    f.write_bytes(comp + b"this is not a stream")
    with pytest.raises(SourceError):
        list(read_documents(f))
    f.write_bytes(comp + comp)   # two whole streams are one valid file
    assert b"".join(read_documents(f)).count(b"ACGTACGT") == 2


def test_xz_stream_padding_is_accepted(tmp_path):
    from bytemodel.readers import read_documents
    f = tmp_path / "x.txt.xz"
    f.write_bytes(lzma.compress(b"hello\n") + b"\0" * 8)   # xz allows null padding in 4-byte units
    assert b"".join(read_documents(f)) == b"hello\n"
    f.write_bytes(lzma.compress(b"hello\n") + b"\0" * 3)   # but not an odd amount
    with pytest.raises(SourceError):
        list(read_documents(f))

