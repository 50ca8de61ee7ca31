"""Hostile and unlucky inputs (issue 23, items 3, 4, 7, 8): bombs bounded by what a file really
holds, one `error:` line instead of a traceback, resumes that notice an edited run."""
from __future__ import annotations

import bz2
import json
import os
import struct
import sys
import tracemalloc
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.errors import BytemodelError, CheckpointError, SourceError, TokenizerError
from conftest import FAST
from conftest import cli as _cli, one_error_line as _one_error_line  # noqa: E402


def _settings(**kw):
    return {**FAST, "model": dict(FAST["model"]), **kw}






@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    (d / "toy.txt").write_bytes(b"ACGTTGCAACGGTTCA" * 300)
    bytemodel.train(str(d / "toy.txt"), str(d / "R"), steps=4, **_settings())
    return d


def _copy_run(run, dst: Path) -> Path:
    import shutil
    shutil.copytree(run / "R", dst)
    return dst


def _resave(path: Path, edit_meta=None, edit_params=None, version=None):
    """Rewrite a checkpoint with edited metadata, re-signed as the writer would (or as version 1)."""
    from safetensors.numpy import load_file, save as st_save
    tensors = load_file(str(path))
    from safetensors import safe_open
    with safe_open(str(path), "numpy") as f:
        meta = json.loads(f.metadata()["bytemodel"])
    if edit_meta:
        edit_meta(meta)
    if edit_params:
        edit_params(tensors)
    if version == 1:
        meta["version"] = 1
        meta.pop("sha256", None)
        ld_cfg = bytemodel.ModelConfig.from_dict(meta["config"])
        from bytemodel.model import buffer_size, layout
        flat = np.zeros(buffer_size(ld_cfg), np.float32)
        for name, shape, off in layout(ld_cfg):
            flat[off:off + tensors[name].size] = tensors[name].reshape(-1)
        meta["params_sha256"] = ck._sha(flat)
    else:
        meta["sha256"] = ck.digest(meta, tensors)
    path.write_bytes(st_save(tensors, metadata={"bytemodel": json.dumps(meta)}))


# ------------------------------------------------------------------------------ checkpoints

def test_checkpoint_metadata_nested_deep_is_one_error(run, tmp_path):
    from safetensors.numpy import save as st_save
    p = tmp_path / "deep.safetensors"
    p.write_bytes(st_save({"x": np.zeros(1, np.float32)}, metadata={"bytemodel": "[" * 100000 + "]" * 100000}))
    with pytest.raises(CheckpointError, match="nested deeper|not a valid"):
        ck.load(p)


def test_non_finite_weights_are_refused_on_load(run, tmp_path):
    R = _copy_run(run, tmp_path / "nan")
    _resave(R / "best.safetensors", edit_params=lambda t: t["norm_f"].__setitem__(0, np.nan))
    with pytest.raises(CheckpointError, match="NaN or infinity"):
        ck.load(R / "best.safetensors")
    code, out = _cli(["score", run / "toy.txt", "-c", R])
    assert code == 2 and _one_error_line(out) and "NaN" in out, out


def test_a_checkpoint_without_optimizer_state_is_refused(run, tmp_path):
    R = _copy_run(run, tmp_path / "noopt")
    _resave(R / ck.CKPT_NAME, edit_meta=lambda m: m["train"].pop("optim"))
    code, out = _cli(["train", "--resume", "--out", R, "--steps", 8])
    assert code == 2 and _one_error_line(out) and "optimizer" in out, out


def test_a_version_2_checkpoint_re_signed_as_1_is_refused(run, tmp_path):
    R = _copy_run(run, tmp_path / "v1")
    _resave(R / ck.CKPT_NAME, edit_meta=lambda m: m["train"].update(step=1), version=1)
    with pytest.raises(CheckpointError, match="re-signed"):
        ck.load(R / ck.CKPT_NAME)


# -------------------------------------------------------------------------- corpus.json

