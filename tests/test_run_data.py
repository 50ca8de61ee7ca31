"""What a run records about its data (issue 22, items 1 and 6): the resolved reader, the source
and the byte values; score, generate, eval, info and the API use them; old runs keep the old
behaviour with a note."""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.cli import app
from bytemodel.decode.generate import generate
from bytemodel.model import Model
from bytemodel.ops import get_backend
from bytemodel.runinfo import RunData, byte_values, describe_bytes
from bytemodel.tokenizer import Tokenizer

runner = CliRunner()


@pytest.fixture(scope="module")
def fasta_run(tmp_path_factory):
    """A tiny run on a FASTA file (detected by its .fa extension: no --reader given)."""
    d = tmp_path_factory.mktemp("fa")
    rng = np.random.default_rng(0)
    seq = "".join(rng.choice(list("ACGT"), 3000))
    fa = d / "genome.fa"
    fa.write_text(">rec one\n" + "\n".join(seq[i:i + 60] for i in range(0, len(seq), 60)) + "\n")
    run = d / "run"
    bytemodel.train(fa, run, steps=4, preset="tiny", context=32, batch_size=4, eval_every=4, eval_tokens=256,
                    warmup=2, model={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64},
                    plot=False, baseline=False)
    return fa, run, seq


def test_the_run_records_the_detected_reader_source_and_bytes(fasta_run):
    fa, run, _ = fasta_run
    data = ck.load(run).train["data"]
    assert data["reader"] == "fasta"                  # the TrainConfig's reader stays "" (detect)
    assert data["source"] == str(fa.resolve())
    assert data["byte_values"] == sorted(b"ACGT")     # the header and newlines are not the data
    out = runner.invoke(app, ["info", str(run)]).output
    assert "reader fasta" in out and "4 values: A C G T" in out, out


def test_score_and_generate_use_the_recorded_reader(fasta_run, tmp_path):
    fa, run, seq = fasta_run
    seqfile = tmp_path / "lambda.seq"                 # FASTA content, an extension no reader claims
    seqfile.write_bytes(fa.read_bytes())
    r = runner.invoke(app, ["score", str(seqfile), "-c", str(run)])
    assert r.exit_code == 0 and f"for {len(seq):,} bytes, read as fasta" in r.output, r.output
    lm = bytemodel.load(run)
    assert lm.score_file(seqfile)["bytes"] == len(seq)
    assert lm.score_file(seqfile, raw=True)["bytes"] == seqfile.stat().st_size
    out = tmp_path / "x.xyz"                           # a name no reader claims: the run's reader writes it
    r = runner.invoke(app, ["generate", "-c", str(run), "-n", "50", "--out", str(out)])
    assert r.exit_code == 0 and out.read_bytes().startswith(b">"), r.output


def test_generation_draws_only_the_runs_bytes(fasta_run):
    _, run, _ = fasta_run
    lm = bytemodel.load(run)
    many = lm.generate(400, seed=1, samples=2) + [lm.generate(400, seed=2)]
    assert all(set(d) <= set(b"ACGT") for d in many)
    r = runner.invoke(app, ["generate", "-c", str(run), "-n", "300", "--seed", "4"])
    assert r.exit_code == 0 and set(r.stdout_bytes) <= set(b"ACGT"), r.stdout_bytes[:80]


def test_the_mask_restricts_every_sampling_path():
    """An untrained model spreads its mass over all 257 ids, so without the mask other bytes
    come out at once; with it, only the allowed ones (plain, batched, top-k)."""
    from bytemodel.config import ModelConfig
    tok = Tokenizer()
    model = Model(ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=32, context=16), get_backend("cpu"))
    model.init_weights(0)
    allowed = RunData(None, frozenset(b"ACGT")).allowed_ids(tok)
    assert allowed.sum() == 4 + 1                                  # the four letters and <doc>
    free = generate(model, tok, 300, seed=0)
    assert not set(free) <= set(b"ACGT")                           # the test can fail
    assert set(generate(model, tok, 300, seed=0, allowed=allowed)) <= set(b"ACGT")
    assert all(set(d) <= set(b"ACGT") for d in generate(model, tok, 100, seed=0, samples=3, allowed=allowed))
    assert set(generate(model, tok, 50, top_k=2, allowed=allowed)) <= set(b"ACGT")
    # greedy ends: <doc> (no bytes) is masked too, else it could win every draw
    assert len(generate(model, tok, 50, temperature=0, allowed=allowed)) == 50


