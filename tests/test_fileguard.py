"""fileguard under fault injection (issue 17): outputs that are links, devices or FIFOs are written
through and never replaced; inputs that are not regular files are refused in one line; temporary
files have short names and none survive a failure or a kill."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from bytemodel import checkpoint as ck
from bytemodel.errors import SourceError
from conftest import CORE_FILES, MODEL_FLAGS, cli, leftovers, refused, subprocess_env


# ================================================================================================
# outputs that are device nodes, FIFOs or symlinks are written through, never replaced
# ================================================================================================
def _char_device(path: Path) -> bool:
    """A /dev/null twin at path (needs root); False when the machine does not allow it."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        return True
    except (PermissionError, OSError):
        return False


def _output_commands(run, tmp_path):
    src = tmp_path / "src.txt"
    src.write_bytes(b"hello hello world " * 50)
    tok = tmp_path / "tok.json"
    assert cli(["tokenizer", "train", "--source", src, "--merges", "3", "-o", tok])[0] == 0
    ids = tmp_path / "ids.u16"
    ids.write_bytes(np.array([104, 105], dtype="<u2").tobytes())
    return {
        # (--force: the symlink's target exists, and generate replaces an existing file only with it)
        "generate": lambda out: ["generate", "-c", run, "--bytes", "20", "--out", out, "--force"],
        "tokenizer-train": lambda out: ["tokenizer", "train", "--source", src, "--merges", "3", "-o", out],
        "tokenizer-encode": lambda out: ["tokenizer", "encode", "-t", tok, src, "-o", out],
        "tokenizer-decode": lambda out: ["tokenizer", "decode", "-t", tok, ids, "-o", out],
    }


@pytest.mark.parametrize("command", ["generate", "tokenizer-train", "tokenizer-encode", "tokenizer-decode"])
def test_output_symlink_is_written_through_not_replaced(trained, tmp_path, command):
    make = _output_commands(trained, tmp_path)[command]
    real = tmp_path / "real.out"
    real.write_bytes(b"old")
    link = tmp_path / "link.out"
    link.symlink_to(real)
    code, out = cli(make(link))
    assert code == 0, out
    assert link.is_symlink() and os.readlink(link) == str(real)   # the link survives
    assert real.read_bytes() != b"old" and real.stat().st_size > 0  # the content went to its target
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("command", ["generate", "tokenizer-train", "tokenizer-encode", "tokenizer-decode"])
def test_output_device_node_is_written_to_not_replaced(trained, tmp_path, command):
    node = tmp_path / "null"
    if not _char_device(node):
        pytest.skip("cannot create a device node here (not root)")
    make = _output_commands(trained, tmp_path)[command]
    code, out = cli(make(node))
    assert code == 0, out
    assert stat.S_ISCHR(os.lstat(node).st_mode)   # still the device, not a regular file
    assert leftovers(tmp_path) == []


