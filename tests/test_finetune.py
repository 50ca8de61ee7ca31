"""Fine-tuning: the loss mask (gradient-checked, masked targets contribute exactly nothing), the
examples corpus, fine-tune runs (parent recorded, learning, exact resume), vocabulary growth."""
import json

import numpy as np
import pytest

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.errors import ConfigError, SourceError
from bytemodel.training.finetune import finetune, parent_val_bpb
from bytemodel.lineage import grow_vocab
from bytemodel.gradcheck import BOUND, check_tensors, tiny_config
from bytemodel.model import Model, views
from bytemodel.ops import numpy_ops
from bytemodel.ops import numpy_ops as op
from bytemodel.pairs import ExampleCorpus, encode_example, read_examples, stream_of
from bytemodel.training.runner import CoreParallel
from bytemodel.tokenizer import Tokenizer

from test_ops import close, numgrad

FT = dict(batch_size=4, eval_every=5, eval_tokens=512, warmup=2)


# ------------------------------------------------------------------------------------- the mask
def test_masked_cross_entropy_against_finite_differences():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((7, 11)) * 3
    t = rng.integers(0, 11, size=7)
    mask = np.array([1, 0, 1, 1, 0, 0, 1], dtype=np.uint8)
    losses, cache = op.cross_entropy_forward(logits, t, mask)
    full, _ = op.cross_entropy_forward(logits, t)
    close(losses, full * mask)                         # kept rows as without a mask, masked rows 0
    w = rng.standard_normal(7)                         # non-zero upstream gradient on every row
    d = op.cross_entropy_backward(w, cache)
    close(d, numgrad(lambda x_: op.cross_entropy_forward(x_, t, mask)[0], logits, w))
    assert (d[mask == 0] == 0).all() and (np.abs(d[mask == 1]).sum(axis=1) > 0).all()


def _model64(cfg, seed=0):
    rng = np.random.default_rng(seed)
    m = Model(cfg, numpy_ops, dtype=np.float64)
    m.params[:] = rng.standard_normal(m.size) * 0.3    # as gradcheck: every path carries signal
    return m


def test_masked_model_gradients_against_finite_differences():
    """Every parameter tensor of the masked mean loss, float64 (gradcheck's eps and bound)."""
    cfg = tiny_config(mtp=1)  # the main head: the MTP heads are not masked (see finetune.py)
    m = _model64(cfg)
    rng = np.random.default_rng(1)
    B, T = 2, cfg.context
    idx = rng.integers(0, cfg.vocab_size, size=(B, T))
    tgt = rng.integers(0, cfg.vocab_size, size=(B, T))
    mask = (rng.random((B, T)) < 0.5).astype(np.uint8)
    mask[0, 0] = 1

    def loss():
        losses = m.forward(idx, tgt)
        return float((losses * mask.reshape(-1)).sum() / mask.sum())   # the masked mean, by hand

    m.grads[:] = 0
    m.loss_and_grad(idx, tgt, mask / mask.sum())   # the masked mean
    for r in check_tensors(m, loss, m.grads.copy(), rng, per_tensor=8):
        assert r.max_rel_error <= BOUND, f"{r.name}: {r.max_rel_error:.2e}"


def test_masked_targets_contribute_exactly_nothing():
    """Other targets under the mask give bit-identical gradients, equal to zeroing their share of
    the loss by hand; and the mask matters (an unmasked run differs)."""
    cfg = tiny_config(mtp=1)  # the main head: the MTP heads are not masked (see finetune.py)
    rng = np.random.default_rng(2)
    idx = rng.integers(0, cfg.vocab_size, size=(2, cfg.context))
    tgt = rng.integers(0, cfg.vocab_size, size=(2, cfg.context))
    mask = (rng.random(tgt.shape) < 0.5).astype(np.uint8)
    other = np.where(mask == 1, tgt, (tgt + 1 + rng.integers(0, 5, size=tgt.shape)) % cfg.vocab_size)
    assert (other != tgt).any()

    def grads(targets, mask_):
        m = _model64(cfg)
        m.grads[:] = 0
        m.loss_and_grad(idx, targets, 1 / targets.size if mask_ is None else mask_ / mask_.sum())
        return m.grads.copy()
    g = grads(tgt, mask)
    assert np.array_equal(g, grads(other, mask))
    m = _model64(cfg)
    m.grads[:] = 0
    m.forward(idx, tgt)
    m.backward(mask.reshape(-1) / mask.sum())          # d(masked mean)/d(per-token loss), by hand
    np.testing.assert_allclose(g, m.grads, rtol=1e-12, atol=1e-15)
    assert not np.allclose(g, grads(tgt, None))


