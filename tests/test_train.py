"""Training: learns, resumes bit-exactly, saves atomically, refuses bad input."""
import json

import numpy as np
import pytest

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.errors import BytemodelError, CheckpointError, ConfigError, SourceError
from conftest import MODEL_SETTINGS, cli, dna


def test_training_lowers_validation_loss(tmp_path, dna_file, fast_settings):
    r = bytemodel.train(dna_file, tmp_path / "run", steps=40, lr=1e-2, **fast_settings)
    hist = [h for h in r.history if "val_bpb" in h]
    assert hist[0]["val_bpb"] > r.val_bpb + 0.3, [h["val_bpb"] for h in hist]
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 40 and json.loads(lines[-1])["step"] == 40


def test_resume_is_bit_identical(tmp_path, dna_file, fast_settings):
    straight = bytemodel.train(dna_file, tmp_path / "a", steps=12, **fast_settings)
    first = bytemodel.train(dna_file, tmp_path / "b", steps=12, stop_at=7, **fast_settings)
    assert first.interrupted and first.step == 7
    mid = ck.load(tmp_path / "b")
    assert mid.train["step"] == 7
    resumed = bytemodel.train(None, tmp_path / "b", resume=True)
    assert resumed.step == 12
    a, b = ck.load(straight.checkpoint), ck.load(resumed.checkpoint)
    assert np.array_equal(a.params, b.params)
    assert np.array_equal(a.m, b.m) and np.array_equal(a.v, b.v)
    # and a different seed really gives different weights (the comparison can fail)
    other = bytemodel.train(dna_file, tmp_path / "c", steps=12, **{**fast_settings, "seed": 1})
    assert not np.array_equal(ck.load(other.checkpoint).params, a.params)


def test_existing_run_is_not_overwritten(tmp_path, dna_file, fast_settings):
    bytemodel.train(dna_file, tmp_path / "run", steps=5, **fast_settings)
    before = (tmp_path / "run" / ck.CKPT_NAME).read_bytes()
    with pytest.raises(ConfigError, match="already holds a checkpoint"):
        bytemodel.train(dna_file, tmp_path / "run", steps=5, **fast_settings)
    assert (tmp_path / "run" / ck.CKPT_NAME).read_bytes() == before


def test_crash_during_save_keeps_the_last_checkpoint(tmp_path, dna_file, fast_settings, monkeypatch):
    r = bytemodel.train(dna_file, tmp_path / "run", steps=5, **fast_settings)
    good = r.checkpoint.read_bytes()
    loaded = ck.load(r.checkpoint)

    def boom(*a, **k):
        raise KeyboardInterrupt  # as if Ctrl-C landed in the middle of writing
    monkeypatch.setattr(ck.os, "fsync", boom)
    with pytest.raises(KeyboardInterrupt):
        ck.save(r.checkpoint, loaded.cfg, loaded.tokenizer, loaded.params * 0, loaded.train)
    assert r.checkpoint.read_bytes() == good
    assert [p.name for p in r.checkpoint.parent.iterdir() if ".tmp" in p.name] == []


@pytest.mark.parametrize("make,match", [
    (lambda d: d / "missing.bin", "not found"),
    (lambda d: (d / "empty.bin").write_bytes(b"") and d / "empty.bin" or d / "empty.bin", "no data"),
    (lambda d: (d / "small.bin").write_bytes(b"ACGT" * 5) and d / "small.bin" or d / "small.bin", "too little data"),
])
def test_bad_sources(tmp_path, fast_settings, make, match):
    src = make(tmp_path)
    with pytest.raises(SourceError, match=match):
        bytemodel.train(src, tmp_path / "run", steps=5, **fast_settings)


def test_empty_directory(tmp_path, fast_settings):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="no files"):
        bytemodel.train(tmp_path / "empty", tmp_path / "run", steps=5, **fast_settings)


@pytest.mark.parametrize("bad", [{"steps": 0}, {"lr": -1.0}, {"batch_size": -1}, {"preset": "huge"},
                                 {"val_fraction": 1.5}, {"device": "tpu"}])
def test_bad_settings(tmp_path, dna_file, fast_settings, bad):
    with pytest.raises(ConfigError):
        bytemodel.train(dna_file, tmp_path / "run", **{**fast_settings, **bad})


