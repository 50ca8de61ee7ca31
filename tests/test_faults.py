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
CORE_FILES = {"checkpoint.safetensors", "tokens.u16", "corpus.json", "metrics.jsonl",
              "best.safetensors", "loss.png", "baselines.json"}   # a finished CLI run's files


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
# 1. outputs that are device nodes or symlinks are written through, never replaced
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
        "generate": lambda out: ["generate", "-c", run, "--bytes", "20", "--out", out],
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
    assert one_error_line(*cli(["generate", "-c", trained, "--bytes", "5", "--out", tmp_path / "d"]))


# ================================================================================================
# 2. the run's token file is verified on resume
# ================================================================================================
def test_resume_refuses_a_flipped_bit_in_the_token_file(run_copy):
    tokens = run_copy / "tokens.u16"
    b = bytearray(tokens.read_bytes())
    b[1001] ^= 0x04
    tokens.write_bytes(bytes(b))
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "7", "-q"])
    assert one_error_line(code, out, "token"), out
    assert ck.load(run_copy).train["step"] == 5   # nothing trained, nothing saved


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
# The CLI in ONE child (one start-up for every case) that can take at most 3 GB of memory and write
# no file past 64 MB: before the fixes some cases read /dev/zero (or wrote it to disk) without end.
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
                        "--out", str(tmp_path / "run"), "--steps", "2"] + MODEL,
                       pass_fds=(r_fd,), capture_output=True, text=True, timeout=120, env=subprocess_env())
    os.close(r_fd)
    assert one_error_line(p.returncode, p.stderr + p.stdout, "not a regular file"), p.stderr
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
        "source": ["train", "--source", "/dev/zero", "--out", tmp / "r", "--steps", "2"] + MODEL,
        "score": ["score", "/dev/zero", "-c", trained],
        "prompt": ["generate", "-c", trained, "--bytes", "4", "--prompt", "@/dev/zero"],
        "prompt-file": ["generate", "-c", trained, "--bytes", "4", "--prompt-file", "/dev/zero"],
        "tokenizer": ["train", "--source", trained.parent / "toy.txt", "--tokenizer", "/dev/zero",
                      "--out", tmp / "r", "--steps", "2"] + MODEL,
        "stats": ["tokenizer", "stats", "-t", "/dev/zero", trained.parent / "toy.txt"],
        "decode": ["tokenizer", "decode", "-t", tok, "/dev/zero", "-o", tmp / "d.bin"],
        "checkpoint-info": ["info", link.parent],                     # a checkpoint linked to /dev/zero
        "checkpoint-generate": ["generate", "-c", link, "--bytes", "3"],
    })


@pytest.mark.parametrize("use", ["source", "score", "prompt", "prompt-file", "tokenizer", "stats", "decode",
                                 "checkpoint-info", "checkpoint-generate"])
def test_dev_zero_is_refused_everywhere(dev_zero_results, use):
    code, out = dev_zero_results[use]
    assert one_error_line(code, out, "/dev/zero", "not a regular file"), out[-3000:]


def test_dev_zero_is_refused_by_the_stream_reader():
    from bytemodel.readers import stream_documents
    with pytest.raises(SourceError, match="not a regular file"):
        next(iter(stream_documents("/dev/zero")))


# ================================================================================================
# 6. one `error:` line instead of a traceback
# ================================================================================================
def test_negative_seed(trained, tmp_path):
    src = trained.parent / "toy.txt"
    assert one_error_line(*cli(["train", "--source", src, "--out", tmp_path / "r", "--seed", "-1",
                                "--steps", "2"] + MODEL), "seed")
    assert not (tmp_path / "r").exists()
    assert one_error_line(*cli(["generate", "-c", trained, "--bytes", "3", "--seed", "-1"]), "seed")
    assert one_error_line(*cli(["gradcheck", "--seed", "-1", "--per-tensor", "1"]), "seed")
    big = tmp_path / "big.txt"
    big.write_bytes(bytes(range(256)) * 200)   # larger than the sample, so the seed is used
    assert one_error_line(*cli(["tokenizer", "train", "--source", big, "--merges", "2", "--seed", "-1",
                                "--max-sample-mb", "0.01", "-o", tmp_path / "t.json"]), "seed")


