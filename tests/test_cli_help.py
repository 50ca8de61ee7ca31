"""Help and figures as a new user reads them (issue 22, item 8): no type placeholder on a flag,
arguments named plainly, --checkpoint's help says what it takes, info rounds, the examples'
summary columns line up."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import bytemodel
from bytemodel.cli import app

runner = CliRunner()
COMMANDS = ["train", "generate", "score", "info", "compress", "decompress", "eval", "plot", "finetune", "chat",
            "export", "import-hf", "readers", "gradcheck"]


@pytest.mark.parametrize("cmd", COMMANDS)
def test_help_has_no_placeholders(cmd, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    out = runner.invoke(app, [cmd, "--help"]).output
    assert "<bool>" not in out and not re.search(r"\{[a-z_]+\}|<list\[", out), out


def test_help_says_what_checkpoint_and_baseline_take(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    gen = runner.invoke(app, ["generate", "--help"]).output
    assert "A run directory (its best weights" in gen and "--any-byte" in gen
    tr = runner.invoke(app, ["train", "--help"]).output
    assert "xz -9e" in tr and "xz -9 " not in tr
    monkeypatch.setenv("COLUMNS", "80")
    top = runner.invoke(app, ["--help"]).output
    plot = top.split("│ plot", 1)[1].split("│ data", 1)[0]
    assert "compressors' figures" in re.sub(r"\s*│\s*", " ", plot), plot   # one sentence, not cut
    assert not re.search(r"compressors'\s*│\s*\n", top)       # the plot line is not cut mid-sentence


def test_info_rounds_its_figures(tmp_path, dna_file, fast_settings):
    bytemodel.train(dna_file, tmp_path / "r", steps=5, **fast_settings)
    out = runner.invoke(app, ["info", str(tmp_path / "r")]).output
    assert not re.search(r"\d\.\d{5,}", out) and re.search(r"validation \d\.\d{4} ± \d\.\d{4} bits/byte", out), out


def test_the_examples_summary_columns_line_up():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    try:
        from _common import summary_lines
    finally:
        sys.path.pop(0)
    for steps in (3, 300, 12000):
        rows = summary_lines(steps, 1.983, dict(zstd19=2.034, zstd19_tail=2.1, xz9=2.191, xz9_tail=2.3))
        numbers = {re.search(r"\d\.\d{3}", r).start() for r in rows}
        assert len(numbers) == 1, rows