def test_masked_gradients_split_over_workers_add_up():
    cfg = tiny_config(mtp=1)  # the main head: the MTP heads are not masked (see finetune.py)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, cfg.vocab_size, size=(5, cfg.context))
    tgt = rng.integers(0, cfg.vocab_size, size=(5, cfg.context))
    mask = (rng.random(tgt.shape) < 0.3).astype(np.uint8)
    mask[2] = 0                                        # a slice may hold no counted target
    one = _model64(cfg)
    one.loss_and_grad(idx, tgt, 3.0 * mask / mask.sum())
    two = _model64(cfg)
    par = CoreParallel(two, workers=3)
    par.loss_and_grad(idx, tgt, 3.0 * mask / mask.sum())
    par.close()
    np.testing.assert_allclose(two.grads, one.grads, rtol=1e-10, atol=1e-14)  # float64 sums in another order


# ------------------------------------------------------------------------------------- examples
def test_pairs_encoding_by_hand(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "ab", "completion": "c"}\n\n{"prompt": {"b64": "AP8="}, "completion": ""}\n')
    ex = read_examples(f, "pairs")
    assert ex == [(b"ab", b"c"), (b"\x00\xff", b"")]
    tok = Tokenizer()
    ids, mask = encode_example(ex[0], "pairs", tok)
    assert ids.tolist() == [97, 98, 99, 256] and mask.tolist() == [0, 0, 1, 1]
    tokens, m, spans = stream_of([encode_example(e, "pairs", tok) for e in ex])
    assert tokens[1:].tolist() == [97, 98, 99, 256, 0, 255, 256] and m.tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    assert spans.tolist() == [[0, 4], [4, 7]]


@pytest.mark.parametrize("line,msg", [
    ('{"prompt": "a"}', "exactly the keys"),
    ('{"prompt": "a", "completion": {"b64": "@@"}}', "invalid base64"),
    ('{"prompt": 3, "completion": "x"}', "expected a string"),
    ('not json', "not valid JSON"),
    ('{"messages": []}', 'use examples="chat"'),     # the API's words (the CLI's --chat: test_api_names)
])
def test_bad_pair_lines_name_the_line(tmp_path, line, msg):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a", "completion": "b"}\n' + line + "\n")
    with pytest.raises(SourceError, match=f"p.jsonl:2.*{msg}"):
        read_examples(f, "pairs")