def test_prompt_with_bytes_that_are_not_utf8(trained, tmp_path):
    # a shell passes $'AC\xffGT' as those bytes; Python sees them surrogate-escaped
    out = tmp_path / "g.bin"
    code, text = cli(["generate", "-c", trained, "--bytes", "4", "--prompt", "AC\udcffGT", "--out", out])
    assert code == 0, text
    assert out.read_bytes().startswith(b"AC\xffGT")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_tokenizer_max_sample_mb_must_be_a_positive_number(trained, tmp_path, value):
    code, out = cli(["tokenizer", "train", "--source", trained.parent / "toy.txt", "--merges", "3",
                     "--max-sample-mb", value, "-o", tmp_path / "t.json"])
    assert one_error_line(code, out, "max-sample-mb"), out


def test_closed_stdout_is_one_line(trained):
    p = subprocess.run([sys.executable, "-m", "bytemodel.cli", "generate", "-c", str(trained), "--bytes", "5"],
                       preexec_fn=lambda: os.close(1), capture_output=False, stderr=subprocess.PIPE,
                       text=True, timeout=120, env=subprocess_env())
    assert one_error_line(p.returncode, p.stderr, "stdout"), p.stderr[-3000:]


@pytest.mark.parametrize("meta", ["null", "[1, 2]", '"text"', "{\"format\": \"bytemodel-checkpoint\", "
                                  "\"version\": 2, \"config\": [], \"tokenizer\": null, \"train\": 3}"])
def test_checkpoint_metadata_of_the_wrong_shape(run_copy, meta):
    from safetensors.numpy import load, save
    path = run_copy / ck.CKPT_NAME
    path.write_bytes(save(load(path.read_bytes()), metadata={"bytemodel": meta}))
    for args in (["info", run_copy, "--last"], ["generate", "-c", run_copy, "--last", "--bytes", "3"],
                 ["train", "--resume", "--out", run_copy, "--steps", "8", "-q"]):   # the file broken
        assert one_error_line(*cli(args), str(run_copy)), args


@pytest.mark.parametrize("state", [[1, 2], {"step": "five"}, {"step": 5, "config": None},
                                   {"step": 5, "config": [1]}, {"step": 5, "config": {"lr": "x"}},
                                   {"step": 5, "config": {"no_such_setting": 1}}])
def test_checkpoint_train_state_of_the_wrong_shape_with_a_valid_checksum(run_copy, state):
    ld = ck.load(run_copy)
    ck.save(run_copy / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params, state, ld.m, ld.v)
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "8", "-q"])
    assert one_error_line(code, out), out
    assert one_error_line(*cli(["info", run_copy])) or cli(["info", run_copy])[0] == 0


@pytest.mark.parametrize("content", ["{}", "null", "[]", "split0", "split_past_end", "not json"])
def test_corpus_json_damage_is_one_line(run_copy, content):
    p = run_copy / "corpus.json"
    info = json.loads(p.read_text())
    p.write_text({"split0": json.dumps({**info, "split": 0}),
                  "split_past_end": json.dumps({**info, "split": info["n_tokens"] + 5})}.get(content, content))
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "8", "-q"])
    assert one_error_line(code, out, "corpus"), out


def test_out_of_vocabulary_ids_in_a_resumed_corpus(run_copy):
    """Ids past the vocabulary (a crafted run whose hashes were updated to match) are refused."""
    import hashlib
    tokens = np.fromfile(run_copy / "tokens.u16", dtype="<u2")
    tokens[::7] = 60000
    tokens.tofile(run_copy / "tokens.u16")
    digest = hashlib.sha256(tokens.tobytes()).hexdigest()
    info = json.loads((run_copy / "corpus.json").read_text())
    (run_copy / "corpus.json").write_text(json.dumps({**info, "sha256": digest}))
    ld = ck.load(run_copy)
    ck.save(run_copy / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params, {**ld.train, "corpus_sha256": digest},
            ld.m, ld.v)
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "8", "-q"])
    assert one_error_line(code, out, "60000"), out


