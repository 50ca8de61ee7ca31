"""The CLI under fault injection (issue 17): bad values are one `error:` line before any work, and a
closed or early-closed stdout ends quietly."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import MODEL_FLAGS, cli, dna, refused, subprocess_env


# ================================================================================================
# bad values: one `error:` line before any work, instead of a traceback
# ================================================================================================
def test_negative_seed(trained, tmp_path):
    src = trained.parent / "toy.txt"
    assert refused(*cli(["train", "--source", src, "--out", tmp_path / "r", "--seed", "-1",
                                "--steps", "2"] + MODEL_FLAGS), "seed")
    assert not (tmp_path / "r").exists()
    assert refused(*cli(["generate", "-c", trained, "--bytes", "3", "--seed", "-1"]), "seed")
    assert refused(*cli(["gradcheck", "--seed", "-1", "--per-tensor", "1"]), "seed")
    big = tmp_path / "big.txt"
    big.write_bytes(bytes(range(256)) * 200)   # larger than the sample, so the seed is used
    assert refused(*cli(["tokenizer", "train", "--source", big, "--merges", "2", "--seed", "-1",
                                "--max-sample-mb", "0.01", "-o", tmp_path / "t.json"]), "seed")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_tokenizer_max_sample_mb_must_be_a_positive_number(trained, tmp_path, value):
    code, out = cli(["tokenizer", "train", "--source", trained.parent / "toy.txt", "--merges", "3",
                     "--max-sample-mb", value, "-o", tmp_path / "t.json"])
    assert refused(code, out, "max-sample-mb"), out


@pytest.mark.parametrize("flags,words", [
    (["--workers", "100000"], ["workers"]),
    (["--grad-clip", "nan"], ["grad-clip"]),
    (["--weight-decay", "nan"], ["weight-decay"]),
    (["--weight-decay", "inf"], ["weight-decay"]),
    (["--rope-theta", "inf"], ["rope_theta"]),
    (["--rope-theta", "nan"], ["rope_theta"]),
    (["--warmup", "-2"], ["warmup"]),          # -1 is "the preset's"
])
def test_bad_numbers_are_refused_before_any_work(tmp_path, flags, words):
    code, out = cli(["train", "--source", dna(tmp_path / "d.txt"), "--out", tmp_path / "r",
                     "--steps", "1"] + MODEL_FLAGS + flags)
    assert refused(code, out, *words), out
    assert not (tmp_path / "r").exists()


def test_prompt_with_bytes_that_are_not_utf8(trained, tmp_path):
    # a shell passes $'AC\xffGT' as those bytes; Python sees them surrogate-escaped
    out = tmp_path / "g.bin"
    code, text = cli(["generate", "-c", trained, "--bytes", "4", "--prompt", "AC\udcffGT", "--out", out])
    assert code == 0, text
    assert out.read_bytes().startswith(b"AC\xffGT")



# ================================================================================================
# stdout closed or closed early
# ================================================================================================
def test_closed_stdout_is_one_line(trained):
    p = subprocess.run([sys.executable, "-m", "bytemodel.cli", "generate", "-c", str(trained), "--bytes", "5"],
                       preexec_fn=lambda: os.close(1), capture_output=False, stderr=subprocess.PIPE,
                       text=True, timeout=120, env=subprocess_env())
    assert refused(p.returncode, p.stderr, "stdout"), p.stderr[-3000:]


def test_generate_into_a_pipe_closed_early_ends_quietly(tmp_path):
    """`bytemodel generate | head -c 10`: the reader stops early; no `error: Broken pipe`, no
    traceback, and the status a SIGPIPE'd process reports (141)."""
    src = tmp_path / "toy.txt"
    src.write_bytes(b"ACGT" * 2000)
    r = subprocess.run([sys.executable, "-m", "bytemodel.cli", "train", "--source", str(src), "--steps", "2",
                        "--context", "16", "--batch-size", "2", "--d-model", "16", "--n-layers", "1",
                        "--n-heads", "2", "--d-ff", "16", "--out", str(tmp_path / "run"), "-q"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    gen = subprocess.Popen([sys.executable, "-m", "bytemodel.cli", "generate", "-c", str(tmp_path / "run"),
                            "--bytes", "200000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = gen.stdout.read(10)
    gen.stdout.close()                      # the reader goes away, as `head` does
    err = gen.stderr.read().decode()
    gen.wait(timeout=120)
    assert len(first) == 10
    assert "Broken pipe" not in err and "Traceback" not in err, err
    assert gen.returncode == 141, (gen.returncode, err)



def test_train_and_tokenizer_train_take_the_source_as_an_argument(tmp_path):
    """`bytemodel train FILE` as `score FILE` and `compress FILE` take theirs (before: "unexpected extra
    argument"); --source still works; both given and different is one error line, nothing trained."""
    src = dna(tmp_path / "d.txt")
    code, out = cli(["train", src, "--out", tmp_path / "r", "--steps", "2"] + MODEL_FLAGS)
    assert code == 0, out
    from bytemodel import load
    assert load(tmp_path / "r").data.source == str(src)
    same = cli(["train", src, "--source", src, "--out", tmp_path / "r2", "--steps", "2"] + MODEL_FLAGS)
    assert same[0] == 0, same[1]
    assert refused(*cli(["train", src, "--source", tmp_path / "other.txt", "--out", tmp_path / "r3",
                         "--steps", "2"] + MODEL_FLAGS), "two sources")
    assert not (tmp_path / "r3").exists()
    assert refused(*cli(["train", "--out", tmp_path / "r4"] + MODEL_FLAGS), "train PATH")
    code, out = cli(["tokenizer", "train", src, "--merges", "2", "-o", tmp_path / "t.json"])
    assert code == 0 and (tmp_path / "t.json").is_file(), out
    assert refused(*cli(["tokenizer", "train", src, "--source", tmp_path / "x", "--merges", "2",
                         "-o", tmp_path / "u.json"]), "two sources")
    assert refused(*cli(["tokenizer", "train", "--merges", "2", "-o", tmp_path / "u.json"]), "tokenizer train PATH")
    assert not (tmp_path / "u.json").exists()


def test_a_file_that_is_not_a_checkpoint_is_named_for_what_it_is(tmp_path):
    """A .bmz, a tokenizer, an image given where a checkpoint belongs: one error line saying what
    the file looks like (before: "not a valid bytemodel checkpoint (bad header length)")."""
    from bytemodel.compress.container import MAGIC
    cases = {"x.bmz": (MAGIC + bytes(64), "bytemodel compress"),
             "tok.json": (b'{"format":"bytemodel-tokenizer","version":1,"merges":[]}', "tokenizer"),
             "loss.png": (b"\x89PNG\r\n\x1a\n" + bytes(64), "PNG image"),
             "notes.txt": (b"hello, not a checkpoint", "not a valid bytemodel checkpoint")}
    for name, (data, words) in cases.items():
        f = tmp_path / name
        f.write_bytes(data)
        assert refused(*cli(["info", f]), words), name
        assert refused(*cli(["generate", "-c", f, "--bytes", "3"]), words), name


# ================================================================================================
# usage mistakes (an option that does not exist, a value of the wrong kind, a missing argument):
# one `error:` line as well, through the command users run (cli.main), not click's boxed usage
# (the program is named as it was started: `python -m bytemodel.cli` here, `bytemodel` installed)
# ================================================================================================
@pytest.mark.parametrize("args,words", [
    (["train", "--stepz", "5"], ["No such option: --stepz", "bytemodel.cli train --help' lists the options"]),
    (["generate", "--bytes", "abc"], ["Invalid value for '--bytes'", "generate --help' lists the options"]),
    (["score"], ["Missing argument 'FILE'", "score --help' lists the options"]),
    (["frobnicate"], ["No such command 'frobnicate'", "bytemodel.cli --help' lists the commands"]),
])
def test_a_usage_mistake_is_one_error_line(args, words):
    p = subprocess.run([sys.executable, "-m", "bytemodel.cli", *args], capture_output=True, text=True,
                       env=subprocess_env(), timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert p.stdout == ""


def test_help_and_the_bare_command_still_print_the_help():
    p = subprocess.run([sys.executable, "-m", "bytemodel.cli", "train", "--help"], capture_output=True,
                       text=True, env=subprocess_env(), timeout=120)
    assert p.returncode == 0 and "--steps" in p.stdout, p.stderr
    p = subprocess.run([sys.executable, "-m", "bytemodel.cli"], capture_output=True, text=True,
                       env=subprocess_env(), timeout=120)
    assert p.returncode == 2 and "train" in p.stdout + p.stderr and "error:" not in p.stderr