def _unique_corpus(seed=0, n=30, n_train=22):
    """A corpus whose token at position i is i (so a target names its position), examples of 1-40
    tokens, a random mask inside each example."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 40, size=n)
    ends = np.cumsum(lens)
    spans = np.stack([np.r_[0, ends[:-1]], ends], axis=1).astype(np.int64)
    tokens = np.arange(ends[-1] + 1, dtype=np.int64)
    mask = (rng.random(len(tokens)) < 0.6).astype(np.uint8)
    mask[0] = 0
    mask[spans[:, 1]] = 1                               # each example's last target counts
    return ExampleCorpus(tokens, mask, spans, n_train, 0, "", "pairs")


def test_training_windows_start_at_an_example_and_never_see_held_out_ones():
    c = _unique_corpus()
    T = 16
    anchors = c.anchors(T)
    assert set(c.spans[:c.n_train, 0].tolist()) <= set(anchors.tolist())
    assert anchors.max() < c.split                      # none in the held-out examples
    long = [(s, e) for s, e in c.spans[:c.n_train] if e - s > T]
    assert len(anchors) > c.n_train and long            # long examples get extra starts
    for s, e in long:                                   # every target has >= T/2 tokens of its example
        inside = anchors[(anchors >= s) & (anchors < e)]
        for p in range(s + 1, e + 1):
            best = max(p - a for a in inside if a < p <= a + T)
            assert best >= min(T // 2, p - s)
    for step in range(30):
        x, y, m = c.sample(6, T, seed=1, step=step)
        assert (x[:, 1:] == y[:, :-1]).all()
        for row_x, row_y, row_m in zip(x, y, m):
            a = int(row_x[0])                           # the token is its position
            assert a in set(anchors.tolist())
            real = row_y <= c.split - 1                 # beyond: padding, counted for nothing
            assert (row_y[real] == a + 1 + np.nonzero(real)[0]).all()
            assert not row_m[~real].any()
            assert np.array_equal(row_m[real], np.asarray(c.mask)[row_y[real]])
    assert all(np.array_equal(p, q) for p, q in zip(c.sample(4, T, 1, 3), c.sample(4, T, 1, 3)))
    assert not np.array_equal(c.sample(4, T, 1, 3)[0], c.sample(4, T, 1, 4)[0])


@pytest.mark.parametrize("T", [8, 64])
def test_eval_windows_score_every_counted_held_out_target_once(T):
    c = _unique_corpus(seed=1)
    scored = np.concatenate([y[m == 1] for _, y, m in c.eval_windows(T, 10**9)])
    want = np.nonzero(np.asarray(c.mask)[c.split:])[0] + c.split
    assert np.array_equal(np.sort(scored), want)        # each exactly once, nothing else
    for x, y, m in c.eval_windows(T, 10**9):            # and each with its example before it
        a = int(x[0])
        s = c.spans[np.searchsorted(c.spans[:, 1], y[m == 1].min())][0]
        assert s <= a and (y[m == 1] - a >= np.minimum(T // 2, y[m == 1] - s)).all()



def test_eval_windows_budget_zero_means_every_held_out_target():
    """eval_tokens 0 (a GPU's default: the whole held-out part) scores every counted target, as the
    plain corpus does, not one example cut to one token."""
    c = _unique_corpus(seed=1)
    every = sorted(np.concatenate([y[m == 1] for _, y, m in c.eval_windows(8, 10**9)]).tolist())
    zero = sorted(np.concatenate([y[m == 1] for _, y, m in c.eval_windows(8, 0)]).tolist())
    assert zero == every and len(every) > 1


# ------------------------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A small model pretrained on 'word -> reversed word.' lines, and the same as pairs / chats."""
    d = tmp_path_factory.mktemp("ft")
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefgh"), 5)) for _ in range(60)]
    (d / "src.txt").write_text("".join(f"{w} = {w[::-1]}.\n" for w in words) * 3)
    from conftest import FAST
    bytemodel.train(d / "src.txt", d / "pre", steps=20, **{**FAST, "model": dict(FAST["model"])})
    with open(d / "pairs.jsonl", "w") as f:
        for w in words:
            f.write(json.dumps({"prompt": f"{w} =", "completion": f" {w[::-1]}."}) + "\n")
    with open(d / "chat.jsonl", "w") as f:
        for w in words:
            f.write(json.dumps({"messages": [{"role": "system", "content": "reverse"},
                                             {"role": "user", "content": w},
                                             {"role": "assistant", "content": w[::-1]}]}) + "\n")
    return d


def test_finetune_records_its_parent_and_learns(parent, tmp_path):
    r = finetune(parent / "pre", parent / "pairs.jsonl", tmp_path / "ft", examples="pairs", steps=20, lr=3e-3, **FT)
    ld = ck.load(r.checkpoint)
    cfg = ld.train["config"]
    pre = ck.load(parent / "pre")
    assert cfg["parent"] == str(parent / "pre") and cfg["parent_sha256"] == ck._sha(pre.params)
    assert ld.train["step"] == 20 and ld.train["optim"]["t"] == 20     # a fresh optimizer: its own 20 steps
    assert ld.tokenizer.to_dict() == pre.tokenizer.to_dict() and ld.cfg == pre.cfg
    before = parent_val_bpb(r.run_dir)
    assert r.val_bpb < before - 0.3, (before, r.val_bpb)      # held-out completions got cheaper
    assert (tmp_path / "ft" / "examples.json").exists() and (tmp_path / "ft" / "mask.u8").exists()


def test_finetune_starts_from_the_parent_weights(parent, tmp_path):
    """One step at lr 1e-12 moves no float32 weight visibly: what is saved is where it started."""
    r = finetune(parent / "pre", parent / "src.txt", tmp_path / "plain", steps=1, lr=1e-12, **FT)
    init, ft = ck.load(parent / "pre").params, ck.load(r.checkpoint).params
    np.testing.assert_allclose(ft, init, rtol=1e-6, atol=1e-9)
    assert np.abs(init).max() > 0.01                    # a trained model, not zeros


@pytest.mark.parametrize("kind", ["pairs", "chat"])
def test_finetune_resume_is_bit_identical(parent, tmp_path, kind):
    src = parent / f"{kind}.jsonl"
    straight = finetune(parent / "pre", src, tmp_path / "a", examples=kind, steps=12, **FT)
    first = finetune(parent / "pre", src, tmp_path / "b", examples=kind, steps=12, stop_at=7, **FT)
    assert first.interrupted and first.step == 7
    resumed = finetune(None, None, tmp_path / "b", resume=True)
    assert resumed.step == 12
    a, b = ck.load(straight.checkpoint), ck.load(resumed.checkpoint)
    assert np.array_equal(a.params, b.params) and np.array_equal(a.m, b.m) and np.array_equal(a.v, b.v)
    other = finetune(parent / "pre", src, tmp_path / "c", examples=kind, steps=12, **{**FT, "seed": 1})
    assert not np.array_equal(ck.load(other.checkpoint).params, a.params)


def test_chat_finetune_grows_the_vocabulary_from_the_doc_row(parent, tmp_path):
    r = finetune(parent / "pre", parent / "chat.jsonl", tmp_path / "c", examples="chat", steps=1, lr=1e-12, **FT)
    pre, ft = ck.load(parent / "pre"), ck.load(r.checkpoint)
    assert ft.cfg.vocab_size == pre.cfg.vocab_size + 4
    assert ft.tokenizer.specials == ("<doc>", "<system>", "<user>", "<assistant>", "<end>")
    grown = views(grow_vocab(pre.params, pre.cfg, ft.cfg, pre.tokenizer.doc_id), ft.cfg)
    old = views(pre.params, pre.cfg)
    V, doc = pre.cfg.vocab_size, pre.tokenizer.doc_id
    assert np.array_equal(grown["wte"][:V], old["wte"]) and (grown["wte"][V:] == old["wte"][doc]).all()
    assert np.array_equal(grown["lm_head"][:, :V], old["lm_head"])
    assert (grown["lm_head"][:, V:] == old["lm_head"][:, doc:doc + 1]).all()
    assert np.array_equal(grown["layers.0.wqkv"], old["layers.0.wqkv"])


def test_finetune_refuses_bad_setups(parent, tmp_path):
    with pytest.raises(ConfigError, match="own run directory"):
        finetune(parent / "pre", parent / "pairs.jsonl", parent / "pre", examples="pairs", steps=2, **FT)
    with pytest.raises(ConfigError, match="keeps its parent's tokenizer"):
        finetune(parent / "pre", parent / "src.txt", tmp_path / "x", steps=2, merges=10, **FT)
    with pytest.raises(SourceError, match='use examples="pairs"'):
        finetune(parent / "pre", parent / "pairs.jsonl", tmp_path / "y", examples="chat", steps=2, **FT)
    with pytest.raises(ConfigError, match="not for a fine-tune"):
        finetune(parent / "pre", parent / "src.txt", tmp_path / "z", steps=2, preset="small")


def test_two_ranks_fine_tune_as_one_process(parent, tmp_path):
    """Data parallel with a loss mask: 3 + 2 windows on 2 MPI ranks, each weighted by its share of
    the batch's counted targets, give the one-process run (tolerance as tests/test_distributed.py)."""
    import subprocess
    import sys
    from test_distributed import ATOL, MPIEXEC, RTOL, ROOT, _env
    if MPIEXEC is None:
        pytest.skip("needs mpi4py and mpiexec (pip install 'bytemodel[mpi]')")
    one = finetune(parent / "pre", parent / "pairs.jsonl", tmp_path / "one", examples="pairs", steps=6,
                   batch_size=5, eval_every=3, eval_tokens=512, warmup=2, workers=1)
    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(ROOT / "tests" / "mpi_finetune.py"),
                        str(parent / "pre"), str(parent / "pairs.jsonl"), str(tmp_path / "dp")],
                       capture_output=True, text=True, timeout=240, env=_env())
    assert r.returncode == 0, r.stdout + r.stderr
    a, b = ck.load(one.checkpoint), ck.load(tmp_path / "dp")
    assert np.allclose(b.params, a.params, atol=ATOL, rtol=RTOL), np.abs(b.params - a.params).max()
    assert not np.allclose(a.params, ck.load(parent / "pre").params, atol=ATOL, rtol=RTOL)
    la, lb = ([json.loads(s)["loss"] for s in (d / "metrics.jsonl").read_text().splitlines()]
              for d in (tmp_path / "one", tmp_path / "dp"))
    assert np.allclose(lb, la, rtol=1e-6) and np.isclose(b.train["val_bpb"], a.train["val_bpb"], rtol=1e-6)