def test_out_of_vocabulary_ids_in_the_api_and_decode(tmp_path):
    from bytemodel.errors import TokenizerError
    from bytemodel.tokenizer import Tokenizer
    with pytest.raises(TokenizerError, match="300"):
        Tokenizer().decode([65, 300])
    tok = tmp_path / "tok.json"
    src = tmp_path / "s.txt"
    src.write_bytes(b"abab abab " * 30)
    assert cli(["tokenizer", "train", "--source", src, "--merges", "2", "-o", tok])[0] == 0
    ids = tmp_path / "ids.u16"
    ids.write_bytes(np.array([97, 9000], dtype="<u2").tobytes())
    assert one_error_line(*cli(["tokenizer", "decode", "-t", tok, ids, "-o", tmp_path / "d.bin"]), "9000")
    assert not (tmp_path / "d.bin").exists() and leftovers(tmp_path) == []   # item 7: no OUT.tmp


# ================================================================================================
# 7. no temp files after a kill or failure, no empty run folders, 253-byte output names
# ================================================================================================
def test_failed_run_leaves_no_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small = tmp_path / "small.txt"
    small.write_text("ACGT" * 5)   # too little data for one window: fails after the folder is made
    code, out = cli(["train", "--source", small, "--steps", "2"] + MODEL)
    assert one_error_line(code, out, "too little data"), out
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []
    # a run that fails after its corpus is built, before its first checkpoint (diverges)
    code, out = cli(["train", "--source", dna(tmp_path / "d.txt"), "--out", tmp_path / "div", "--steps", "4",
                     "--lr", "1e30", "--grad-clip", "0"] + MODEL)
    assert ends_in_error_line(code, out, "diverged"), out
    assert not (tmp_path / "div").exists()


def test_sigterm_before_the_first_checkpoint_leaves_no_run_folder(tmp_path):
    import time
    run = tmp_path / "run"
    args = [sys.executable, "-m", "bytemodel.cli", "train", "--source", str(dna(tmp_path / "d.txt")), "--out",
            str(run), "--steps", "100000", "--context", "32", "--batch-size", "4", "--eval-every", "100000",
            "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--d-ff", "64", "-q", "--no-baseline"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    deadline = time.time() + 60
    while time.time() < deadline and not (run / "metrics.jsonl").exists():
        time.sleep(0.05)
    assert (run / "metrics.jsonl").exists(), p.communicate()   # training under way, no checkpoint yet
    p.terminate()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert not run.exists()


def test_an_existing_out_folder_is_kept_after_a_failure(tmp_path):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    small = tmp_path / "small.txt"
    small.write_text("ACGT" * 5)
    assert one_error_line(*cli(["train", "--source", small, "--out", keep, "--steps", "2"] + MODEL))
    assert sorted(p.name for p in keep.iterdir()) == ["notes.txt"]


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
    assert one_error_line(code, text, "space"), text
    assert list(out_dir.iterdir()) == []


# ================================================================================================
# 8. metrics.jsonl after a resume: no duplicated steps, no glued truncated line
# ================================================================================================
def test_resume_trims_metrics_past_the_checkpoint_and_a_torn_last_line(run_copy):
    m = run_copy / "metrics.jsonl"
    lines = m.read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4, 5]
    # as if the process logged steps 6-7 after the step-5 checkpoint and died writing step 8
    extra = [json.dumps({**json.loads(lines[-1]), "step": s}) for s in (6, 7)]
    m.write_text("\n".join(lines + extra) + "\n" + '{"step": 8, "lo')
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "9", "-q"])
    assert code == 0, out
    steps = [json.loads(x)["step"] for x in m.read_text().splitlines()]   # every line parses
    assert steps == list(range(1, 10))


def test_fresh_run_into_a_folder_with_stale_metrics_starts_them_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"st')
    code, out = cli(["train", "--source", dna(tmp_path / "d.txt"), "--out", run, "--steps", "3"] + MODEL)
    assert code == 0, out
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


