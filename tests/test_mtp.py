"""Multi-token prediction heads and self-speculative decoding.

- every head tensor, and the trunk's gradient through the heads, against finite differences;
- head k is trained on the token k positions ahead (targets checked by hand);
- greedy speculative decoding emits the same ids as plain greedy decoding;
- sampling through speculation has ordinary sampling's distribution (a chi-square test against
  the exact joint probabilities of a tiny model), and the same test rejects a wrong acceptance rule;
- the CLI trains with --mtp, the checkpoint carries the heads, and generate --speculative runs.
"""
import math
from itertools import product

import numpy as np
import pytest

from bytemodel.decode import speculative
from bytemodel.config import ModelConfig
from bytemodel.decode.generate import plain_ids
from bytemodel.gradcheck import BOUND, check_model, tiny_config
from bytemodel.model import Model, layout
from bytemodel.ops import numpy_ops
from bytemodel.mtp import shifted_targets
from bytemodel.decode.speculative import SpecStats, speculative_ids


@pytest.mark.parametrize("overrides", [
    {"mtp": 3, "mtp_design": "independent"},
    {"mtp": 3, "mtp_design": "sequential", "tie_embeddings": True},
    {"mtp": 2, "mtp_weight": 1.7, "n_kv_heads": 1},
])
def test_heads_and_trunk_match_finite_differences(overrides):
    rows = check_model(tiny_config(**overrides), per_tensor=8, seed=5)
    names = {r.name for r in rows}
    k = overrides["mtp"]
    assert {f"mtp.{k}.norm", f"mtp.{k}.w_gateup", f"mtp.{k}.w_down", f"mtp.{k}.norm_f"} <= names
    bad = [(r.name, r.max_rel_error) for r in rows if r.max_rel_error > BOUND]
    assert not bad, bad


def test_the_check_sees_a_wrong_head_gradient(monkeypatch):
    """Drop the heads' contribution to the trunk: the trunk tensors must fail, not the heads'."""
    import bytemodel.model as model_mod
    real = model_mod.mtp_backward

    def no_trunk_grad(*a, **k):
        real(*a, **k)
        return None
    monkeypatch.setattr(model_mod, "mtp_backward", no_trunk_grad)
    rows = check_model(tiny_config(mtp=3), per_tensor=6, seed=1)
    bad = {r.name for r in rows if not r.ok}
    assert "layers.1.w_down" in bad and "mtp.2.w_down" not in bad


def test_head_k_targets_are_k_ahead():
    tg = np.array([[10, 11, 12, 13], [20, 21, 22, 23]])
    ids, w = shifted_targets(tg, 3, np)
    assert ids.tolist() == [12, 13, 0, 0, 22, 23, 0, 0]
    assert w.tolist() == [1, 1, 0, 0, 1, 1, 0, 0]
    ids, w = shifted_targets(tg, 6, np)   # beyond the window: nothing to learn
    assert w.sum() == 0


def test_no_heads_keeps_the_layout():
    plain = layout(tiny_config(mtp=1))
    assert not any(n.startswith("mtp.") for n, _, _ in plain)
    assert layout(tiny_config(mtp=3))[:len(plain)] == plain


def _model(V=3, K=3, seed=0, scale=0.6, dtype=np.float64, context=24):
    cfg = ModelConfig(vocab_size=V, d_model=16, n_layers=2, n_heads=2, d_ff=24, context=context, mtp=K)
    m = Model(cfg, numpy_ops, dtype=dtype)
    m.init_weights(seed)
    rng = np.random.default_rng(seed + 100)
    m.params[:] = rng.standard_normal(m.size) * scale   # peaked, head-specific distributions
    return m


def test_greedy_is_identical_with_and_without_speculation():
    m = _model(V=11, K=4, context=32)
    hist = [1, 5, 2]
    stats = SpecStats()
    n = 80  # longer than the context: the re-read path runs too
    spec = [t for t, _ in zip(speculative_ids(m, hist, np.random.default_rng(0), 0.0, stats=stats), range(n))]
    plain = [t for t, _ in zip(plain_ids(m, hist, np.random.default_rng(0), 0.0), range(n))]
    assert spec == plain
    assert stats.steps > 0 and stats.drafted == 3 * stats.steps


def _exact_joint(m, hist, n):
    """Probability of every id sequence of length n after hist under plain sampling (T=1)."""
    V = m.cfg.vocab_size
    probs = {}
    for prefix in product(range(V), repeat=n - 1):
        ids = np.array([hist + list(prefix)])
        logits = m.forward_cached(ids, m.new_cache(1, ids.shape[1]), 0)[0]
        lp = logits - logits.max(-1, keepdims=True)
        p = np.exp(lp) / np.exp(lp).sum(-1, keepdims=True)
        steps = [p[len(hist) - 1 + i] for i in range(n)]
        for last in range(V):
            seq = prefix + (last,)
            probs[seq] = math.prod(steps[i][seq[i]] for i in range(n))
    return probs