def test_resume_refuses_changed_examples(parent, tmp_path):
    r = finetune(parent / "pre", parent / "pairs.jsonl", tmp_path / "a", examples="pairs", steps=4, stop_at=2, **FT)
    mask = tmp_path / "a" / "mask.u8"
    data = bytearray(mask.read_bytes())
    data[5] ^= 1                                        # one target counted or not: a different run
    mask.write_bytes(bytes(data))
    with pytest.raises(SourceError, match="damaged or changed"):
        finetune(None, None, r.run_dir, resume=True)


def test_the_api_functions_stay_callable_after_every_module_is_imported():
    """bytemodel.train() and bytemodel.finetune() are functions: importing any module of the package
    (as the CLI does) must not replace them with a module of the same name (a root module
    finetune.py did, so the API's second call failed)."""
    import importlib
    import pkgutil
    import bytemodel
    for m in pkgutil.walk_packages(bytemodel.__path__, "bytemodel."):
        if not m.name.startswith(("bytemodel.ops.cuda", "bytemodel.ops.nccl")) and not m.name.endswith("__main__"):   # CuPy-only; the command itself
            importlib.import_module(m.name)
    for name in bytemodel.__all__:
        assert not isinstance(getattr(bytemodel, name), type(bytemodel)), f"bytemodel.{name} is a module"