# ================================================================================================
# 9. `data get` re-verifies the SHA-256 of cached files
# ================================================================================================
def test_data_get_reverifies_a_cached_file_of_the_right_size(tmp_path, monkeypatch):
    from bytemodel import catalogue
    monkeypatch.setenv("BYTEMODEL_CACHE", str(tmp_path / "cache"))
    first = catalogue.get("lambda-phage")
    (f,) = [p for p in first.iterdir() if not p.name.startswith(".")]
    good = f.read_bytes()
    bad = bytearray(good)
    bad[100] ^= 0x01
    f.write_bytes(bytes(bad))          # same size, one bit off
    again = catalogue.get("lambda-phage")
    assert again == first
    assert f.read_bytes() == good       # fetched afresh from the verified source


# ================================================================================================
# 10. validations and messages
# ================================================================================================
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
                     "--steps", "1"] + MODEL + flags)
    assert one_error_line(code, out, *words), out
    assert not (tmp_path / "r").exists()


def test_workers_from_a_crafted_checkpoint_are_bounded(run_copy):
    from bytemodel.training.prepare import TrainConfig, prepare
    ld = ck.load(run_copy)
    state = {**ld.train, "config": {**ld.train["config"], "workers": 10 ** 6}}
    ck.save(run_copy / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params, state, ld.m, ld.v)
    with pytest.raises(ConfigError, match="workers"):
        prepare(TrainConfig(out_dir=str(run_copy), steps=8), resume=True)


def test_divergence_counts_steps_from_one(tmp_path):
    import bytemodel
    src = dna(tmp_path / "d.txt")
    bad = {**API, "lr": 1e30, "grad_clip": 0.0}
    with pytest.raises(BytemodelError, match="diverged at step ") as e:
        bytemodel.train(src, tmp_path / "a", steps=6, **bad)
    n = int(str(e.value).split("diverged at step ")[1].split()[0])
    # step n is counted as the metrics and the progress bar count (1 = the first step):
    # n - 1 steps train without trouble, n steps do not
    r = bytemodel.train(src, tmp_path / "b", steps=n - 1, **bad)
    assert [json.loads(x)["step"] for x in (r.run_dir / "metrics.jsonl").read_text().splitlines()][-1] == n - 1
    with pytest.raises(BytemodelError, match=f"diverged at step {n} "):
        bytemodel.train(src, tmp_path / "c", steps=n, **bad)


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
        code, out = cli(["train", "--source", d, "--out", tmp_path / "r", "--steps", "1"] + MODEL)
        assert one_error_line(code, out, "permission"), out
    finally:
        d.chmod(0o755)


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


def test_resume_says_which_given_settings_it_ignores(run_copy):
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "6", "-q", "--lr", "0.5",
                     "--batch-size", "9", "--seed", "3"])
    assert code == 0, out
    for flag in ("--lr", "--batch-size", "--seed"):
        assert flag in out and "ignored" in out, out
    cfg = ck.load(run_copy).train["config"]
    assert cfg["lr"] != 0.5 and cfg["batch_size"] == 4 and cfg["seed"] == 0
    # settings that equal the run's own are not worth a word
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "7", "-q", "--batch-size", "4"])
    assert code == 0 and "ignored" not in out, out


# ================================================================================================
# kill during save, over and over: each resume continues bit-identically, leaving nothing behind
# ================================================================================================
KILLER = r"""
import os, signal, stat, sys
mode, nth, out, src, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5] == "1"
import bytemodel
from bytemodel import checkpoint as ck
seen = 0
real_fsync, real_replace = os.fsync, os.replace

def our_save():
    return any(f.f_code.co_name == "save" and "checkpoint" in f.f_code.co_filename for f in _frames())

def _frames():
    f = sys._getframe(2)
    while f is not None:
        yield f
        f = f.f_back

def fsync(fd):
    global seen
    if mode == "torn" and stat.S_ISREG(os.fstat(fd).st_mode) and our_save():
        seen += 1
        if seen == nth:                       # half the bytes reached the disk, then the power went
            os.truncate(os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size // 2)
            os.kill(os.getpid(), signal.SIGKILL)
    return real_fsync(fd)

def replace(a, b):
    global seen
    if str(b).endswith(ck.CKPT_NAME) and mode in ("before-rename", "after-rename"):
        seen += 1
        if seen == nth and mode == "before-rename":
            os.kill(os.getpid(), signal.SIGKILL)
        real_replace(a, b)
        if seen == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return
    return real_replace(a, b)

os.fsync, os.replace = fsync, replace
settings = dict(preset="tiny", context=32, batch_size=4, eval_every=2, eval_tokens=128, warmup=2,
                model={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64})
if resume:
    bytemodel.train(None, out, resume=True, steps=12)
else:
    bytemodel.train(src, out, steps=12, **settings)
print("finished")
"""


