"""The README as a newcomer reads it (issue 22, item 7): the CLI table names every command once,
the venv hint comes before the commands it is for, the test command says what it skips."""
from __future__ import annotations

import re
from pathlib import Path

import typer

from bytemodel.cli import app

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _cli_rows() -> list[str]:
    table = README.split("## CLI", 1)[1].split("\nPresets", 1)[0]
    return [l.split("|")[1] for l in table.splitlines() if l.startswith("| `")]


def test_the_cli_table_names_every_command_once():
    commands = set(typer.main.get_command(app).commands)
    named = [n for cell in _cli_rows() for n in dict.fromkeys(re.findall(r"`(?:bytemodel )?([a-z][a-z-]*)", cell))]
    named = [n for n in named if n in commands]
    assert sorted(set(named)) == sorted(commands), set(commands) - set(named)
    assert len(named) == len(set(named)), [n for n in named if named.count(n) > 1]


def test_the_quick_start_says_what_to_do_first_and_what_the_tests_skip():
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert quick.index("venv") < quick.index("```")          # the hint before the commands
    tests = quick.split("Run the tests", 1)[1]
    assert "3 minutes" in tests and ".ci/apt-packages.txt" in tests
    assert all(w in tests for w in ("GPU", "PyTorch", "Debian"))
    assert "progress=True" in README


def test_the_python_api_example_runs_as_written(tmp_path, monkeypatch):
    """The README's Python API block, run as written on the shipped genome (a 60 kB slice as
    genome.fa, its next 20 kB as other.fa; steps 500 and 1000 cut to 20 and 25 for time): every line
    runs, and what it says holds (the sample written is FASTA: one header, then only bases)."""
    import gzip
    pytest = __import__("pytest")
    pytest.importorskip("constriction")
    block = README.split("## Python API", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    assert "steps=500" in block and "steps=1000" in block
    block = block.replace("steps=500", "steps=20").replace("steps=1000", "steps=25")
    dna = gzip.open(Path(__file__).resolve().parents[1] / "datasets" / "klebsiella_hs11286_1m.fa.gz").read()
    (tmp_path / "genome.fa").write_bytes(dna[:60_000])
    (tmp_path / "other.fa").write_bytes(b">other\n" + dna[60_000:80_000].split(b"\n", 1)[1])
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {"print": lambda *a, **k: None})
    lines = (tmp_path / "sample.fa").read_bytes().splitlines()
    assert lines[0].startswith(b">") and lines[1:] and all(set(l) <= set(b"ACGT") for l in lines[1:]), lines[:3]
