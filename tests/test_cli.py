"""The CLI through typer's runner: the commands users know us by, and bad input as one line."""
import os

import pytest
from typer.testing import CliRunner

from bytemodel.cli import app

runner = CliRunner()
SMALL = ["--preset", "tiny", "--context", "32", "--batch-size", "4", "--eval-every", "5",
         "--eval-tokens", "256", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--d-ff", "64", "-q"]


def run(args, **kw):
    r = runner.invoke(app, args, **kw)
    return r.exit_code, r.output


def one_line_error(out):
    lines = [l for l in out.strip().splitlines() if l.strip()]
    return len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out


def test_train_generate_score_info(tmp_path, dna_file):
    run_dir = tmp_path / "run"
    code, out = run(["train", "--source", str(dna_file), "--steps", "6", "--out", str(run_dir)] + SMALL)
    assert code == 0, out
    assert "bits/byte" in out and "zstd -19" in out and "xz -9e" in out and "held-out tail" in out
    code, out = run(["generate", "--bytes", "64", "--checkpoint", str(run_dir), "--seed", "3"])
    assert code == 0 and len(out.encode("latin-1", "replace")) >= 1
    target = tmp_path / "g.bin"
    code, out = run(["generate", "-n", "100", "-c", str(run_dir), "--out", str(target), "--prompt", "ACG"])
    assert code == 0 and target.stat().st_size == 100, out
    code, out = run(["score", str(dna_file), "-c", str(run_dir)])
    assert code == 0 and "bits/byte" in out
    code, out = run(["info", str(run_dir)])
    assert code == 0 and "step 6 of 6" in out
    # resume to more steps
    code, out = run(["train", "--resume", "--out", str(run_dir), "--steps", "8", "-q"])
    assert code == 0 and "step 8" in out, out


def test_generate_defaults_to_latest_run(tmp_path, dna_file, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out = run(["train", "--source", str(dna_file), "--steps", "3", "--no-baseline"] + SMALL)
    assert code == 0, out
    assert (tmp_path / "runs" / "toy-1" / "checkpoint.safetensors").exists()
    code, out = run(["generate", "--bytes", "20", "--out", "x.bin"])
    assert code == 0 and (tmp_path / "x.bin").stat().st_size == 20


def test_gradcheck_command():
    code, out = run(["gradcheck", "--per-tensor", "3"])
    assert code == 0, out
    assert "layers.1.w_down" in out and "all " in out


@pytest.mark.parametrize("args", [
    ["train", "--source", "/no/such/file"],
    ["train"],
    ["train", "--source", "{dna}", "--steps", "-3"],
    ["train", "--source", "{dna}", "--lr", "0"],
    ["train", "--source", "{dna}", "--preset", "giant"],
    ["train", "--source", "{dna}", "--device", "tpu"],
    ["train", "--source", "{dna}", "--precision", "fp16"],
    ["train", "--source", "{dna}", "--context", "100000"],
    ["train", "--resume", "--out", "{tmp}/nothing-here"],
    ["generate", "--checkpoint", "{tmp}/nothing-here"],
    ["generate", "--checkpoint", "{dna}"],
    ["generate", "--bytes", "-5"],
    ["score", "{dna}", "--checkpoint", "{tmp}/none"],
])
def test_bad_input_is_one_line(tmp_path, dna_file, args, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = [a.format(dna=dna_file, tmp=tmp_path) for a in args]
    code, out = run(args)
    assert code == 2, (code, out)
    assert one_line_error(out), out


def test_no_runs_yet(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out = run(["generate", "--bytes", "5"])
    assert code == 2 and "no trained run" in out
