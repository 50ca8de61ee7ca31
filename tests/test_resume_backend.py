"""A resume computes where and how the run did (issue 25): without --device / --precision it takes
the run's own from the checkpoint (a fresh run records its device resolved, never "auto"), so it
stays bit-identical; one given and different is used from the resume step on, with a note; a run
this machine cannot continue as it was (a GPU run here without a GPU, fp16 on the CPU) is one
error line naming the flags that continue it."""
from __future__ import annotations

import numpy as np
import pytest

import bytemodel
import bytemodel.ops
from bytemodel import checkpoint as ck
from bytemodel.errors import ConfigError
from bytemodel.training import autoconf
from bytemodel.training.prepare import resumed_backend
from conftest import cli, refused


def _as_if_trained_on(run_dir, device, precision):
    """Re-sign the run's checkpoint as one trained on `device` in `precision` (as ck.save writes it)."""
    ld = ck.load(run_dir)
    train = {**ld.train, "config": {**ld.train["config"], "device": device, "precision": precision}}
    ck.save(run_dir / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params, train, ld.m, ld.v)


def test_a_resume_without_flags_keeps_the_runs_precision(tmp_path, dna_file, fast_settings, monkeypatch):
    # a machine whose auto precision is not the run's (an fp16 run resumed on the H200, whose auto
    # is bf16): the resume must not pick it
    straight = bytemodel.train(dna_file, tmp_path / "a", steps=6, **fast_settings)
    bytemodel.train(dna_file, tmp_path / "b", steps=6, stop_at=3, **fast_settings)
    monkeypatch.setattr(autoconf, "auto_precision", lambda device, capability=None: "bf16")
    code, out = cli(["train", "--resume", "--out", tmp_path / "b", "-q"])
    assert code == 0, out
    after = ck.load(tmp_path / "b")
    assert after.train["step"] == 6 and after.train["config"]["precision"] == "fp32"
    assert np.array_equal(after.params, ck.load(straight.checkpoint).params)


def test_a_fresh_run_records_its_device_resolved(tmp_path, dna_file, fast_settings):
    r = bytemodel.train(dna_file, tmp_path / "r", steps=2, device="auto", **fast_settings)
    assert ck.load(r.checkpoint).train["config"]["device"] == "cpu"     # this machine has no GPU in CI


def test_a_gpu_run_resumed_here_without_a_gpu_is_refused_then_continues_as_asked(tmp_path, dna_file, fast_settings,
                                                                                monkeypatch):
    monkeypatch.setattr(bytemodel.ops, "cuda_available", lambda: False)
    bytemodel.train(dna_file, tmp_path / "g", steps=6, stop_at=3, **fast_settings)
    _as_if_trained_on(tmp_path / "g", "cuda", "fp16")
    code, out = cli(["train", "--resume", "--out", tmp_path / "g", "-q"])
    assert refused(code, out, "trained on cuda (fp16)", "--device cpu --precision fp32"), out
    code, out = cli(["train", "--resume", "--out", tmp_path / "g", "-q", "--device", "cpu"])
    assert refused(code, out, "trained in fp16", "--precision fp32"), out
    assert ck.load(tmp_path / "g").train["step"] == 3                   # nothing changed
    code, out = cli(["train", "--resume", "--out", tmp_path / "g", "-q", "--device", "cpu", "--precision", "fp32"])
    assert code == 0, out
    assert "trained on cuda and continues on cpu from step 3" in out
    assert "trained in fp16 and continues in fp32 from step 3: not bit-identical" in out
    cfg = ck.load(tmp_path / "g").train["config"]
    assert (cfg["device"], cfg["precision"]) == ("cpu", "fp32")          # the next resume keeps these


@pytest.mark.parametrize("run, given, gpu, want", [
    (("cuda", "fp16"), ("", ""), True, ("cuda", "fp16", 0)),        # the run's own, not auto's bf16
    (("cuda", "bf16"), ("", ""), True, ("cuda", "bf16", 0)),
    (("cpu", "fp32"), ("", ""), True, ("cpu", "fp32", 0)),           # a CPU run stays on the CPU
    (("cuda", "fp16"), ("", "bf16"), True, ("cuda", "bf16", 1)),     # given: used, with a note
    (("cuda", "fp16"), ("", "auto"), True, ("cuda", "bf16", 1)),
    (("cpu", "fp32"), ("cuda", ""), True, ("cuda", "fp32", 1)),
    (("cpu", "fp32"), ("cuda", "fp16"), True, ("cuda", "fp16", 2)),
    (("cuda", "fp32"), ("cpu", ""), True, ("cpu", "fp32", 1)),
    (("cuda", "fp16"), ("", "fp16"), True, ("cuda", "fp16", 0)),     # given, the same: no note
    (("auto", "fp32"), ("", ""), False, ("cpu", "fp32", 0)),         # older checkpoints: "auto" resolved here
])
def test_resumed_backend(monkeypatch, run, given, gpu, want):
    monkeypatch.setattr(bytemodel.ops, "cuda_available", lambda: gpu)
    monkeypatch.setattr(autoconf, "auto_precision", lambda device, capability=None: "bf16" if device == "cuda" else "fp32")
    device, precision, notes = resumed_backend(*run, *given, step=70)
    assert (device, precision, len(notes)) == want
    assert all(n.startswith("note: ") and "from step 70: not bit-identical" in n for n in notes)


@pytest.mark.parametrize("run, given, words", [
    (("cuda", "fp16"), ("", ""), 'device="cpu", precision="fp32"'),    # the API's words (the CLI's: above)
    (("cuda", "fp16"), ("cpu", ""), 'precision="fp32"'),
    (("cuda", "fp16"), ("cuda", ""), "not available"),
])
def test_resumed_backend_refuses_what_cannot_go_on_here(monkeypatch, run, given, words):
    monkeypatch.setattr(bytemodel.ops, "cuda_available", lambda: False)
    with pytest.raises(ConfigError, match=words.replace("-", r"\-")):
        resumed_backend(*run, *given, step=3)