def test_output_fifo_is_written_to_not_replaced(trained, tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    code, out = cli(["generate", "-c", trained, "--bytes", "20", "--prompt", "AC", "--out", fifo])
    reader.join(10)
    if reader.is_alive():   # the fix is missing: release the reader before failing
        with open(fifo, "wb"):
            pass
    assert code == 0, out
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got and got[0].startswith(b"AC") and len(got[0]) == 22


def test_output_directory_is_refused_in_one_line(trained, tmp_path):
    (tmp_path / "d").mkdir()
    assert refused(*cli(["generate", "-c", trained, "--bytes", "5", "--out", tmp_path / "d"]))



# ================================================================================================
# inputs: pipes, FIFOs and devices as sources, prompts, tokenizers and checkpoints
# ================================================================================================
LIMITED_CLI = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
from typer.testing import CliRunner
from bytemodel.cli import app
out = {}
for name, args in json.loads(sys.argv[1]).items():
    r = CliRunner().invoke(app, args)
    out[name] = [r.exit_code, r.output]
print(json.dumps(out))
"""


def run_limited(cases: dict) -> dict:
    """name -> (exit code, output) of each CLI argument list, run in the limited child."""
    cases = {k: [str(a) for a in v] for k, v in cases.items()}
    p = subprocess.run([sys.executable, "-c", LIMITED_CLI, json.dumps(cases)], capture_output=True, text=True,
                       timeout=300, env=subprocess_env())
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_fifo_source_is_refused_not_read_short(tmp_path):
    from bytemodel.readers import read_documents
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)

    def feed():
        try:
            with open(fifo, "wb") as f:
                f.write(b"A" * 10000)
        except OSError:
            pass
    result = []

    def attempt():
        try:
            result.append(sum(map(len, read_documents(fifo))))
        except SourceError as e:
            result.append(e)
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    reader = threading.Thread(target=attempt, daemon=True)
    reader.start()
    reader.join(10)
    for t in (feeder, reader):   # release whichever side still waits on the FIFO (bug or not)
        for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
            try:
                os.close(os.open(fifo, flags))
            except OSError:
                pass
        t.join(5)
    assert result and isinstance(result[0], SourceError), result
    assert "not a regular file" in str(result[0])


def test_pipe_source_through_the_cli_is_refused(tmp_path):
    r_fd, w_fd = os.pipe()
    os.write(w_fd, b"ACGT" * 3000)
    os.close(w_fd)
    p = subprocess.run([sys.executable, "-m", "bytemodel.cli", "train", "--source", f"/dev/fd/{r_fd}",
                        "--out", str(tmp_path / "run"), "--steps", "2"] + MODEL_FLAGS,
                       pass_fds=(r_fd,), capture_output=True, text=True, timeout=120, env=subprocess_env())
    os.close(r_fd)
    assert refused(p.returncode, p.stderr + p.stdout, "not a regular file"), p.stderr
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def dev_zero_results(trained, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("devzero")
    tok = tmp / "tok.json"
    assert cli(["tokenizer", "train", "--source", trained.parent / "toy.txt", "--merges", "2", "-o", tok])[0] == 0
    link = tmp / "ck" / "checkpoint.safetensors"
    link.parent.mkdir()
    link.symlink_to("/dev/zero")
    return run_limited({
        "source": ["train", "--source", "/dev/zero", "--out", tmp / "r", "--steps", "2"] + MODEL_FLAGS,
        "score": ["score", "/dev/zero", "-c", trained],
        "prompt": ["generate", "-c", trained, "--bytes", "4", "--prompt", "@/dev/zero"],
        "prompt-file": ["generate", "-c", trained, "--bytes", "4", "--prompt-file", "/dev/zero"],
        "tokenizer": ["train", "--source", trained.parent / "toy.txt", "--tokenizer", "/dev/zero",
                      "--out", tmp / "r", "--steps", "2"] + MODEL_FLAGS,
        "stats": ["tokenizer", "stats", "-t", "/dev/zero", trained.parent / "toy.txt"],
        "decode": ["tokenizer", "decode", "-t", tok, "/dev/zero", "-o", tmp / "d.bin"],
        "checkpoint-info": ["info", link.parent],                     # a checkpoint linked to /dev/zero
        "checkpoint-generate": ["generate", "-c", link, "--bytes", "3"],
    })


@pytest.mark.parametrize("use", ["source", "score", "prompt", "prompt-file", "tokenizer", "stats", "decode",
                                 "checkpoint-info", "checkpoint-generate"])
def test_dev_zero_is_refused_everywhere(dev_zero_results, use):
    code, out = dev_zero_results[use]
    assert refused(code, out, "/dev/zero", "not a regular file"), out[-3000:]


def test_dev_zero_is_refused_by_the_stream_reader():
    from bytemodel.readers import stream_documents
    with pytest.raises(SourceError, match="not a regular file"):
        next(iter(stream_documents("/dev/zero")))



# ================================================================================================
# temporary files: short names (253-byte targets), none left after a failure or a kill
# ================================================================================================
def test_253_byte_output_names_work(trained, tmp_path):
    name = "n" * 249 + ".bin"
    assert len(name.encode()) == 253
    code, out = cli(["generate", "-c", trained, "--bytes", "10", "--out", tmp_path / name])
    assert code == 0, out
    assert (tmp_path / name).stat().st_size == 10
    tok = tmp_path / ("t" * 248 + ".json")
    assert cli(["tokenizer", "train", "--source", trained.parent / "toy.txt", "--merges", "2", "-o", tok])[0] == 0
    assert tok.exists() and leftovers(tmp_path) == []


def test_stale_checkpoint_temp_of_a_killed_writer_is_removed(run_copy):
    """A temp file a SIGKILLed save left (its process is gone) is swept by the next save."""
    code = ("import os, signal, sys\n"
            "from bytemodel import checkpoint as ck\n"
            "real = os.fsync\n"
            "def die(fd):\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "os.fsync = die\n"
            "ld = ck.load(sys.argv[1])\n"
            "ck.save(sys.argv[1] + '/checkpoint.safetensors', ld.cfg, ld.tokenizer, ld.params, ld.train, ld.m, ld.v)\n")
    p = subprocess.run([sys.executable, "-c", code, str(run_copy)], env=subprocess_env(), timeout=120)
    assert p.returncode == -signal.SIGKILL
    assert set(os.listdir(run_copy)) - CORE_FILES, "the kill left no temp file: the probe is broken"
    assert ck.load(run_copy).train["step"] == 5   # the old checkpoint is intact
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "6", "-q"])
    assert code == 0, out
    assert set(os.listdir(run_copy)) == CORE_FILES


def test_tokenizer_encode_failure_leaves_no_temp(tmp_path):
    tok = tmp_path / "tok.json"
    src = tmp_path / "s.txt"
    src.write_bytes(b"abab abab " * 30)
    assert cli(["tokenizer", "train", "--source", src, "--merges", "2", "-o", tok])[0] == 0
    out_dir = tmp_path / "o"
    out_dir.mkdir()
    from bytemodel.tokenizer import Tokenizer

    def boom(self, src, dst, *a, **k):   # the disk fills up half way through
        dst.write(b"\0" * 1000)
        raise OSError(28, "No space left on device")
    orig = Tokenizer.encode_file
    Tokenizer.encode_file = boom
    try:
        code, text = cli(["tokenizer", "encode", "-t", tok, src, "-o", out_dir / "x.ids"])
    finally:
        Tokenizer.encode_file = orig
    assert refused(code, text, "space"), text
    assert list(out_dir.iterdir()) == []