def test_kill_during_save_again_and_again(tmp_path):
    import bytemodel
    src = dna(tmp_path / "d.txt")
    settings = dict(API, eval_every=2, eval_tokens=128)
    ref = tmp_path / "straight"
    bytemodel.train(src, ref, steps=12, **settings)
    want = ck.load(ref)

    run = tmp_path / "killed"
    schedule = [("torn", 2), ("before-rename", 1), ("after-rename", 2), ("torn", 1)]
    last_step = 0
    for i, (mode, nth) in enumerate(schedule):
        p = subprocess.run([sys.executable, "-c", KILLER, mode, str(nth), str(run), str(src), "1" if i else "0"],
                           capture_output=True, text=True, timeout=120, env=subprocess_env())
        assert p.returncode == -signal.SIGKILL, (mode, p.returncode, p.stdout, p.stderr[-2000:])
        ld = ck.load(run)                   # whatever the kill hit, a whole checkpoint is there
        step = ld.train["step"]
        assert step >= last_step and step % 2 == 0, (mode, step)
        last_step = step
    p = subprocess.run([sys.executable, "-c", KILLER, "none", "0", str(run), str(src), "1"],
                       capture_output=True, text=True, timeout=120, env=subprocess_env())
    assert p.returncode == 0 and "finished" in p.stdout, p.stderr[-2000:]
    got = ck.load(run)
    assert got.train["step"] == 12
    assert np.array_equal(got.params, want.params)          # bit for bit, after four kills
    assert np.array_equal(got.m, want.m) and np.array_equal(got.v, want.v)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13))
    assert set(os.listdir(run)) == CORE_FILES                # no temp file survives


def test_a_version_1_checkpoint_still_loads_and_its_weights_are_verified(tmp_path):
    """Models trained before the checksum covered everything stay usable: version 1 files load,
    their weights checked against the weights-only checksum they carry; a flipped weight is refused."""
    import json as _json
    from safetensors.numpy import save as st_save
    from bytemodel import checkpoint as ck
    from bytemodel.config import ModelConfig
    from bytemodel.errors import CheckpointError
    from bytemodel.model import Model, layout
    from bytemodel.ops import numpy_ops
    from bytemodel.tokenizer import Tokenizer
    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=16, context=8)
    m = Model(cfg, numpy_ops)
    m.init_weights(0)
    flat = np.asarray(m.params, dtype=np.float32)
    tensors = {n: np.ascontiguousarray(flat[o:o + int(np.prod(s))].reshape(s)) for n, s, o in layout(cfg)}
    meta = {"format": ck.FORMAT, "version": 1, "config": cfg.to_dict(), "tokenizer": Tokenizer().to_dict(),
            "train": {"step": 3}, "params_sha256": ck._sha(flat)}
    good = tmp_path / "v1.safetensors"
    good.write_bytes(st_save(tensors, metadata={"bytemodel": _json.dumps(meta)}))
    loaded = ck.load(good)
    assert np.array_equal(loaded.params, flat) and loaded.train["step"] == 3
    tensors["wte"] = tensors["wte"].copy()
    tensors["wte"][0, 0] += 1.0
    bad = tmp_path / "v1bad.safetensors"
    bad.write_bytes(st_save(tensors, metadata={"bytemodel": _json.dumps(meta)}))
    with pytest.raises(CheckpointError, match="corrupt"):
        ck.load(bad)


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
