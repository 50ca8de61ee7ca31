"""The validation cadence of a time budget (training/autoconf.eval_cadence, Loop._plan): a run whose
eval_every was left to it, planned below the passes at which its data drops, validates at most
VAL_SHARE of its training time; a run expected to over-fit, or one given --eval-every, keeps its
cadence. On the fake clock (tests/conftest.py step_clock) a step takes 0.1 s and, here, each
validation 0.95 s: 0.95 / (0.05 x 0.1) = 190, rounded up to 200 steps between validations, against tiny's 100."""
import json

import pytest

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.training.autoconf import EVAL_ROUND, VAL_SHARE, eval_cadence
from bytemodel.training.loop import Loop


def test_the_cadence_rule():
    assert (VAL_SHARE, EVAL_ROUND) == (0.05, 50)
    # the four-genome split on the H100: 53.8 ms a step, 1.5 s a validation+save -> 558 steps -> 600
    assert eval_cadence(250, 0.0538, 1.5) == 600
    assert eval_cadence(250, 0.05, 0.2) == 250          # 80 steps' worth: the preset's stays
    assert eval_cadence(100, 0.1, 1.0) == 200           # exactly 200: not rounded up further
    assert eval_cadence(100, 0.1, 1.001) == 250
    assert eval_cadence(250, float("nan"), 1.5) == 250 and eval_cadence(250, 0.05, 0.0) == 250


@pytest.fixture
def dear_validation(step_clock, monkeypatch):
    real = Loop.validate

    def validate(self):
        step_clock.t += 0.95
        return real(self)
    monkeypatch.setattr(Loop, "validate", validate)
    return step_clock


def _val_steps(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if r.get("val_bpb") is not None]


def test_a_budget_below_the_dropping_passes_validates_less(tmp_path, dna_file, fast_settings, dear_validation):
    """The toy DNA at ~17 planned passes (nucleotides drop from 20): validation every 200 steps,
    in the log, the checkpoint and the steps it validated at, and planned with it; the same file
    in four other letters (data other than DNA drops from 5 passes) keeps tiny's 100, as does
    the DNA given --eval-every 100. A resume goes on at the plan's cadence."""
    s = {k: v for k, v in fast_settings.items() if k != "eval_every"}
    s.update(workers=1, warmup=4, patience=0)
    lines = []
    r = bytemodel.train(dna_file, tmp_path / "dna", minutes=1.3, stop_at=450, log=lines.append, **s)
    st = ck.load(r.checkpoint).train
    assert st["loop"]["eval_every"] == 200 and st["config"]["eval_every"] == 100
    assert any("validation every 200 steps (under 5% of the training time" in x for x in lines), lines
    assert _val_steps(tmp_path / "dna") == [10, 200, 400, 450]
    planned = st["loop"]["planned_steps"]   # 10 + (78 - 1.95 s) / (0.1 + 0.95 / 200): 736 (at 100 between
    assert 730 <= planned <= 740, planned    # validations: 704)
    resumed = bytemodel.train(None, tmp_path / "dna", resume=True, stop_at=650)
    assert ck.load(resumed.checkpoint).train["loop"]["eval_every"] == 200
    assert _val_steps(tmp_path / "dna")[-2:] == [600, 650] and planned > 650

    from test_dropout import _letters
    lines = []
    t = bytemodel.train(_letters(dna_file, tmp_path), tmp_path / "txt", minutes=1.3, stop_at=250,
                        log=lines.append, **s)
    assert ck.load(t.checkpoint).train["loop"]["eval_every"] == 0
    assert not any("validation every" in x for x in lines)
    assert _val_steps(tmp_path / "txt") == [10, 100, 200, 250]
    g = bytemodel.train(dna_file, tmp_path / "given", minutes=1.3, stop_at=250, eval_every=100, **s)
    assert ck.load(g.checkpoint).train["loop"]["eval_every"] == 0
    assert _val_steps(tmp_path / "given") == [10, 100, 200, 250]


@pytest.mark.parametrize("bad", [-1, 2.5, True, "650"])
def test_a_checkpoint_with_a_bad_cadence_is_refused(tmp_path, dna_file, fast_settings, bad):
    from bytemodel.errors import CheckpointError
    r = bytemodel.train(dna_file, tmp_path / "a", steps=10, stop_at=4, **fast_settings)
    ld = ck.load(r.checkpoint)
    train = dict(ld.train, loop=dict(ld.train["loop"], eval_every=bad))
    ck.save(tmp_path / "a" / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params, train, ld.m, ld.v)
    with pytest.raises(CheckpointError, match="eval_every is not valid"):
        bytemodel.train(None, tmp_path / "a", resume=True)
