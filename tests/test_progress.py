"""The progress display (issue 22, item 2): at any width from 60 columns the step n/N, bits/byte
(train and last validation), speed and ETA stay; not on a terminal, one plain line per validation."""
from __future__ import annotations

import io
import re

import pytest

from bytemodel.training.progress import MIN_WIDTH, Progress, line

FIGURES = dict(step=12345, total=100000, bpb=1.9531, val=1.96241, bytes_per_s=123456.0, eta=36000.0 * 3,
               elapsed=4000.0, epoch=9.85, loss=1.354)


@pytest.mark.parametrize("width", range(MIN_WIDTH, 201, 7))
def test_the_essential_fields_fit_every_width(width):
    text, at, w = line(width, **FIGURES)
    assert len(text) <= width - 1
    assert "12345/100000" in text and "1.953" in text and "val 1.9624" in text
    assert re.search(r"123\.5 ?kB/s", text) and "eta 30:00:00" in text
    if w:
        assert text[at:at + w] == " " * w


def test_less_important_fields_go_first():
    wide, _, _ = line(200, **FIGURES)
    assert all(f in wide for f in ("epoch 9.85", "loss 1.354", "1:06:40"))
    mid, _, _ = line(100, **FIGURES)
    assert "epoch 9.85" in mid and "loss" not in mid         # the loss in nats goes before the epoch
    assert "loss" not in line(MIN_WIDTH, **FIGURES)[0] and "epoch" not in line(MIN_WIDTH, **FIGURES)[0]


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_of_80_columns_shows_step_eta_and_speed(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = Tty()
    with Progress(True, 300, 0, stream=out) as bar:
        bar.update(120, {"bpb": 1.953, "loss": 1.354, "bytes_per_s": 5800.0}, 1.9624, 9.85)
        bar.validation(100, 9.0, 1.96, 1.9624, 0.004, True, 5800.0)
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    last = [l for l in shown.splitlines() if "step 120/300" in l][-1]
    assert len(last) <= 80 and "val 1.9624" in last and "5.8 kB/s" in last and "eta " in last, shown
    assert "step 100/300 (epoch 9.00): train 1.960, val 1.9624 ± 0.0040 bits/byte (best)" in shown


def test_not_a_terminal_one_plain_line_per_validation():
    out = io.StringIO()
    with Progress(True, 30, 0, stream=out) as bar:
        for s in range(1, 31):
            bar.update(s, {"bpb": 2.0, "loss": 1.4, "bytes_per_s": 1000.0}, None)
            if s % 10 == 0:
                bar.validation(s, s / 10, 2.0, 1.99, 0.01, False, 1000.0)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and "\x1b" not in out.getvalue() and "\r" not in out.getvalue()
    assert lines[0].startswith("step 10/30 (epoch 1.00): train 2.000, val 1.9900 ± 0.0100 bits/byte | 1.0 kB/s")
    assert "eta" in lines[0] and "elapsed" in lines[0]


def test_one_window_held_out_shows_no_error_bar():
    """One held-out window has no standard error (NaN): the line says the figure without "± nan"."""
    out = io.StringIO()
    with Progress(True, 10, 0, stream=out) as bar:
        bar.validation(10, 1.0, 2.0, 1.7478, float("nan"), True, 1000.0)
        bar.validation(10, 1.0, 2.0, 1.7478, None, True, 1000.0)
    text = out.getvalue()
    assert "nan" not in text and "None" not in text and text.count("val 1.7478 bits/byte (best)") == 2, text


def test_the_cli_writes_plain_lines_when_stderr_is_a_file(tmp_path, dna_file):
    import subprocess
    import sys
    err = tmp_path / "err.log"
    with open(err, "w") as f:
        r = subprocess.run([sys.executable, "-m", "bytemodel.cli", "train", "--source", str(dna_file), "--steps", "10",
                            "--out", str(tmp_path / "run"), "--preset", "tiny", "--context", "32", "--batch-size", "4",
                            "--eval-every", "5", "--eval-tokens", "256", "--d-model", "32", "--n-layers", "2",
                            "--n-heads", "2", "--d-ff", "64", "--no-baseline"], stderr=f, stdout=subprocess.PIPE,
                           env={**__import__("os").environ, "COLUMNS": "80"}, timeout=300)
    assert r.returncode == 0
    log = err.read_text()
    vals = [l for l in log.splitlines() if " val " in l]
    assert len(vals) == 2 and vals[0].startswith("step 5/10 (epoch") and "\x1b" not in log and "━" not in log, log