def test_cli_finetune_dropout_flags(parent, tmp_path):
    """`finetune --dropout / --dropout-attn` set the fine-tune's own; without them it keeps the
    parent's (0 here); a bad value is one error line; --resume refuses to change them."""
    from typer.testing import CliRunner
    from bytemodel.cli import app
    base = ["finetune", "--from", str(parent / "pre"), "--source", str(parent / "src.txt"), "--steps", "2",
            "--eval-every", "2", "--eval-tokens", "64", "--quiet"]
    r = CliRunner().invoke(app, base + ["--out", str(tmp_path / "a"), "--dropout", "0.2", "--dropout-attn", "0.1"])
    assert r.exit_code == 0, r.output
    cfg = ck.load(tmp_path / "a").cfg
    assert (cfg.dropout, cfg.dropout_attn) == (0.2, 0.1)
    r = CliRunner().invoke(app, base + ["--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    parent_cfg = ck.load(parent / "pre").cfg
    cfg = ck.load(tmp_path / "b").cfg
    assert (cfg.dropout, cfg.dropout_attn) == (parent_cfg.dropout, parent_cfg.dropout_attn)
    r = CliRunner().invoke(app, base + ["--out", str(tmp_path / "c"), "--dropout", "0.95"])
    assert r.exit_code == 2 and "error:" in r.output and "dropout" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["finetune", "--resume", "--out", str(tmp_path / "a"), "--dropout", "0.3"])
    assert r.exit_code == 2 and "error:" in r.output and "--resume keeps it" in r.output