def test_corrupt_and_foreign_checkpoints(tmp_path, dna_file, fast_settings):
    r = bytemodel.train(dna_file, tmp_path / "run", steps=3, **fast_settings)
    blob = bytearray(r.checkpoint.read_bytes())
    blob[-100] ^= 0xFF  # flip a weight byte
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="corrupt"):
        ck.load(bad)
    trunc = tmp_path / "trunc.safetensors"
    trunc.write_bytes(bytes(blob[: len(blob) // 2]))
    with pytest.raises(CheckpointError):
        ck.load(trunc)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError):
        ck.load(junk)
    with pytest.raises(CheckpointError, match="not found"):
        ck.load(tmp_path / "nope.safetensors")


def test_training_with_merges_counts_bytes_not_tokens(tmp_path, dna_file, fast_settings):
    r = bytemodel.train(dna_file, tmp_path / "run", steps=6, merges=40, **fast_settings)
    lm = bytemodel.load(r.run_dir)
    assert lm.tokenizer.n_merges == 40 and lm.cfg.vocab_size == 256 + 40 + 1
    corpus = json.loads((tmp_path / "run" / "corpus.json").read_text())
    assert corpus["n_tokens"] < corpus["n_bytes"] * 0.8  # merges shorten the stream
    out = lm.generate(77, seed=2)
    assert len(out) == 77  # --bytes counts bytes, whatever the tokens
    assert 0 < r.val_bpb < 8


def test_tokenizer_file_must_match_the_checkpoint(tmp_path, dna_file, fast_settings):
    from bytemodel.tokenizer import Tokenizer
    from bytemodel.errors import TokenizerError
    data = dna_file.read_bytes()
    tok_a, tok_b = tmp_path / "a.json", tmp_path / "b.json"
    Tokenizer.train(data, 30).save(tok_a)
    Tokenizer.train(data, 31).save(tok_b)
    r = bytemodel.train(dna_file, tmp_path / "run", steps=3, tokenizer=str(tok_a), **fast_settings)
    assert bytemodel.load(r.run_dir).tokenizer.n_merges == 30
    with pytest.raises(TokenizerError, match="does not match"):
        bytemodel.train(None, tmp_path / "run", resume=True, steps=5, tokenizer=str(tok_b))
    bytemodel.train(None, tmp_path / "run", resume=True, steps=5, tokenizer=str(tok_a))
    corrupt = tmp_path / "c.json"
    corrupt.write_text(tok_a.read_text().replace("[", "[9", 3))
    with pytest.raises(TokenizerError):
        bytemodel.train(dna_file, tmp_path / "run2", steps=3, tokenizer=str(corrupt), **fast_settings)
    with pytest.raises(TokenizerError):  # more merges than the data has repeating pairs
        bytemodel.train(dna_file, tmp_path / "run3", steps=3, merges=60000, **fast_settings)


def test_divergence_stops_with_a_clear_error(tmp_path, dna_file, fast_settings, monkeypatch):
    """A non-finite loss in fp32 is not a loss-scale overflow: training stops with a one-line error."""
    from bytemodel.errors import BytemodelError
    from bytemodel.ops import numpy_ops
    real = numpy_ops.cross_entropy_forward

    def nan_loss(logits, targets):
        losses, cache = real(logits, targets)
        return losses * np.nan, cache
    monkeypatch.setattr(numpy_ops, "cross_entropy_forward", nan_loss)
    with pytest.raises(BytemodelError, match="diverged at step 1 "):   # the first step, counted from 1
        bytemodel.train(dna_file, tmp_path / "run", steps=5, **fast_settings)


# ================================================================================================
# divergence and resumed settings (fault injection)
# ================================================================================================
def test_divergence_counts_steps_from_one(tmp_path):
    import bytemodel
    src = dna(tmp_path / "d.txt")
    bad = {**MODEL_SETTINGS, "lr": 1e30, "grad_clip": 0.0}
    with pytest.raises(BytemodelError, match="diverged at step ") as e:
        bytemodel.train(src, tmp_path / "a", steps=6, **bad)
    n = int(str(e.value).split("diverged at step ")[1].split()[0])
    # step n is counted as the metrics and the progress bar count (1 = the first step):
    # n - 1 steps train without trouble, n steps do not
    r = bytemodel.train(src, tmp_path / "b", steps=n - 1, **bad)
    assert [json.loads(x)["step"] for x in (r.run_dir / "metrics.jsonl").read_text().splitlines()][-1] == n - 1
    with pytest.raises(BytemodelError, match=f"diverged at step {n} "):
        bytemodel.train(src, tmp_path / "c", steps=n, **bad)


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


def test_resume_to_more_steps_has_no_jump_in_the_rate(tmp_path, dna_file, fast_settings):
    """Through the loop: the rate the metrics record at the first resumed step is no higher than at
    the last step before (before the fix it jumped up to the new cosine's value)."""
    import json
    lines = []
    bytemodel.train(dna_file, tmp_path / "r", steps=6, **fast_settings)
    bytemodel.train(None, tmp_path / "r", resume=True, steps=12, log=lines.append)
    lrs = [json.loads(l)["lr"] for l in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(lrs) == 12 and lrs[6] <= lrs[5] * 1.0001, lrs
    assert any(l.startswith("schedule: 6 -> 12 steps") for l in lines), lines


def test_a_warmup_longer_than_the_run_is_scaled_with_a_note(tmp_path, dna_file, fast_settings):
    from bytemodel import checkpoint as ck
    lines = []
    bytemodel.train(dna_file, tmp_path / "w", steps=5, **{**fast_settings, "warmup": -1}, log=lines.append)
    assert ck.load(tmp_path / "w").train["config"]["warmup"] == 1          # tiny's 50 -> a tenth of 5
    assert any("warmup 50 is not shorter than the run's 5 steps" in l for l in lines), lines
