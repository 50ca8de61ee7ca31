"""Run folders under hostile use (issue 23): one writer per folder, no folders made through a
dangling link, a failed fine-tune leaves nothing behind."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.errors import ConfigError
from bytemodel.runfiles import lock_run
from conftest import FAST
from conftest import cli as _cli, one_error_line as _one_error_line  # noqa: E402


def _settings(**kw):
    return {**FAST, "model": dict(FAST["model"]), **kw}


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(d.rglob("*")) if p.is_file()}






@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    src = d / "toy.txt"
    src.write_bytes(b"ACGTTGCAACGGTTCA" * 300)
    bytemodel.train(str(src), str(d / "R"), steps=4, **_settings())
    return d


# ------------------------------------------------------------------------------ 1. one writer

def test_a_second_writer_is_refused_and_changes_nothing(run):
    R = run / "R"
    before = _snapshot(R)
    held = lock_run(R)              # another writer (flock: a second open of the folder conflicts)
    try:
        with pytest.raises(ConfigError, match="in use"):
            bytemodel.train("", str(R), resume=True, steps=8)
        code, out = _cli(["train", "--resume", "--out", R, "--steps", 8])
        assert code == 2 and _one_error_line(out) and "in use" in out, out
        empty = run / "E"
        empty.mkdir()
        os.utime(empty, ns=(1, 1))
        held2 = lock_run(empty)
        try:
            code, out = _cli(["train", "--source", run / "toy.txt", "--out", empty, "--steps", 2, "--preset", "tiny",
                              "--context", 32, "--batch-size", 4, "-q", "--no-baseline"])
            assert code == 2 and _one_error_line(out) and "in use" in out, out
            assert list(empty.iterdir()) == [] and empty.stat().st_mtime_ns == 1
        finally:
            held2.release()
    finally:
        held.release()
    assert _snapshot(R) == before
    r = bytemodel.train("", str(R), resume=True, steps=6)     # once free, the run continues
    assert r.step == 6


def test_the_writer_holds_the_lock_for_the_run(run, monkeypatch, tmp_path):
    seen = []
    real = ck.save

    def save(path, *a, **kw):
        try:
            lock_run(Path(path).parent).release()
            seen.append("free")
        except ConfigError:
            seen.append("held")
        return real(path, *a, **kw)
    monkeypatch.setattr(ck, "save", save)
    bytemodel.train(str(run / "toy.txt"), str(tmp_path / "F"), steps=3, **_settings(eval_every=1))
    assert seen and set(seen) == {"held"}, seen
    lock_run(tmp_path / "F").release()       # and released at the end


# ---------------------------------------------------------------------- 2. dangling symlinks

def test_no_folder_is_made_through_a_dangling_link(run, tmp_path):
    from bytemodel.atomic import write_atomic
    link = tmp_path / "o.bmz"
    link.symlink_to(tmp_path / "nonexistent" / "dir" / "x")
    with pytest.raises(OSError):
        write_atomic(link, b"data")
    assert not (tmp_path / "nonexistent").exists()
    code, out = _cli(["generate", "-c", run / "R", "-n", 8, "--out", link])
    assert code == 2 and _one_error_line(out), out
    assert not (tmp_path / "nonexistent").exists()
    pytest.importorskip("constriction")
    f = tmp_path / "in.txt"
    f.write_bytes(b"ACGT" * 40)
    code, out = _cli(["compress", f, "-c", run / "R", "-o", link, "-q"])
    assert code == 2 and _one_error_line(out), out
    assert not (tmp_path / "nonexistent").exists()
    # a link into an existing folder is written through, the link kept
    (tmp_path / "there").mkdir()
    good = tmp_path / "g.bin"
    good.symlink_to(tmp_path / "there" / "g")
    write_atomic(good, b"ok")
    assert good.is_symlink() and (tmp_path / "there" / "g").read_bytes() == b"ok"


# ------------------------------------------------------------------ 6. a failed fine-tune tidies

def test_a_failed_fresh_finetune_removes_its_examples(run, tmp_path, monkeypatch):
    pairs = tmp_path / "p.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"{i} =", "completion": f" {i * 7}."}) + "\n" for i in range(40)))
    import bytemodel.lineage as lineage

    def boom(*a, **kw):     # fails after the examples are written, before the first checkpoint
        assert (tmp_path / "ft" / "examples.json").exists() and (tmp_path / "ft" / "mask.u8").exists()
        raise KeyboardInterrupt
    monkeypatch.setattr(lineage, "parent_weights", boom)
    from bytemodel.training.finetune import finetune
    with pytest.raises(KeyboardInterrupt):
        finetune(run / "R", pairs, tmp_path / "ft", examples="pairs", steps=2, batch_size=4,
                           eval_tokens=64, plot=False, baseline=False)
    assert not (tmp_path / "ft").exists()
