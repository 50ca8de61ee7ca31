"""A run's held-out tail read as `bytemodel score` reads a file (corpus.overlapped_windows,
decode/score.score_windows, the end-of-run line of `bytemodel train`): the same targets as the
run's validations (corpus.eval_windows), each with at least half a window before it where the
stream has it; over a whole stream, exactly `score`'s windows.

Tolerance: score_windows against `score` of the same document, 1e-9 relative: the same windows in
the same batches, so the same float64 sums (only the order of the final additions may differ)."""
import re

import numpy as np
import pytest

from bytemodel.config import ModelConfig
from bytemodel.corpus import eval_windows, overlapped_windows
from bytemodel.decode.score import score, score_windows
from bytemodel.model import Model
from bytemodel.ops import numpy_ops
from bytemodel.tokenizer import Tokenizer

CFG = dict(vocab_size=257, d_model=32, n_layers=2, n_heads=2, d_ff=64, context=16)


def _targets_of_eval(tokens, T, cap):
    """The targets eval_windows scores, worked out by hand: window w holds targets w*T .. w*T+T-1."""
    n = len(tokens) - 1
    n_win = (n + T - 1) // T
    keep = max(1, min(n_win, cap // T))
    picks = np.linspace(0, n_win - 1, keep).round().astype(int) if keep < n_win else range(n_win)
    return [t for w in picks for t in range(int(w) * T, min(n, int(w) * T + T))]


@pytest.mark.parametrize("n,T,cap", [(1, 16, 10**9), (17, 16, 10**9), (100, 16, 10**9), (333, 16, 64),
                                     (1000, 32, 256), (1000, 32, 10**9), (64, 64, 10**9)])
def test_the_same_targets_as_the_validations_each_with_half_a_window(n, T, cap):
    tokens = np.arange(n + 1, dtype=np.uint16)            # token i stands at position i
    got, half = [], T // 2
    for x, y, k in overlapped_windows(tokens, T, cap):
        assert 1 <= len(x) == len(y) <= T and 0 <= k < len(y)
        assert np.array_equal(y, x + 1)                   # y is x moved by one
        for j in range(k, len(y)):
            t = int(x[j])                                 # the target predicts token t + 1 from t and before
            got.append(t)
            assert j >= half or x[0] == 0, (t, j)         # half a window before it, or the stream's start
    assert got == _targets_of_eval(tokens, T, cap)        # each once, in the validations' order
    assert got == [t for x, y in eval_windows(tokens, T, cap) for t in x[0].tolist()]


def test_over_a_whole_document_it_is_score(tmp_path):
    m = Model(ModelConfig(**CFG), numpy_ops)
    m.init_weights(3)
    m.load_flat(m.params * 8)
    tok = Tokenizer()
    data = bytes(np.random.default_rng(0).integers(65, 75, 333, dtype=np.uint8))
    ids = np.concatenate([[tok.doc_id], tok.encode(data)]).astype(np.uint16)
    a = score_windows(m, tok, overlapped_windows(ids, 16, len(ids) + 16))
    b = score(m, tok, data)
    assert a["bytes"] == b["bytes"] == 333 and a["tokens"] == b["tokens"]
    assert abs(a["bits"] - b["bits"]) <= 1e-9 * b["bits"]


def test_the_end_of_a_run_reports_the_tail_as_score_reads_it(tmp_path, dna_file):
    from typer.testing import CliRunner
    from bytemodel import load
    from bytemodel.cli import app
    from bytemodel.training.prepare import open_run_corpus
    run_dir = tmp_path / "run"
    r = CliRunner().invoke(app, ["train", "--source", str(dna_file), "--steps", "6", "--out", str(run_dir),
                                 "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64",
                                 "--context", "32", "--batch-size", "4", "--device", "cpu", "-q"])
    assert r.exit_code == 0, r.output
    m = re.search(r"held-out tail, bits/byte: model (\d+\.\d+) \(read as `score` reads a file; (\d+\.\d+) at "
                  r"validation\)", r.output)
    assert m, r.output
    lm = load(run_dir)
    tail = open_run_corpus(run_dir).val
    want = score_windows(lm.model, lm.tokenizer, overlapped_windows(tail, 32, 131072))["bits_per_byte"]
    assert lm.score_tail()["bits_per_byte"] == want          # the public API's figure is the same
    assert float(m.group(1)) == pytest.approx(want, abs=1e-4)   # printed to 4 digits
    assert "best: step" in r.output and m.group(2) in r.output.split("best:")[1].split("\n")[0]


def test_a_failure_of_the_tail_figure_is_named_and_the_run_kept(tmp_path, dna_file, monkeypatch):
    from typer.testing import CliRunner
    import bytemodel
    from bytemodel.cli import app

    def broken(self, run_dir=None):
        raise ZeroDivisionError("planted")
    monkeypatch.setattr(bytemodel.LanguageModel, "score_tail", broken)
    run_dir = tmp_path / "run"
    r = CliRunner().invoke(app, ["train", "--source", str(dna_file), "--steps", "4", "--out", str(run_dir),
                                 "--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--d-ff", "64",
                                 "--context", "32", "--batch-size", "4", "--device", "cpu", "-q"])
    assert r.exit_code == 0, r.output
    assert "note: the held-out tail could not be scored as `score` reads it (ZeroDivisionError: planted)" in r.output
    assert (run_dir / "best.safetensors").exists() and "Traceback" not in r.output
