"""Dropout: the mask's rule checked by hand, the op's gradient, the model's gradients with a fixed
mask (float64), the masks of a batch split over threads, off outside training, exact resume; the
same for the attention probabilities' dropout, and its refusal on the GPU."""
from __future__ import annotations

import numpy as np
import pytest

from bytemodel import ModelConfig
from bytemodel.errors import ConfigError
from bytemodel.gradcheck import check_model, tiny_config
from bytemodel.model import Dropout, Model, dropout_key
from bytemodel.ops import numpy_ops as o


def _fmix32(x: int) -> int:   # murmur3's finaliser written out on Python ints
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_mask_is_the_written_rule():
    """Element g takes byte g % 4 of fmix32(fmix32(g // 4 ^ k0) ^ k1), kept when >= round(256 p)."""
    key, p, offset, n = (0x12345678, 0x9ABCDEF0), 0.3, 10, 41
    thr = round(p * 256)
    want = []
    for g in range(offset, offset + n):
        h = _fmix32(_fmix32((g // 4) ^ key[0]) ^ key[1])
        want.append(((h >> 8 * (g % 4)) & 0xFF) >= thr)
    np.testing.assert_array_equal(o.dropout_keep(n, key, offset, p), want)


def test_keep_fraction_and_scale():
    """Over 2M elements the kept share is 1 - p within 5 standard errors, and the scale makes the
    mean of ones 1 within the same bound."""
    n, p = 2_000_000, 0.2
    x = np.ones((n // 1000, 1000), dtype=np.float64)
    out, _ = o.dropout_forward(x, p, dropout_key(0, 0, 0))
    kept = np.count_nonzero(out) / n
    se = np.sqrt(p * (1 - p) / n)
    assert abs(kept - (1 - p)) < 5 * se
    assert abs(out.mean() - 1) < 5 * se / (1 - p)
    # keys differ: another step's mask is (nearly) independent of this one's
    other = o.dropout_keep(n, dropout_key(0, 1, 0), 0, p)
    both = np.count_nonzero(other & (out.reshape(-1) != 0)) / n
    assert abs(both - (1 - p) ** 2) < 5 * se


def test_offset_draws_the_piece_of_the_whole():
    key = dropout_key(3, 7, 2)
    whole = o.dropout_keep(1000, key, 0, 0.5)
    for start in (400, 401, 403):   # any start, not only a multiple of the hash's 4 elements
        np.testing.assert_array_equal(o.dropout_keep(1000 - start, key, start, 0.5), whole[start:])


def test_op_backward_against_finite_differences():
    """The op is linear in x with the mask fixed: the backward is exact to round-off in float64."""
    rng = np.random.default_rng(0)
    x, r, dout = (rng.standard_normal((5, 6)) for _ in range(3))
    key, p = dropout_key(1, 2, 3), 0.4
    f = lambda x: float(np.sum(o.dropout_forward(x, p, key, 2, residual=r)[0] * dout))  # noqa: E731
    out, cache = o.dropout_forward(x, p, key, 2, residual=r)
    dx = o.dropout_backward(dout, cache)
    eps = 1e-6
    num = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        num[i] = (f(x + e) - f(x - e)) / (2 * eps)
    np.testing.assert_allclose(dx, num, rtol=1e-7, atol=1e-9)   # float64 round-off over eps
    keep = o.dropout_keep(x.size, key, 2, p).reshape(x.shape)
    assert 0 < keep.sum() < keep.size
    np.testing.assert_allclose(out - r, np.where(keep, x / (1 - round(p * 256) / 256), 0), rtol=1e-12)


@pytest.mark.parametrize("site", ["dropout", "dropout_attn"])
def test_model_gradients_with_a_fixed_mask(site):
    """Every tensor against finite differences in float64, the masks held fixed (same Dropout), for
    the residual sites' dropout and the attention probabilities'; off without a Dropout
    (validation, scoring, generation, compression pass none)."""
    cfg = tiny_config(**{site: 0.3})
    worst = max(c.max_rel_error for c in check_model(cfg, per_tensor=4, drop=Dropout(5, 11)))
    assert worst <= 1e-4, worst
    # and the dropout really acts: the loss differs from the one without masks
    m = Model(cfg, o, dtype=np.float64)
    m.init_weights(0)
    idx = np.arange(2 * cfg.context).reshape(2, -1) % cfg.vocab_size
    plain = m.forward(idx, idx)
    assert not np.allclose(m.forward(idx, idx, drop=Dropout(5, 11)), plain)
    # off at evaluation: no Dropout given, the same losses as a model without dropout
    m0 = Model(tiny_config(), o, dtype=np.float64)
    m0.params[:] = m.params
    np.testing.assert_array_equal(m0.forward(idx, idx), plain)


def test_slices_draw_the_masks_of_the_whole_batch():
    """Two threads, each on half the batch, give the gradient of one piece (float32 sums aside)."""
    from bytemodel.training.runner import CoreParallel
    cfg = ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=2, d_ff=48, context=16, dropout=0.25)
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 40, size=(4, 16))
    grads = []
    for workers in (1, 2):
        m = Model(cfg, o)
        m.init_weights(0)
        CoreParallel(m, workers).loss_and_grad(idx, idx, 1 / idx.size, drop=Dropout(0, 3))
        grads.append(m.grads.copy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-4, atol=1e-6)   # float32 sums, in another order
    m = Model(cfg, o)
    m.init_weights(0)
    m.loss_and_grad(idx, idx, 1 / idx.size, drop=Dropout(0, 4))       # another step: other masks, other gradient
    assert not np.allclose(m.grads, grads[0], rtol=1e-2, atol=1e-4)


def _qkv(rng, B=2, H=4, K=2, T=7, D=4):
    return (rng.standard_normal((B, H, T, D)), rng.standard_normal((B, K, T, D)),
            rng.standard_normal((B, K, T, D)), rng.standard_normal((B, H, T, D)))


def test_attention_mask_is_the_rule_over_the_whole_score_array():
    """Probability (b, h, i, j) is element offset + ((b H + h) T + i) S + j of dropout_keep's
    counter: the blocked op's mask, read back from its output, is that array's causal part."""
    B, H, T = 2, 4, 7
    key, p, offset = dropout_key(2, 9, 1 << 40), 0.5, 13
    whole = o.dropout_keep(B * H * T * T, key, offset, p).reshape(B, H, T, T)
    for q0, q1 in ((0, 3), (3, 7)):
        keep, scale = o.attn_keep((p, key, offset), B, H, T, T, q0, q1, q1)
        np.testing.assert_array_equal(keep, whole[:, :, q0:q1, :q1])
    # the op: v = identity rows picks out each kept probability (dropped ones read 0)
    q, k = np.zeros((B, H, T, T)), np.zeros((B, 2, T, T))   # equal scores: P = 1 / (i + 1)
    v = np.broadcast_to(np.eye(T), (B, 2, T, T)).copy()
    out, _ = o.attention_forward(q, k, v, block=3, drop=(p, key, offset))
    causal = np.tril(np.ones((T, T), dtype=bool))
    np.testing.assert_array_equal(out != 0, whole & causal)
    np.testing.assert_allclose(out[out != 0], (scale / (np.arange(T)[:, None] + 1) * np.ones(T))[
        np.nonzero(whole & causal)[2:]], rtol=1e-12)


def test_attention_dropout_backward_against_finite_differences():
    """q, k, v gradients of the op with a fixed mask, float64, blocks of 3 over 7 queries (the
    mask drawn per block must be the same in both passes); blocked = unblocked."""
    rng = np.random.default_rng(3)
    q, k, v, dout = _qkv(rng)
    drop = (0.4, dropout_key(1, 2, 1 << 40), 5)
    out, lse = o.attention_forward(q, k, v, block=3, drop=drop)
    np.testing.assert_allclose(out, o.attention_forward(q, k, v, drop=drop)[0], rtol=1e-12, atol=1e-14)
    plain = o.attention_forward(q, k, v, block=3)[0]
    assert np.abs(out - plain).max() > 0.1                 # the mask acts
    grads = o.attention_backward(dout, q, k, v, out, lse, block=3, drop=drop)
    eps = 1e-6
    for n, (x, g) in enumerate(zip((q, k, v), grads)):
        num = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            a = [q, k, v]
            a[n] = x.copy()
            a[n][i] += eps
            fp = np.sum(o.attention_forward(*a, block=3, drop=drop)[0] * dout)
            a[n][i] -= 2 * eps
            fm = np.sum(o.attention_forward(*a, block=3, drop=drop)[0] * dout)
            num[i] = (fp - fm) / (2 * eps)
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-7)   # float64 centred differences: ~1e-9 seen


def test_attention_masks_of_slices_are_those_of_the_whole_batch():
    from bytemodel.training.runner import CoreParallel
    cfg = ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=2, d_ff=48, context=16, dropout_attn=0.25)
    idx = np.random.default_rng(1).integers(0, 40, size=(4, 16))
    grads = []
    for workers, step in ((1, 3), (2, 3), (1, 4)):
        m = Model(cfg, o)
        m.init_weights(0)
        CoreParallel(m, workers).loss_and_grad(idx, idx, 1 / idx.size, drop=Dropout(0, step))
        grads.append(m.grads.copy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-4, atol=1e-6)   # float32 sums, in another order
    assert not np.allclose(grads[2], grads[0], rtol=1e-2, atol=1e-4)        # another step, other masks


def test_dropout_setting_is_checked():
    assert ModelConfig.from_dict({"d_model": 64}).dropout == 0.0   # a checkpoint from before it
    assert ModelConfig.from_dict({"d_model": 64}).dropout_attn == 0.0
    for bad in (-0.1, 0.95, float("nan"), True):
        with pytest.raises(ConfigError):
            ModelConfig(dropout=bad)
        with pytest.raises(ConfigError):
            ModelConfig(dropout_attn=bad)


def test_resume_with_dropout_is_bit_identical(tmp_path, dna_file, fast_settings):
    """The masks come from (seed, step): stopping at step 5 and resuming ends on the same weights;
    the same run without dropout ends elsewhere (so the masks were really applied)."""
    import bytemodel
    from bytemodel import checkpoint as ck
    s = {**fast_settings, "dropout": 0.2, "dropout_attn": 0.1}
    straight = bytemodel.train(dna_file, tmp_path / "a", steps=9, **s)
    bytemodel.train(dna_file, tmp_path / "b", steps=9, stop_at=5, **s)
    resumed = bytemodel.train(None, tmp_path / "b", resume=True)
    a, b = ck.load(straight.checkpoint), ck.load(resumed.checkpoint)
    assert a.cfg.dropout == 0.2 and a.cfg.dropout_attn == 0.1   # recorded in the checkpoint
    assert np.array_equal(a.params, b.params) and np.array_equal(a.m, b.m)
    plain = bytemodel.train(dna_file, tmp_path / "c", steps=9, **{**fast_settings, "dropout": 0.0})
    assert not np.array_equal(ck.load(plain.checkpoint).params, a.params)


def test_cli_dropout_flag(tmp_path, dna_file):
    from typer.testing import CliRunner
    from bytemodel.cli import app
    r = CliRunner().invoke(app, ["train", "--source", str(dna_file), "--dropout", "lots", "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "error:" in r.output and "--dropout" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["train", "--source", str(dna_file), "--dropout", "0.95", "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "dropout" in r.output
    r = CliRunner().invoke(app, ["train", "--source", str(dna_file), "--dropout-attn", "0.95", "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "error:" in r.output and "dropout-attn" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["train", "--source", str(dna_file), "--dropout-attn", "some", "--out", str(tmp_path / "r")])
    assert r.exit_code == 2 and "error: --dropout-attn must be a number" in r.output and "Traceback" not in r.output
    from conftest import MODEL_FLAGS
    small = ["--preset", "tiny", "--steps", "2"] + [f for f in MODEL_FLAGS if f != "-q"]   # the first line printed
    r = CliRunner().invoke(app, ["train", "--source", str(dna_file), "--out", str(tmp_path / "d"), "--dropout", "0.2",
                                 "--dropout-attn", "0.1"] + small)
    assert r.exit_code == 0 and "dropout 0.2, attention dropout 0.1" in r.output.splitlines()[0], r.output
    r = CliRunner().invoke(app, ["train", "--source", str(dna_file), "--out", str(tmp_path / "e")] + small)
    assert r.exit_code == 0 and ", dropout" not in r.output.splitlines()[0], r.output   # the CPU's auto: none


def test_auto_dropout_rule():
    """--dropout auto by the passes a run plans: from DROPOUT_PASSES on, 0.2 / 0.2; a --steps run
    decides in resolve, a time budget's stays auto (-1) for its plan step; given values are kept."""
    from bytemodel.config import TrainConfig
    from bytemodel.training.autoconf import (DROPOUT_PASSES, auto_dropout, auto_dropout_attn, dropout_at_plan,
                                             planned_passes, resolve)
    assert planned_passes(100, 32, 1024, 3_276_800) == 1.0
    assert auto_dropout(DROPOUT_PASSES) == 0.2 and auto_dropout(DROPOUT_PASSES - 0.01) == 0.0
    assert auto_dropout_attn(DROPOUT_PASSES) == 0.2 and auto_dropout_attn(3.9) == 0.0
    assert auto_dropout(6.3, nucleotides=True) == 0.0 and auto_dropout(19.99, True) == 0.0   # DNA drops later
    assert auto_dropout(20, True) == 0.2 and auto_dropout_attn(20, True) == 0.2 and auto_dropout_attn(19, True) == 0
    bf16 = dict(source="x", precision="bf16", preset="small", steps=1000)   # precision given: no GPU asked
    tc = TrainConfig(**bf16)            # 1000 steps x 32 x 512 tokens over 1M tokens: 16 passes
    resolve(tc, "cuda", 1_000_000, train_tokens=1_000_000)
    assert (tc.dropout, tc.dropout_attn) == (0.2, 0.2)
    tc = TrainConfig(**bf16)            # over 4M tokens: 4.1 passes
    resolve(tc, "cuda", 4_000_000, train_tokens=4_000_000)
    assert (tc.dropout, tc.dropout_attn) == (0.0, 0.0)
    tc = TrainConfig(**bf16, dropout=0.3, dropout_attn=0.05)   # given: kept
    resolve(tc, "cuda", 1_000_000, train_tokens=1_000_000)
    assert (tc.dropout, tc.dropout_attn) == (0.3, 0.05)
    tc = TrainConfig(**bf16, minutes=5, dropout_attn=0.1)   # a budget: the dropout waits for the plan
    resolve(tc, "cuda", 1_000_000, train_tokens=1_000_000)
    assert (tc.dropout, tc.dropout_attn) == (-1, 0.1)
    assert dropout_at_plan(tc, 1000, 512, 1_000_000) == (0.2, None)
    assert dropout_at_plan(tc, 100, 512, 1_000_000) == (0.0, None)
    assert dropout_at_plan(tc, 1000, 512, 1_000_000, nucleotides=True) == (0.0, None)   # 16 passes of DNA
    assert dropout_at_plan(tc, 1300, 512, 1_000_000, nucleotides=True) == (0.2, None)   # 21
    child = TrainConfig(**{**bf16, "minutes": 5, "parent": "runs/p"})   # a fine-tune keeps its parent's
    assert dropout_at_plan(child, 1000, 512, 1_000_000) == (None, None)


def _letters(dna_file, tmp_path):
    """The toy DNA with its four letters swapped for four that are no nucleotide code: the same
    size and structure, so the same passes, under the rule for data other than DNA."""
    p = tmp_path / "letters.txt"
    p.write_text(dna_file.read_text().translate(str.maketrans("ACGT", "EFIL")))
    return p


def test_time_budget_decides_the_dropout_at_its_plan(tmp_path, dna_file, fast_settings, step_clock):
    """A 6 s budget on the fake clock (0.1 s a step) plans ~60 steps of 4 x 32 tokens over the
    toy file's ~5.4k training tokens: ~1.4 passes, so no dropout; a 30 s budget plans ~300 steps,
    ~7 passes: 0.2 / 0.2 from the plan on, recorded in the checkpoint, and kept on a resume
    after the plan (not decided again). The file's letters are no nucleotide codes (DNA: the
    next test)."""
    import bytemodel
    from bytemodel import checkpoint as ck
    src = _letters(dna_file, tmp_path)
    s = {**fast_settings, "workers": 1, "warmup": 4, "eval_every": 1000, "patience": 0}
    short = bytemodel.train(src, tmp_path / "a", minutes=0.1, **s)
    assert ck.load(short.checkpoint).cfg.dropout == 0.0
    lines = []
    part = bytemodel.train(src, tmp_path / "b", minutes=0.5, stop_at=15, log=lines.append, **s)
    st = ck.load(part.checkpoint)
    assert st.train["budget_planned"] and (st.cfg.dropout, st.cfg.dropout_attn) == (0.2, 0.2)
    assert st.train["config"]["dropout"] == -1                    # the setting stays auto
    assert "dropout auto (by the passes planned)" in lines[0]
    assert any(x.startswith("dropout auto: 7.") and "dropout 0.2, attention dropout 0.2 from step 11" in x
               and "(at least 5 passes drop)" in x for x in lines), lines
    resumed = bytemodel.train(None, tmp_path / "b", resume=True)
    end = ck.load(resumed.checkpoint)
    assert resumed.step == st.train["loop"]["planned_steps"] and (end.cfg.dropout, end.cfg.dropout_attn) == (0.2, 0.2)


def test_a_budget_on_dna_drops_only_from_the_nucleotide_passes(tmp_path, dna_file, fast_settings, step_clock):
    """The same ~7 passes on the toy DNA itself (all nucleotide codes): no dropout, since
    nucleotides drop from NUCLEOTIDE_DROPOUT_PASSES (20) planned passes (the four-genome split lost
    0.11 bits/base to 0.2 / 0.2 at 6.3 passes); a 102 s budget plans ~1,000 steps, ~24 passes:
    0.2 / 0.2. A --steps run decides the same way before its first step."""
    import bytemodel
    from bytemodel import checkpoint as ck
    from bytemodel.training.autoconf import NUCLEOTIDE_DROPOUT_PASSES
    assert NUCLEOTIDE_DROPOUT_PASSES == 20
    s = {**fast_settings, "workers": 1, "warmup": 4, "eval_every": 1000, "patience": 0}
    lines = []
    seven = bytemodel.train(dna_file, tmp_path / "a", minutes=0.5, stop_at=15, log=lines.append, **s)
    assert (ck.load(seven.checkpoint).cfg.dropout, ck.load(seven.checkpoint).cfg.dropout_attn) == (0.0, 0.0)
    assert any(x.startswith("dropout auto: 7.") and "dropout 0, attention dropout 0" in x
               and "(at least 20 passes drop on nucleotides)" in x for x in lines), lines
    lines = []                          # stopped before its plan (step 10) and resumed: the resumed
    bytemodel.train(dna_file, tmp_path / "r", minutes=0.5, stop_at=5, **s)   # process looks at the data itself
    resumed = bytemodel.train(None, tmp_path / "r", resume=True, stop_at=15, log=lines.append)
    assert ck.load(resumed.checkpoint).cfg.dropout == 0.0
    assert any("(at least 20 passes drop on nucleotides)" in x for x in lines), lines
    lines = []
    many = bytemodel.train(dna_file, tmp_path / "b", minutes=1.7, stop_at=15, log=lines.append, **s)
    assert (ck.load(many.checkpoint).cfg.dropout, ck.load(many.checkpoint).cfg.dropout_attn) == (0.2, 0.2)
    assert any(x.startswith("dropout auto: 2") and "dropout 0.2, attention dropout 0.2" in x for x in lines), lines
    # --steps: 300 steps x 4 x 32 tokens over ~5.4k tokens (~7 passes): none on DNA, 0.2 on the letters
    steps = {**s, "steps": 300, "stop_at": 1}
    dna = bytemodel.train(dna_file, tmp_path / "c", **steps)
    text = bytemodel.train(_letters(dna_file, tmp_path), tmp_path / "d", **steps)
    assert ck.load(dna.checkpoint).cfg.dropout == 0.0 and ck.load(text.checkpoint).cfg.dropout == 0.2


def test_a_budget_plans_again_once_its_dropout_makes_the_steps_dearer(tmp_path, dna_file, fast_settings,
                                                                     step_clock, monkeypatch):
    """30 s on the fake clock, planned at step 10 at 0.1 s a step: 300 steps, ~7 passes, so dropout
    comes on; from then on a step takes 0.2 s. The validation at step 40 (>= REPLAN_STEPS after the
    plan) plans again: 7 s used, 23 s / 0.2 s left, so 155 steps, which the run finishes within
    its budget. With the first plan only it would run out of time at ~170 of 300."""
    import bytemodel
    from bytemodel import checkpoint as ck
    from bytemodel.training.loop import Loop
    real = Loop._plan

    def plan(self, spent):
        real(self, spent)
        step_clock.step = 0.2 if self.cfg.dropout else 0.1
    monkeypatch.setattr(Loop, "_plan", plan)
    lines = []
    s = {**fast_settings, "workers": 1, "warmup": 4, "eval_every": 20, "patience": 0}
    r = bytemodel.train(_letters(dna_file, tmp_path), tmp_path / "a", minutes=0.5, log=lines.append, **s)
    planned = ck.load(r.checkpoint).train["loop"]["planned_steps"]
    assert planned in (154, 155, 156) and r.step == planned and "finished" in r.stop_reason, (planned, r.stop_reason)
    assert any("300 steps planned" in x for x in lines) and any("with dropout: 200.0 ms/step" in x for x in lines), lines