def test_an_edited_split_or_size_does_not_resume(run, tmp_path):
    for key, change in (("split", -7), ("n_bytes", 5)):
        R = _copy_run(run, tmp_path / key)
        info = json.loads((R / "corpus.json").read_text())
        info[key] += change
        (R / "corpus.json").write_text(json.dumps(info))
        with pytest.raises(CheckpointError, match="not the one"):
            bytemodel.train("", str(R), resume=True, steps=8)
    R = _copy_run(run, tmp_path / "zero")
    info = json.loads((R / "corpus.json").read_text())
    info["n_bytes"] = 0
    (R / "corpus.json").write_text(json.dumps(info))
    code, out = _cli(["train", "--resume", "--out", R, "--steps", 8])
    assert code == 2 and _one_error_line(out) and "corpus.json" in out, out
    (R / "corpus.json").write_text("[" * 50000)
    code, out = _cli(["train", "--resume", "--out", R, "--steps", 8])
    assert code == 2 and _one_error_line(out), out


def test_tok_json_nested_or_infinite_is_one_error(tmp_path):
    for text in ("[" * 100000, '{"format": "bytemodel-tokenizer", "version": Infinity}'):
        (tmp_path / "tok.json").write_text(text)
        with pytest.raises(TokenizerError, match="not valid JSON"):
            bytemodel.Tokenizer.load(tmp_path / "tok.json")


# ------------------------------------------------------------------------------ import-hf

@pytest.fixture(scope="module")
def hf_dir(run, tmp_path_factory):
    from bytemodel.hf.export import export_hf
    d = tmp_path_factory.mktemp("hf") / "hf"
    export_hf(run / "R", d)
    return d


def _hf_variant(hf_dir, tmp_path, name, config_edit=None, weights_edit=None, raw_config=None):
    import shutil
    d = tmp_path / name
    shutil.copytree(hf_dir, d)
    if raw_config is not None:
        (d / "config.json").write_text(raw_config)
    elif config_edit:
        cfg = json.loads((d / "config.json").read_text())
        config_edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    if weights_edit:
        from safetensors.numpy import load_file, save_file
        t = load_file(str(d / "model.safetensors"))
        weights_edit(t)
        save_file(t, str(d / "model.safetensors"))
    return d


def test_import_hf_bombs_and_non_finite_values(hf_dir, tmp_path):
    cfg = json.loads((hf_dir / "config.json").read_text())
    text = json.dumps(cfg)
    cases = {
        "layers": (_hf_variant(hf_dir, tmp_path, "layers", lambda c: c.update(num_hidden_layers=1e9)), "layers"),
        "inf": (_hf_variant(hf_dir, tmp_path, "inf", raw_config=text.replace(
            f'"hidden_size": {cfg["hidden_size"]}', '"hidden_size": Infinity')), "Infinity"),
        "context": (_hf_variant(hf_dir, tmp_path, "ctx", lambda c: c.update(max_position_embeddings=10 ** 18)), "context"),
        "nan": (_hf_variant(hf_dir, tmp_path, "nan", weights_edit=lambda t: t["model.norm.weight"].__setitem__(0, np.nan)),
                "NaN"),
        "deep": (_hf_variant(hf_dir, tmp_path, "deep", raw_config="[" * 100000), "nested"),
    }
    tracemalloc.start()
    try:
        for name, (d, word) in cases.items():
            code, out = _cli(["import-hf", d, "--out", tmp_path / f"out-{name}"])
            assert code == 2 and _one_error_line(out) and word in out, (name, out)
            assert not (tmp_path / f"out-{name}" / ck.CKPT_NAME).exists()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 256 << 20, peak      # num_hidden_layers 1e9 asked for 7.6 GB


# ------------------------------------------------------------------------------ finetune

def test_finetune_bad_examples_are_one_error_line(run, tmp_path):
    cases = {
        "surrogate": '{"prompt": "\\ud800", "completion": "x"}\n' * 4,
        "empty": '{"prompt": "", "completion": ""}\n' * 6,
        "deep": "[" * 100000 + "\n",
    }
    for name, text in cases.items():
        p = tmp_path / f"{name}.jsonl"
        p.write_text(text)
        code, out = _cli(["finetune", "--from", run / "R", "--pairs", p, "--out", tmp_path / f"ft-{name}",
                          "--steps", 2, "-q"])
        assert code == 2 and _one_error_line(out), (name, out)
        assert not (tmp_path / f"ft-{name}").exists()


