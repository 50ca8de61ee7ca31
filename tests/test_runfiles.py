"""Run folders under fault injection (issue 17, runfiles): the corpus is verified on resume, a failed
or signalled run leaves no folder behind, and metrics.jsonl continues cleanly after a resume."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import numpy as np
import pytest

from bytemodel import checkpoint as ck
from conftest import MODEL_FLAGS, cli, dna, ends_refused, refused, subprocess_env


# ================================================================================================
# the run's token file and corpus.json are verified on resume
# ================================================================================================
def test_resume_refuses_a_flipped_bit_in_the_token_file(run_copy):
    tokens = run_copy / "tokens.u16"
    b = bytearray(tokens.read_bytes())
    b[1001] ^= 0x04
    tokens.write_bytes(bytes(b))
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "7", "-q"])
    assert refused(code, out, "token"), out
    assert ck.load(run_copy).train["step"] == 5   # nothing trained, nothing saved


@pytest.mark.parametrize("content", ["{}", "null", "[]", "split0", "split_past_end", "not json"])
def test_corpus_json_damage_is_one_line(run_copy, content):
    p = run_copy / "corpus.json"
    info = json.loads(p.read_text())
    p.write_text({"split0": json.dumps({**info, "split": 0}),
                  "split_past_end": json.dumps({**info, "split": info["n_tokens"] + 5})}.get(content, content))
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "8", "-q"])
    assert refused(code, out, "corpus"), out


def test_out_of_vocabulary_ids_in_a_resumed_corpus(run_copy):
    """Ids past the vocabulary (a crafted run whose hashes were updated to match) are refused."""
    import hashlib
    tokens = np.fromfile(run_copy / "tokens.u16", dtype="<u2")
    tokens[::7] = 60000
    tokens.tofile(run_copy / "tokens.u16")
    digest = hashlib.sha256(tokens.tobytes()).hexdigest()
    info = json.loads((run_copy / "corpus.json").read_text())
    (run_copy / "corpus.json").write_text(json.dumps({**info, "sha256": digest}))
    ld = ck.load(run_copy)
    ck.save(run_copy / ck.CKPT_NAME, ld.cfg, ld.tokenizer, ld.params, {**ld.train, "corpus_sha256": digest},
            ld.m, ld.v)
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "8", "-q"])
    assert refused(code, out, "60000"), out



# ================================================================================================
# no empty run folders after a failure or a signal; a folder the user made is kept
# ================================================================================================
def test_failed_run_leaves_no_run_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    small = tmp_path / "small.txt"
    small.write_text("ACGT" * 5)   # too little data for one window: fails after the folder is made
    code, out = cli(["train", "--source", small, "--steps", "2"] + MODEL_FLAGS)
    assert refused(code, out, "too little data"), out
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []
    # a run that fails after its corpus is built, before its first checkpoint (diverges)
    code, out = cli(["train", "--source", dna(tmp_path / "d.txt"), "--out", tmp_path / "div", "--steps", "4",
                     "--lr", "1e30", "--grad-clip", "0"] + MODEL_FLAGS)
    assert ends_refused(code, out, "diverged"), out
    assert not (tmp_path / "div").exists()


def test_sigterm_before_the_first_checkpoint_leaves_no_run_folder(tmp_path):
    import time
    run = tmp_path / "run"
    args = [sys.executable, "-m", "bytemodel.cli", "train", "--source", str(dna(tmp_path / "d.txt")), "--out",
            str(run), "--steps", "100000", "--context", "32", "--batch-size", "4", "--eval-every", "100000",
            "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--d-ff", "64", "-q", "--no-baseline"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    deadline = time.time() + 60
    while time.time() < deadline and not (run / "metrics.jsonl").exists():
        time.sleep(0.05)
    assert (run / "metrics.jsonl").exists(), p.communicate()   # training under way, no checkpoint yet
    p.terminate()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert not run.exists()


def test_an_existing_out_folder_is_kept_after_a_failure(tmp_path):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    small = tmp_path / "small.txt"
    small.write_text("ACGT" * 5)
    assert refused(*cli(["train", "--source", small, "--out", keep, "--steps", "2"] + MODEL_FLAGS))
    assert sorted(p.name for p in keep.iterdir()) == ["notes.txt"]



# ================================================================================================
# metrics.jsonl after a resume: no duplicated steps, no glued truncated line
# ================================================================================================
def test_resume_trims_metrics_past_the_checkpoint_and_a_torn_last_line(run_copy):
    m = run_copy / "metrics.jsonl"
    lines = m.read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4, 5]
    # as if the process logged steps 6-7 after the step-5 checkpoint and died writing step 8
    extra = [json.dumps({**json.loads(lines[-1]), "step": s}) for s in (6, 7)]
    m.write_text("\n".join(lines + extra) + "\n" + '{"step": 8, "lo')
    code, out = cli(["train", "--resume", "--out", run_copy, "--steps", "9", "-q"])
    assert code == 0, out
    steps = [json.loads(x)["step"] for x in m.read_text().splitlines()]   # every line parses
    assert steps == list(range(1, 10))


def test_fresh_run_into_a_folder_with_stale_metrics_starts_them_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"st')
    code, out = cli(["train", "--source", dna(tmp_path / "d.txt"), "--out", run, "--steps", "3"] + MODEL_FLAGS)
    assert code == 0, out
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]