def test_byte_values_through_merges():
    tok = Tokenizer.train([b"abab abab xyxy"], 3)
    ids = tok.encode(b"abab abab")
    assert byte_values(ids.astype(np.uint16), tok) == sorted(set(b"ab "))
    assert describe_bytes(range(256)) == "256 values: 0x00-0xff"


def test_an_old_run_keeps_the_old_behaviour_with_a_note(fasta_run, tmp_path):
    """A checkpoint without the "data" record (written before it existed) loads: its reader is
    the one its settings name ("" = detection) and every byte may be sampled."""
    fa, run, _ = fasta_run
    ld = ck.load(run)
    old = tmp_path / "old"
    old.mkdir()
    train = {k: v for k, v in ld.train.items() if k != "data"}
    ck.save(old / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params, train, ld.m, ld.v)
    lm = bytemodel.load(old)
    assert lm.data.byte_values is None and lm.reader == "" and lm.data.allowed_ids(lm.tokenizer) is None
    r = runner.invoke(app, ["generate", "-c", str(old), "-n", "20"])
    assert r.exit_code == 0 and "has no record of the reader" in r.output
    assert "trained before runs recorded" in runner.invoke(app, ["info", str(old)]).output


def test_a_crafted_data_record_is_refused_in_one_line(fasta_run, tmp_path):
    _, run, _ = fasta_run
    ld = ck.load(run)
    bad = tmp_path / "bad"
    bad.mkdir()
    ck.save(bad / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params, {**ld.train, "data": {"byte_values": [300]}})
    r = runner.invoke(app, ["generate", "-c", str(bad), "-n", "5"])
    assert r.exit_code == 2 and r.output.strip().startswith("error:") and "data record" in r.output


def test_a_finetune_adds_its_parents_bytes(fasta_run, tmp_path):
    _, run, _ = fasta_run
    txt = tmp_path / "more.txt"
    txt.write_text("TTTTNNNN" * 200)
    ft = bytemodel.finetune(run, txt, tmp_path / "ft", steps=2, batch_size=4, eval_every=2, eval_tokens=128,
                            warmup=1, plot=False)
    values = ck.load(ft.run_dir).train["data"]["byte_values"]
    assert values == sorted(set(b"ACGTN"))
    assert json.loads(json.dumps(values)) == values


def test_compress_codes_the_view_of_the_recorded_reader(fasta_run, tmp_path):
    """compress takes the reader the run recorded (its settings say "" when it was detected): a
    FASTA run codes a .fa file's bases; the same weights recorded as a text run code the file's
    bytes as they are, where detection alone would pick FASTA. Both decode to the exact original."""
    pytest.importorskip("constriction")
    from conftest import cli
    fa, run, seq = fasta_run
    code, out = cli(["compress", fa, "-c", run, "-o", tmp_path / "a.bmz"])
    assert code == 0 and "fasta split: 1 document(s)" in out, out
    ld = ck.load(run / ck.BEST_NAME)
    text_run = tmp_path / "text_run"
    text_run.mkdir()
    ck.save(text_run / ck.BEST_NAME, ld.cfg, ld.tokenizer, ld.params,
            {**ld.train, "data": {**ld.train["data"], "reader": "text"}})
    code, out = cli(["compress", fa, "-c", text_run, "-o", tmp_path / "b.bmz"])
    assert code == 0 and "fasta split" not in out, out
    for name, r in (("a", run), ("b", text_run)):
        code, out = cli(["decompress", tmp_path / f"{name}.bmz", "-c", r, "-o", tmp_path / name])
        assert code == 0 and (tmp_path / name).read_bytes() == fa.read_bytes(), out
