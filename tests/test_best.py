"""A run keeps its best weights, stops early, plans a time budget, and never hides an overflow.

The over-fitting corpus: 2,500 random bases. There is nothing to learn beyond "four letters", so
validation is best as soon as the model has learnt the letter frequencies (about 2 bits/byte) and
then rises as the model starts to memorise the training part: best != last within seconds.
"""
import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.cli import app
from bytemodel.errors import BytemodelError

OVERFIT = dict(preset="tiny", context=32, batch_size=8, eval_every=10, eval_tokens=0, warmup=5, lr=1e-2,
               workers=1, val_fraction=0.2, patience=3, plot=False, baseline=False, schedule="cosine",
               model={"d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 128})


@pytest.fixture
def random_dna(tmp_path):
    p = tmp_path / "random.txt"
    p.write_text("".join(np.random.default_rng(1).choice(list("ACGT"), 2500)))
    return p


def test_best_is_kept_early_stopping_fires_and_score_uses_the_best(tmp_path, random_dna):
    run = tmp_path / "run"
    r = bytemodel.train(random_dna, run, steps=400, **OVERFIT)
    vals = [(h["step"], h["val_bpb"]) for h in r.history if "val_bpb" in h]
    # early stopping: the run ended long before 400 steps, patience validations after its best
    assert r.step < 400 and "stopped early" in r.stop_reason
    assert r.step == r.best_step + OVERFIT["patience"] * OVERFIT["eval_every"]
    # best != last, and best is the minimum of what was validated
    assert r.best_step != r.step and r.val_bpb == min(v for _, v in vals) < r.last_val_bpb
    assert any("while training fell" in w for w in r.warnings)          # the over-fitting warning
    best, last = ck.load(run / ck.BEST_NAME), ck.load(run / ck.CKPT_NAME)
    assert best.train["step"] == r.best_step and last.train["step"] == r.step
    assert not np.array_equal(best.params, last.params)
    # `score` on the CLI uses the best weights; check against scoring both by hand
    data = random_dna.read_bytes()[-500:]
    by_hand = {k: bytemodel.load(run, last=k == "last").score(data) for k in ("best", "last")}
    assert by_hand["best"]["bits"] != by_hand["last"]["bits"]
    f = tmp_path / "piece.txt"
    f.write_bytes(data)
    for flag, key in (([], "best"), (["--last"], "last")):
        res = CliRunner().invoke(app, ["score", str(f), "-c", str(run)] + flag)
        assert res.exit_code == 0, res.output
        assert f"{by_hand[key]['bits'] / len(data):.4f} bits/byte" in res.output
    res = CliRunner().invoke(app, ["info", str(run)])
    assert f"step {r.best_step} of" in res.output and "best weights" in res.output


def test_patience_zero_runs_to_the_end_and_resume_keeps_the_best(tmp_path, random_dna):
    s = {**OVERFIT, "patience": 0, "eval_every": 5, "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64}}
    part = bytemodel.train(random_dna, tmp_path / "run", steps=30, stop_at=20, **s)
    best_before = (tmp_path / "run" / ck.BEST_NAME).read_bytes()
    r = bytemodel.train(None, tmp_path / "run", resume=True, steps=30)
    assert r.step == 30 and "finished 30 steps" in r.stop_reason
    straight = bytemodel.train(random_dna, tmp_path / "straight", steps=30, **s)
    assert (r.best_step, r.val_bpb) == (straight.best_step, straight.val_bpb)   # the watch state resumed
    if r.best_step <= part.step:   # best found before the stop: the file was not rewritten
        assert (tmp_path / "run" / ck.BEST_NAME).read_bytes() == best_before


def test_time_budget_plans_steps_and_the_plan_survives_resume(tmp_path, dna_file, fast_settings, step_clock):
    """A fake clock makes every step take exactly 0.1 s: a 6 s budget, planned at step 10 (after
    1 s) from the steps 5..10, leaves about 5 s / 0.1 s = 50 more steps."""
    s = {**fast_settings, "workers": 1, "warmup": 4, "eval_every": 1000, "patience": 0}
    r = bytemodel.train(dna_file, tmp_path / "b", minutes=0.1, **s)
    planned = ck.load(r.checkpoint).train["loop"]["planned_steps"]   # the run's own decision, not a setting
    assert planned == r.step and planned in (59, 60), planned
    first_val = [h["step"] for h in r.history if "val_bpb" in h][0]
    assert first_val == 10                                   # the forced validation at the plan
    # interrupted after the plan, resumed: the same total (not planned again), to the end
    part = bytemodel.train(dna_file, tmp_path / "c", minutes=0.1, stop_at=15, **s)
    st = ck.load(part.checkpoint).train
    assert st["budget_planned"] and st["step"] == 15 and st["loop"]["planned_steps"] == planned
    resumed = bytemodel.train(None, tmp_path / "c", resume=True)
    assert resumed.step == planned


def test_steps_given_on_resume_replace_a_time_budget(tmp_path, dna_file, fast_settings, step_clock):
    """A run trained for a time budget and resumed with --steps N trains on to step N (before: the
    budget, used up, stopped it again after one step, --steps only changing the schedule's end), and
    from then on it is a run of steps (its settings hold no budget); once before its plan too
    (--dropout auto then decided by the steps, as the plan would have). Asked for a step already
    passed: refused."""
    s = {**fast_settings, "workers": 1, "warmup": 4, "eval_every": 1000, "patience": 0}
    r = bytemodel.train(dna_file, tmp_path / "b", minutes=0.1, **s)        # planned at step 10, ~60 steps
    assert "planned for 0.1 min" in r.stop_reason
    logs = []
    more = bytemodel.train(None, tmp_path / "b", resume=True, steps=r.step + 30, log=logs.append)
    assert more.step == r.step + 30 and "finished" in more.stop_reason, more.stop_reason
    assert any("replaces the run's time budget" in line for line in logs), logs
    assert ck.load(more.checkpoint).train["config"]["minutes"] == 0
    with pytest.raises(BytemodelError, match="already at step"):
        bytemodel.train(None, tmp_path / "b", resume=True, steps=r.step)
    early = bytemodel.train(dna_file, tmp_path / "c", minutes=0.1, stop_at=6, **s)   # before the plan
    assert not ck.load(early.checkpoint).train["budget_planned"]
    logs = []
    on = bytemodel.train(None, tmp_path / "c", resume=True, steps=400, log=logs.append)
    assert on.step == 400 and "finished" in on.stop_reason
    assert any(line.startswith("dropout auto:") for line in logs), logs


def _overflow_from(monkeypatch, first_bad_step):
    """Fault injection: from training step `first_bad_step` on, the forward pass overflows (the
    loss and every gradient become inf/nan, as fp16 activations beyond 65504 would)."""
    from bytemodel.training import runner
    calls = {"n": 0}
    real = runner.CoreParallel.loss_and_grad

    def loss_and_grad(self, idx, targets, weight=1.0, drop=None):
        calls["n"] += 1
        losses = real(self, idx, targets, weight, drop=drop)
        if calls["n"] >= first_bad_step:
            self.model.grads[...] = np.nan
            return np.full_like(losses, np.inf)
        return losses
    monkeypatch.setattr(runner.CoreParallel, "loss_and_grad", loss_and_grad)


def test_fp16_overflow_stops_with_an_error_and_keeps_the_best(tmp_path, dna_file, fast_settings, monkeypatch):
    # "fp16" on the CPU: the NumPy backend (which computes in fp32) under the fp16 loop, loss scaler on
    from bytemodel.ops import numpy_ops
    monkeypatch.setattr("bytemodel.training.loop.get_backend", lambda device, precision, **k: numpy_ops)
    _overflow_from(monkeypatch, 13)
    run = tmp_path / "run"
    s = {**fast_settings, "workers": 1, "precision": "fp16", "eval_every": 5}
    with pytest.raises(BytemodelError) as e:
        bytemodel.train(dna_file, run, steps=200, **s)
    msg = str(e.value)
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]   # strict JSON
    best_step = min((r["val_bpb"], r["step"]) for r in rows if r.get("val_bpb") is not None)[1]
    # steps 13..27 halve the scale from 2^15 to the floor 1; the 8th non-finite step there is 34
    assert "fp16 overflow at step 34" in msg and 'precision="bf16"' in msg   # the API's words
    assert f"best checkpoint (step {best_step}," in msg
    best = ck.load(run / ck.BEST_NAME)
    assert best.train["step"] == best_step and np.isfinite(best.params).all()
    last = ck.load(run / ck.CKPT_NAME)      # validations at 15..35 saw finite weights (steps skipped)
    assert np.isfinite(last.params).all()
    assert all(r["loss"] is None and "loss" in r["nonfinite"] for r in rows if r["step"] >= 13)
    assert all(math.isfinite(r["loss"]) for r in rows if r["step"] < 13)
    # through the CLI: one error line, exit 2
    _overflow_from(monkeypatch, 1)
    res = CliRunner().invoke(app, ["train", "--source", str(dna_file), "--out", str(tmp_path / "cli"), "-q",
                                   "--precision", "fp16", "--no-baseline", "--context", "32", "--batch-size", "4",
                                   "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--d-ff", "64",
                                   "--eval-every", "5", "--eval-tokens", "256", "--workers", "1"])
    lines = [l for l in res.output.splitlines() if l.strip()]
    assert res.exit_code == 2 and lines[-1].startswith("error: fp16 overflow at step 22"), res.output
    assert "Traceback" not in res.output


def test_non_finite_validation_is_warned_and_recorded_as_null(tmp_path, dna_file, fast_settings, monkeypatch):
    from bytemodel.corpus import Corpus
    monkeypatch.setattr(Corpus, "score", lambda *a, **k: (float("nan"), float("nan")))
    r = bytemodel.train(dna_file, tmp_path / "run", steps=6, **{**fast_settings, "patience": 0})
    assert any("not finite" in w for w in r.warnings) and r.best_checkpoint is None
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[4]["val_bpb"] is None and rows[4]["nonfinite"] == ["val_bpb", "val_se"]


def test_auto_settings_rules():
    from bytemodel.training.autoconf import auto_precision, auto_preset, PARAMS_PER_BYTE
    from bytemodel.config import TrainConfig
    from bytemodel.training.autoconf import CPU_EVAL_TOKENS, GPU_EVAL_TOKENS, resolve
    assert auto_precision("cpu") == "fp32"
    assert auto_precision("cuda", (9, 0)) == "bf16" and auto_precision("cuda", (8, 0)) == "bf16"
    assert auto_precision("cuda", (7, 5)) == "fp16"
    assert auto_preset(10 ** 5, "cuda") == "tiny"
    assert auto_preset(2 * 10 ** 6, "cuda") == "small"        # 10.8M params <= 20 x 2 MB
    assert auto_preset(19 * 10 ** 6, "cuda") == "base"
    assert auto_preset(19 * 10 ** 6, "cpu", cores=2) == "tiny"  # a laptop trains tiny
    assert auto_preset(19 * 10 ** 6, "cpu", cores=16) == "small"
    assert PARAMS_PER_BYTE == 20
    tc = TrainConfig(source="x", preset="auto", lr=0.0, warmup=-1, batch_size=0, eval_every=0)
    resolve(tc, "cpu", 10 ** 6, 2)
    assert (tc.preset, tc.lr, tc.warmup, tc.batch_size, tc.eval_every, tc.precision) == ("tiny", 2e-3, 50, 16, 100, "fp32")
    assert tc.eval_tokens == CPU_EVAL_TOKENS
    on_gpu = TrainConfig(source="x", preset="auto", lr=0.0, warmup=-1, batch_size=0, eval_every=0, precision="bf16")
    resolve(on_gpu, "cuda", 10 ** 6, 2)     # a GPU validates on a bounded share of a long tail too
    assert on_gpu.eval_tokens == GPU_EVAL_TOKENS and CPU_EVAL_TOKENS < GPU_EVAL_TOKENS <= 2 ** 22
    given = TrainConfig(source="x", preset="base", lr=1e-4, warmup=7, batch_size=3, eval_every=9, precision="fp16",
                        eval_tokens=5)
    resolve(given, "cuda", 10 ** 6, 2)      # what the user gave is kept
    assert (given.lr, given.warmup, given.batch_size, given.eval_every, given.precision, given.eval_tokens) == \
        (1e-4, 7, 3, 9, "fp16", 5)


def test_loss_png_and_plot_command(tmp_path, dna_file, fast_settings):
    pytest.importorskip("matplotlib")
    a = bytemodel.train(dna_file, tmp_path / "a", steps=10, **{**fast_settings, "plot": True, "baseline": True})
    png = tmp_path / "a" / "loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and a.baselines["xz9_tail"] > 0
    bytemodel.train(dna_file, tmp_path / "b", steps=10, **{**fast_settings, "lr": 1e-2})
    res = CliRunner().invoke(app, ["plot", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "c.png")])
    assert res.exit_code == 0 and (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG", res.output
    for name, magic in (("c.svg", b"<svg"), ("c.PDF", b"%PDF")):   # the format the name asks for
        res = CliRunner().invoke(app, ["plot", str(tmp_path / "a"), "--out", str(tmp_path / name)])
        assert res.exit_code == 0 and magic in (tmp_path / name).read_bytes()[:400], res.output
    res = CliRunner().invoke(app, ["plot", str(tmp_path / "a"), "--out", str(tmp_path / "c.txt")])
    assert res.exit_code == 2 and res.output.startswith("error: ") and ".png" in res.output, res.output
    assert not (tmp_path / "c.txt").exists()        # before: a PNG written under the .txt name
    res = CliRunner().invoke(app, ["plot", str(tmp_path / "nothing"), "--out", str(tmp_path / "d.png")])
    assert res.exit_code == 2 and res.output.startswith("error: ") and not (tmp_path / "d.png").exists()