def test_finetune_examples_must_be_regular_files(run, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for flag in ("--pairs", "--chat"):
        code, out = _cli(["finetune", "--from", run / "R", flag, fifo, "--out", tmp_path / "ft", "--steps", 2, "-q"])
        assert code == 2 and _one_error_line(out) and "not a regular file" in out, out
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"prompt": "a", "completion": "b"}\n' * 8)
    code, out = _cli(["finetune", "--from", run / "R", "--pairs", ok, "--val", "/dev/zero", "--out", tmp_path / "ft",
                      "--steps", 2, "-q"])
    assert code == 2 and _one_error_line(out) and "not a regular file" in out, out


def test_eval_tokens_bounds_one_long_held_out_example():
    from bytemodel.pairs import build_examples
    import tempfile
    tok = bytemodel.Tokenizer()
    with tempfile.TemporaryDirectory() as d:
        corpus = build_examples(d, tok, "pairs", [(b"p", b"c" * 10)] * 3, [(b"q", b"x" * 200_000)])
        windows = corpus.eval_windows(64, 1000)
        counted = sum(int(m.sum()) for _, _, m in windows)
        assert 0 < counted <= 1000 + 64, counted     # the budget, give or take one window


# ------------------------------------------------------------------------------ chat

@pytest.fixture(scope="module")
def chat_ckpt(run):
    """The run's model with the chat specials (its vocabulary grown as a chat fine-tune's is)."""
    from bytemodel.chat_template import chat_tokenizer
    from bytemodel.lineage import grow_vocab
    ld = ck.load(run / "R" / ck.BEST_NAME)
    tok = chat_tokenizer(ld.tokenizer)
    cfg = bytemodel.ModelConfig.from_dict({**ld.cfg.to_dict(), "vocab_size": tok.vocab_size})
    return ck.save(run / "chat.safetensors", cfg, tok, grow_vocab(ld.params, ld.cfg, cfg, doc_id=ld.tokenizer.doc_id))


def test_chat_with_closed_streams_or_odd_bytes(chat_ckpt, monkeypatch):
    from bytemodel.chat import MAX_LINE, Chat, repl
    lm = bytemodel.load(chat_ckpt)
    c = Chat(lm.model, lm.tokenizer, b"\xff\xfe", 0.0, 0, 1.0, 0, 4)
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(BytemodelError, match="stdin is closed"):
        repl(c)
    monkeypatch.undo()
    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(BytemodelError, match="stdout is closed"):
        repl(c, stdin=__import__("io").BytesIO(b"hi\n"))
    monkeypatch.undo()
    import io

    class Endless(io.RawIOBase):       # one line that never ends: must not be read whole
        def readable(self):
            return True

        def readinto(self, b):
            b[:] = b"a" * len(b)
            return len(b)
    tracemalloc.start()
    try:
        with pytest.raises(BytemodelError, match="a line of more than"):
            repl(c, stdin=io.BufferedReader(Endless()), stdout=io.BytesIO(), stderr=io.StringIO())
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 8 * MAX_LINE
    code, out = _cli(["chat", chat_ckpt, "--system", os.fsdecode(b"\xff\xfe"), "--max-bytes", 4], input="hi\n")
    assert code == 0 and "Traceback" not in out, out


# ------------------------------------------------------------------------------ readers

