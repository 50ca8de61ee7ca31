"""The plateau schedule (training/plateau.py): on a validation plateau the run goes back to its
best weights and halves the rate instead of stopping; killed and resumed it ends on the same bits.

The over-fitting corpus is test_best.py's: 2,500 random bases, best within a few validations,
then rising, so plateaus come within seconds.
"""
import json

import numpy as np
import pytest

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.errors import CheckpointError, ConfigError
from bytemodel.training import plateau
from bytemodel.training.optim import lr_at

OVERFIT = dict(preset="tiny", context=32, batch_size=8, eval_every=5, eval_tokens=0, warmup=5, lr=1e-2,
               workers=1, val_fraction=0.2, patience=3, plot=False, baseline=False, schedule="plateau",
               dropout=0.0, dropout_attn=0.0,   # ~10 passes would drop by default (autoconf.auto_dropout)
               model={"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64})
STEPS = 75   # cuts after steps 40 and 55 (back to 30 and 45), patience at the floor at 70: ~5 s on 2 idle cores


@pytest.fixture(scope="module")
def random_dna(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "random.txt"
    p.write_text("".join(np.random.default_rng(1).choice(list("ACGT"), 2500)))
    return p


@pytest.fixture(scope="module")
def straight(random_dna, tmp_path_factory):
    """The whole run, once for the module: (TrainResult, metrics rows, the steps of its cuts)."""
    d = tmp_path_factory.mktemp("straight") / "run"
    r = bytemodel.train(random_dna, d, steps=STEPS, **OVERFIT)
    return (r,) + _cuts(d)


def test_the_rules_by_hand():
    assert plateau.factor(9, [10, 20]) == 1 and plateau.factor(10, [10, 20]) == 0.5   # from the next step on
    assert plateau.factor(25, [10, 20]) == 0.25
    assert plateau.rate(0.8, 5, [], 0.1) == 0.8                                       # no cut: the cosine's own
    assert plateau.rate(0.8, 15, [10], 0.1) == 0.4 and plateau.rate(0.3, 15, [10, 12], 0.1) == 0.1   # floored
    assert plateau.rate(0.05, 15, [10], 0.1) == 0.05       # under the floor already (warmup): left alone
    assert not plateau.due(1, 5, 0.5, 0.1) and plateau.due(2, 5, 0.5, 0.1)
    assert plateau.due(1, 1, 0.5, 0.1) and plateau.due(2, 0, 0.5, 0.1)   # patience 1 cuts at 1; 0 is off
    assert not plateau.due(9, 5, 0.1, 0.1)                                 # at the floor: no more cuts


def _cuts(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows, [r["step"] for r in rows if "cut_to" in r]


def test_a_plateau_goes_back_to_the_best_weights_at_half_the_rate(tmp_path, random_dna, straight):
    r, rows, cuts = straight
    assert cuts and ck.load(r.checkpoint).train["loop"]["cuts"] == cuts
    c = cuts[0]
    by_step = {row["step"]: row for row in rows}
    best_at_cut = by_step[c]["cut_to"]
    vals = {s: row["val_bpb"] for s, row in by_step.items() if "val_bpb" in row and s <= c}
    assert best_at_cut == min(vals, key=vals.get) < c
    # the rate from the step after the cut is half the cosine's (recorded lr = that step's rate)
    cosine = lr_at(c, OVERFIT["lr"], OVERFIT["warmup"], STEPS, 0.1)
    assert by_step[c + 1]["lr"] == pytest.approx(0.5 * cosine, rel=1e-12)
    assert by_step[c]["lr"] == pytest.approx(lr_at(c - 1, OVERFIT["lr"], OVERFIT["warmup"], STEPS, 0.1), rel=1e-12)
    # patience ends the run only once the rate sits at its floor
    assert "stopped early" in r.stop_reason and "floor" in r.stop_reason
    assert rows[-1]["lr"] == pytest.approx(0.1 * OVERFIT["lr"], rel=1e-9)
    # stopped at the cut: the saved weights are the best ones, bit for bit
    part = bytemodel.train(random_dna, tmp_path / "b", steps=STEPS, stop_at=c, **OVERFIT)
    best = ck.load(tmp_path / "b" / ck.BEST_NAME)
    assert part.step == c and best.train["step"] == best_at_cut
    assert np.array_equal(ck.load(part.checkpoint).params, best.params)


def test_killed_and_resumed_runs_end_on_the_same_bits(tmp_path, random_dna, straight):
    """Stopped at the step of a best, resumed with best.safetensors gone (the best weights come
    from the resume checkpoint); and resumed from there to a stop between that best and the cut
    that goes back to it, then resumed again (they come from best.safetensors): each ends on the
    straight run's weights, moments and cuts."""
    import shutil
    r0, rows, cuts = straight
    assert len(cuts) >= 2, cuts
    want = ck.load(r0.checkpoint)
    c = cuts[1]
    best = {row["step"]: row for row in rows}[c]["cut_to"]
    assert cuts[0] < best < c - OVERFIT["eval_every"]
    at_best = tmp_path / "at-best"
    bytemodel.train(random_dna, at_best, steps=STEPS, stop_at=best, **OVERFIT)
    between = tmp_path / "between"
    shutil.copytree(at_best, between)
    (at_best / ck.BEST_NAME).unlink()
    r = bytemodel.train(None, between, resume=True, stop_at=c - OVERFIT["eval_every"])
    assert r.step == c - OVERFIT["eval_every"] and ck.load(between / ck.BEST_NAME).train["step"] == best
    for d in (at_best, between):
        r = bytemodel.train(None, d, resume=True)
        got = ck.load(r.checkpoint)
        assert r.step == r0.step and got.train["loop"]["cuts"] == cuts, d.name
        assert np.array_equal(got.params, want.params) and np.array_equal(got.m, want.m), d.name


def test_a_wrong_best_file_is_refused_on_resume(tmp_path, random_dna, straight):
    r0, _, cuts = straight
    d = tmp_path / "k"
    bytemodel.train(random_dna, d, steps=STEPS, stop_at=cuts[0] - OVERFIT["eval_every"], **OVERFIT)
    other = ck.load(r0.checkpoint)   # another step's weights put where the best should be
    ck.save(d / ck.BEST_NAME, other.cfg, other.tokenizer, other.params, {**other.train, "best": True})
    with pytest.raises(CheckpointError, match="not the best step"):
        bytemodel.train(None, d, resume=True)


def test_without_a_plateau_it_is_the_cosine_schedule(tmp_path, dna_file, fast_settings):
    a = bytemodel.train(dna_file, tmp_path / "a", steps=12, **{**fast_settings, "schedule": "plateau"})
    b = bytemodel.train(dna_file, tmp_path / "b", steps=12, **{**fast_settings, "schedule": "cosine"})
    assert ck.load(a.checkpoint).train["loop"]["cuts"] == []
    assert np.array_equal(ck.load(a.checkpoint).params, ck.load(b.checkpoint).params)


def test_the_setting_and_older_checkpoints(tmp_path, dna_file, fast_settings):
    with pytest.raises(ConfigError, match="schedule"):
        bytemodel.train(dna_file, tmp_path / "x", steps=5, **{**fast_settings, "schedule": "step"})
    # a checkpoint from before the setting (no "schedule", no "cuts") resumes as cosine
    r = bytemodel.train(dna_file, tmp_path / "old", steps=10, stop_at=5, **{**fast_settings, "schedule": "plateau"})
    c = ck.load(r.checkpoint)
    train = {**c.train, "config": {k: v for k, v in c.train["config"].items() if k != "schedule"},
             "loop": {k: v for k, v in c.train["loop"].items() if k != "cuts"}}
    ck.save(r.checkpoint, c.cfg, c.tokenizer, c.params, train, c.m, c.v)
    done = bytemodel.train(None, tmp_path / "old", resume=True)
    assert ck.load(done.checkpoint).train["config"]["schedule"] == "cosine"
    bad = {**train, "loop": {**train["loop"], "cuts": [3, 3]}}
    ck.save(r.checkpoint, c.cfg, c.tokenizer, c.params, bad, c.m, c.v)
    with pytest.raises(CheckpointError, match="loop state is not valid .cuts"):
        bytemodel.train(None, tmp_path / "old", resume=True, steps=20)


def test_the_default_is_the_plateau_schedule(tmp_path, dna_file):
    """What a run without --schedule records (and so trains with); --schedule cosine is kept."""
    from conftest import cli
    for flags, want in (([], "plateau"), (["--schedule", "cosine"], "cosine")):
        out = tmp_path / want
        code, text = cli(["train", "--source", str(dna_file), "--preset", "tiny", "--d-model", "32", "--n-layers", "1",
                          "--n-heads", "2", "--d-ff", "64", "--context", "32", "--batch-size", "4", "--steps", "3",
                          "--eval-every", "3", "--no-baseline", "-q", "--workers", "1", "--out", str(out)] + flags)
        assert code == 0, text
        assert ck.load(out / ck.CKPT_NAME).train["config"]["schedule"] == want
