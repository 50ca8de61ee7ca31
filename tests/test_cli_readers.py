"""`bytemodel readers`, `bytemodel data list|get` through the typer runner, in temporary folders."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bytemodel import catalogue as datasets
from bytemodel.cli import app

ROOT = Path(__file__).resolve().parents[1]
LAMBDA = ROOT / "datasets" / "lambda_virus.fa"


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("BYTEMODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(app, list(args), catch_exceptions=False)
    return invoke


def test_readers_table_lists_every_reader(run):
    r = run("readers")
    assert r.exit_code == 0, r.output
    for name in ("raw", "text", "fasta", "zstd", "image", "audio"):
        assert f"│ {name} " in r.output
    assert ".fa" in r.output and ".png" in r.output and "mu-law" in r.output


def test_data_list_shows_the_catalogue(run):
    r = run("data", "list")
    assert r.exit_code == 0, r.output
    for name in ("lambda-phage", "klebsiella", "gcide", "tango-icons", "elf-ls", "lambda-phage-zst"):
        assert name in r.output
    assert "shipped" in r.output


def test_data_list_keeps_every_name_whole_at_80_columns(run, monkeypatch):
    """Piped (rich's 80 columns): each name stands whole on one line, to be typed back."""
    monkeypatch.setenv("COLUMNS", "80")
    r = run("data", "list")
    assert r.exit_code == 0, r.output
    for name in datasets.load_catalogue():
        assert f"│ {name} " in r.output, name


def test_data_get_prints_the_folder(run, tmp_path):
    r = run("data", "get", "lambda-phage", "--dest", str(tmp_path / "out"))
    assert r.exit_code == 0, r.output
    folder = Path(r.stdout.strip().splitlines()[-1])
    assert folder == tmp_path / "out"
    assert (folder / "lambda_virus.fa").read_bytes() == LAMBDA.read_bytes()
    r = run("data", "get", "lambda-phage")  # default: the cache
    assert Path(r.stdout.strip().splitlines()[-1]) == tmp_path / "cache" / "datasets" / "lambda-phage"


def test_data_get_unknown_is_one_line_exit_2(run):
    r = run("data", "get", "no-such-data")
    assert r.exit_code == 2
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown dataset 'no-such-data'")


def test_data_get_not_installed_names_the_package(run, tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    (data / "catalogue.json").write_text(json.dumps({"version": 1, "datasets": [{
        "name": "ghost", "type": "text", "reader": "text", "licence": "public domain", "description": "d",
        "size": "1 kB", "sources": [
            {"kind": "debian", "package": "ghost-data", "files": [{"path": "/nonexistent/g.txt", "sha256": "0" * 64}]},
            {"kind": "url", "files": [{"url": (tmp_path / "nowhere.txt").as_uri(), "name": "g.txt",
                                       "sha256": "0" * 64}]}]}]}))
    monkeypatch.setattr(datasets, "datasets_dir", lambda: data)
    r = run("data", "get", "ghost")
    assert r.exit_code == 2
    line = r.output.strip()
    assert "\n" not in line and "apt-get install ghost-data" in line and "--download" in line
    r = run("data", "get", "ghost", "--download")
    assert r.exit_code == 2 and "download of" in r.output and "failed" in r.output