def _chi_square_p(observed: dict, expected: dict, total: int) -> float:
    """Goodness-of-fit p-value; cells with expected count < 5 pooled; Wilson-Hilferty tail."""
    stat, pool_o, pool_e, cells = 0.0, 0, 0.0, 0
    for seq, p in expected.items():
        e, o = p * total, observed.get(seq, 0)
        if e < 5:
            pool_o, pool_e = pool_o + o, pool_e + e
            continue
        stat += (o - e) ** 2 / e
        cells += 1
    if pool_e > 0:
        stat += (pool_o - pool_e) ** 2 / pool_e
        cells += 1
    k = cells - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _sample_many(m, hist, n, draws, seed):
    rng = np.random.default_rng(seed)
    counts = {}
    for _ in range(draws):
        seq = tuple(t for t, _ in zip(speculative_ids(m, hist, rng, 1.0), range(n)))
        counts[seq] = counts.get(seq, 0) + 1
    return counts


def test_speculative_sampling_keeps_the_distribution(monkeypatch):
    """4 tokens (t0, two drafts judged, then a draw after the block) over a 3-id vocabulary:
    81 outcomes, 2,000 draws, against the exact joint. The seed is fixed, so the test is
    deterministic; at the 1e-3 level a correct sampler fails 1 seed in 1,000. A wrong rule
    (every draft accepted) is rejected at far below 1e-6."""
    m = _model()
    hist, n, draws = [0, 2], 4, 2000
    exact = _exact_joint(m, hist, n)
    assert abs(sum(exact.values()) - 1) < 1e-9
    p_ok = _chi_square_p(_sample_many(m, hist, n, draws, seed=7), exact, draws)
    assert p_ok > 1e-3, p_ok
    monkeypatch.setattr(speculative, "_accept", lambda p_d, q_d, u: True)
    p_bad = _chi_square_p(_sample_many(m, hist, n, draws, seed=7), exact, draws)
    assert p_bad < 1e-6, p_bad


def test_cli_trains_heads_and_generates_speculatively(tmp_path, monkeypatch):
    from typer.testing import CliRunner
    from bytemodel.cli import app
    from bytemodel import checkpoint as ck
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "toy.txt"
    src.write_bytes(b"ACGTTGCAAGCT" * 400)
    r = CliRunner().invoke(app, ["train", "--source", str(src), "--steps", "6", "--context", "32",
                                 "--batch-size", "4", "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
                                 "--d-ff", "48", "--mtp", "3", "--mtp-weight", "0.5", "--out", "run"])
    assert r.exit_code == 0, r.output
    loaded = ck.load(tmp_path / "run")
    assert loaded.cfg.mtp == 3 and loaded.cfg.mtp_weight == 0.5
    r1 = CliRunner().invoke(app, ["generate", "-c", "run", "--bytes", "50", "-t", "0", "--speculative"])
    r2 = CliRunner().invoke(app, ["generate", "-c", "run", "--bytes", "50", "-t", "0"])
    assert r1.exit_code == 0 and r2.exit_code == 0, (r1.output, r2.output)
    # an untrained float32 model has near-tied logits, where a block forward and one-token
    # forwards may round to different arg-maxes: identity is tested in float64 above
    assert len(r1.stdout_bytes) >= 50 and len(r2.stdout_bytes) >= 50
    assert "drafts accepted" in r1.output
    r3 = CliRunner().invoke(app, ["score", "toy.txt", "-c", "run"])
    assert r3.exit_code == 0 and "bits/byte" in r3.output


def test_speculative_on_a_model_without_heads_is_one_error_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner
    from bytemodel.cli import app
    monkeypatch.chdir(tmp_path)
    (tmp_path / "toy.txt").write_bytes(b"hello world " * 300)
    r = CliRunner().invoke(app, ["train", "--source", "toy.txt", "--steps", "2", "--context", "16",
                                 "--batch-size", "2", "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
                                 "--d-ff", "16", "--out", "run"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["generate", "-c", "run", "--bytes", "5", "--speculative"])
    assert r.exit_code == 2 and "error:" in r.output and "--mtp" in r.output
    assert "Traceback" not in r.output


def test_data_parallel_workers_agree_with_heads():
    """Thread replicas (training/runner.py's CoreParallel) split the batch; the heads' gradients must sum the same."""
    from bytemodel.training.runner import CoreParallel
    cfg = tiny_config(mtp=3, vocab_size=13, context=8)
    m = Model(cfg, numpy_ops)
    m.init_weights(3)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 13, size=(4, 8))
    y = rng.integers(0, 13, size=(4, 8))
    m.loss_and_grad(x, y, 1 / x.size)
    one = m.grads.copy()
    m.grads[:] = 0
    CoreParallel(m, workers=2).loss_and_grad(x, y, 1 / x.size)
    # float32 sums in a different order: ~1e-7 relative per element, 1e-5 absolute is ample
    np.testing.assert_allclose(m.grads, one, rtol=1e-4, atol=1e-5)