def test_a_wav_declaring_32_hz_is_refused(tmp_path):
    pytest.importorskip("soundfile")
    import wave
    p = tmp_path / "x.wav"
    with wave.open(str(p), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(32)
        w.writeframes(np.zeros(50_000, "<i2").tobytes())
    with pytest.raises(SourceError, match="sample rate of 32 Hz"):
        list(bytemodel.readers.read_documents(p, "audio"))


def _png_header_only(w: int, h: int, depth: int = 16) -> bytes:
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", w, h, depth, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 1000)) + chunk(b"IEND", b"")


def test_a_png_bomb_is_one_line_without_pillow_warnings(tmp_path):
    pytest.importorskip("PIL")
    p = tmp_path / "bomb.png"
    p.write_bytes(_png_header_only(13000, 13000))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(SourceError, match="pixels"):
            list(bytemodel.readers.read_documents(p, "image"))
    assert not [w for w in seen if "DecompressionBomb" in type(w.message).__name__], seen


def test_workers_are_bounded_by_cores():
    from bytemodel.config import preset
    from bytemodel.model import Model
    from bytemodel.ops import get_backend
    from bytemodel.training.runner import THREADS_PER_CORE, CoreParallel, cores
    m = Model(preset("tiny", 257, d_model=32, n_layers=1, n_heads=2, d_ff=32, context=16), get_backend("cpu"))
    cp = CoreParallel(m, workers=256)
    try:
        assert cp.workers <= THREADS_PER_CORE * cores() and len(cp.replicas) == cp.workers
    finally:
        cp.close()


def test_tokenizer_train_on_a_bz2_bomb_reads_a_bounded_amount(tmp_path):
    """128 MiB of text as 8 bz2 streams of 16 MiB (a few hundred bytes): the sample of 0.1 MiB is
    drawn from at most READ_FACTOR times it, streamed; tracemalloc's peak stays under 48 MiB (one
    document held whole, before, was 128 MiB)."""
    one = bz2.compress(b"a" * (16 << 20), 1)
    p = tmp_path / "bomb.txt.bz2"
    p.write_bytes(one * 8)
    tracemalloc.start()
    try:
        code, out = _cli(["tokenizer", "train", "--source", p, "--merges", 4, "--max-sample-mb", 0.1,
                          "--out", tmp_path / "tok.json"])
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 48 << 20, peak
    assert code == 0 or _one_error_line(out), out


# ------------------------------------------------------------------------------ 8. minor

def test_resume_names_ignored_model_flags_with_the_kept_values(run, tmp_path):
    R = _copy_run(run, tmp_path / "notes")
    lines = []
    bytemodel.train("", str(R), resume=True, steps=6, context=64, model={"d_model": 64, "mtp": 2, "rope_theta": 5.0},
                    log=lines.append)
    text = "\n".join(map(str, lines))
    assert "--d-model 64 ignored on --resume: the run keeps its own 32" in text, text
    assert "--mtp 2 ignored" in text and "--rope-theta 5.0 ignored" in text, text
    assert "--context 64 ignored on --resume: the run keeps its own 32" in text, text


def test_out_of_memory_advice_only_from_the_model(capsys):
    import typer
    from bytemodel.cli.errors import user_errors
    from bytemodel.config import ModelConfig
    from bytemodel.model import Model
    from bytemodel.ops import get_backend
    msgs = []
    for make in (lambda: Model(ModelConfig(d_model=1 << 22, n_heads=1 << 10, d_ff=1 << 22, n_layers=1 << 10),
                               get_backend("cpu")),
                 lambda: (_ for _ in ()).throw(MemoryError())):
        with pytest.raises(typer.Exit):   # user_errors prints one line to stderr and exits 2
            with user_errors():
                make()
        msgs.append(capsys.readouterr().err)
    assert "--batch-size" in msgs[0] and "--batch-size" not in msgs[1], msgs
    assert all(_one_error_line(m) and "out of memory" in m for m in msgs), msgs


def test_a_full_disk_names_the_file(tmp_path):
    import errno
    from bytemodel.atomic import write_atomic

    def full(f):
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError) as e:
        write_atomic(tmp_path / "x.bin", full)
    assert e.value.filename == str(tmp_path / "x.bin") and not list(tmp_path.iterdir())
    if os.path.exists("/dev/full"):
        with pytest.raises(OSError) as e:
            write_atomic("/dev/full", b"x" * 10000)
        assert e.value.filename == "/dev/full"


def test_a_directory_source_names_what_it_skips(tmp_path, capsys):
    d = tmp_path / "src"
    d.mkdir()
    (d / "a.txt").write_bytes(b"hello")
    os.mkfifo(d / "pipe")
    (d / "gone").symlink_to(tmp_path / "nowhere")
    docs = list(bytemodel.readers.read_documents(d))
    err = capsys.readouterr().err
    assert docs == [b"hello"]
    assert f"note: skipped {d / 'pipe'} (a pipe or FIFO" in err and f"note: skipped {d / 'gone'}" in err, err


@pytest.mark.parametrize("args", [["info", "R"], ["readers"], ["score", "toy.txt", "-c", "R"]])
def test_printing_commands_refuse_a_closed_stdout(run, args):
    import shlex
    import subprocess
    cmd = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "bytemodel.cli", *args])
    r = subprocess.run(f"{cmd} >&-", shell=True, cwd=run, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(Path(bytemodel.__file__).parents[1])})
    assert r.returncode == 2 and _one_error_line(r.stderr) and "stdout is closed" in r.stderr, r.stderr
