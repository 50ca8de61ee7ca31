"""What a new user meets at the command line (issue 22, items 3 and 8): formats that agree with
the file's name, help without placeholders, rounded figures, a newline at a terminal."""
from __future__ import annotations

import re

import numpy as np
import pytest
from typer.testing import CliRunner

import bytemodel
from bytemodel.cli import app

runner = CliRunner()
SMALL = dict(preset="tiny", context=32, batch_size=4, eval_every=3, eval_tokens=256, warmup=1,
             model={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64}, plot=False, baseline=False)


@pytest.fixture(scope="module")
def audio_run(tmp_path_factory):
    sf = pytest.importorskip("soundfile")
    d = tmp_path_factory.mktemp("au")
    t = np.arange(8000 * 2) / 8000
    sf.write(str(d / "tone.wav"), (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16), 8000)
    bytemodel.train(d / "tone.wav", d / "run", steps=3, **SMALL)
    return d / "run"


@pytest.mark.parametrize("ext,fmt", [("mp3", "MP3"), ("ogg", "OGG"), ("flac", "FLAC"), ("wav", "WAV")])
def test_generate_writes_the_audio_format_asked_for(audio_run, tmp_path, ext, fmt):
    import soundfile as sf
    if not sf.check_format(fmt, {"MP3": "MPEG_LAYER_III", "OGG": "VORBIS"}.get(fmt, "PCM_16")):
        pytest.skip(f"this libsndfile does not write {fmt}")
    out = tmp_path / f"x.{ext}"
    r = runner.invoke(app, ["generate", "-c", str(audio_run), "-n", "4000", "--format", ext, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert sf.info(str(out)).format == fmt            # before the fix an .mp3 held a WAV


@pytest.mark.parametrize("fmt,name", [("wav", "x.mp3"), ("mp3", "x.wav"), ("ogg", "x.flac"), ("fa", "x.png"),
                                      ("raw", "x.fa"), ("mp3", "noext")])
def test_a_format_that_contradicts_the_name_is_refused(audio_run, tmp_path, fmt, name):
    out = tmp_path / name
    r = runner.invoke(app, ["generate", "-c", str(audio_run), "-n", "100", "--format", fmt, "--out", str(out)])
    lines = [l for l in r.output.strip().splitlines() if l.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: --format"), r.output
    assert not out.exists()


def test_a_format_libsndfile_cannot_write_is_one_line(tmp_path, monkeypatch):
    sf = pytest.importorskip("soundfile")
    from bytemodel.errors import SourceError
    from bytemodel.readers import get_reader
    monkeypatch.setattr(sf, "check_format", lambda *a: False)
    with pytest.raises(SourceError, match="cannot write MP3"):
        get_reader("audio").write(b"\x00" * 100, tmp_path / "x.mp3")
    assert not (tmp_path / "x.mp3").exists()


def test_info_rounds_and_generate_ends_a_terminal_line(audio_run, monkeypatch):
    out = runner.invoke(app, ["info", str(audio_run)]).output
    assert not re.search(r"\d\.\d{5,}", out) and re.search(r"validation \d\.\d{4} ± \d\.\d{4}", out), out
    from bytemodel import cli
    monkeypatch.setattr(cli, "_to_terminal", lambda: True)
    r = runner.invoke(app, ["generate", "-c", str(audio_run), "-n", "10", "--any-byte"])
    assert r.exit_code == 0 and r.stdout_bytes.endswith(b"\n") and len(r.stdout_bytes) in (10, 11)


def test_a_format_the_name_ends_in_is_no_contradiction(tmp_path):
    """lambda.fa.zst with --format zst: the name ends in the format's extension, though the
    extension rule (the longest claimed suffix) names it FASTA inside zstd; x.fa with zst is refused."""
    from bytemodel.errors import ConfigError
    from bytemodel.readers import output_reader
    assert output_reader(tmp_path / "lambda.fa.zst", "zst").name == "zstd"
    with pytest.raises(ConfigError, match="--format zst"):
        output_reader(tmp_path / "lambda.fa", "zst")
