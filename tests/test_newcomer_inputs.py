"""What a demanding new user meets with plausible but wrong inputs (the newcomer sweep of
2026-12-08): settings of the wrong type in the Python API, bytes given as the wrong kind of
value, summaries that must not mix with data written to stdout, '-' for stdin / stdout, and
error lines that name options the command has."""
from __future__ import annotations

import os

import pytest

import bytemodel
from bytemodel.errors import ConfigError
from conftest import MODEL_SETTINGS, cli, dna, refused, subprocess_env


@pytest.mark.parametrize("name,value,words", [
    ("steps", "5", "steps must be a whole number"),
    ("steps", 2.5, "steps must be a whole number"),        # before: trained 2 steps
    ("lr", "1e-3", "lr must be a number"),
    ("eval_every", "10", "eval-every must be a whole number"),
    ("batch_size", 4.0, "batch-size must be a whole number"),
    ("baseline", "no", "baseline must be true or false"),  # before: "no" is true, the baselines ran
    ("model", "tiny", "model must be a dict"),
])
def test_a_training_setting_of_the_wrong_type_is_one_config_error(tmp_path, name, value, words):
    """bytemodel.train with a setting of the wrong type: one ConfigError naming it, before any
    work and before any folder is made (before: TypeError "'<=' not supported between instances
    of 'str' and 'int'", or the value silently taken as something else)."""
    src = dna(tmp_path / "toy.txt")
    settings = {**MODEL_SETTINGS, "model": dict(MODEL_SETTINGS["model"]), "plot": False, "baseline": False,
                "steps": 2, name: value}
    with pytest.raises(ConfigError) as e:
        bytemodel.train(src, tmp_path / "run", **settings)
    assert str(e.value) == f"{words}, got {value!r}"
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    d = tmp_path_factory.mktemp("nc")
    bytemodel.train(dna(d / "toy.txt"), d / "run", steps=2, plot=False, baseline=False, **MODEL_SETTINGS)
    return bytemodel.load(d / "run")


@pytest.mark.parametrize("call,words", [
    (lambda lm: lm.generate(3.5), "bytes must be a whole number, got 3.5"),   # before: TypeError (slice indices)
    (lambda lm: lm.generate(5, prompt=5), "prompt takes bytes"),               # before: five zero bytes
    (lambda lm: lm.generate(5, prompt=None), "prompt takes bytes"),            # before: TypeError
    (lambda lm: lm.score_documents("ACGT"), "an iterable of documents (a list of bytes), not one str"),  # before: 4 documents
    (lambda lm: lm.score_documents(b"ACGT"), "an iterable of documents (a list of bytes), not one bytes"),
    (lambda lm: lm.write(["ACGT"], "x.txt"), "write takes bytes"),
])
def test_the_api_refuses_values_of_the_wrong_kind(lm, tmp_path, monkeypatch, call, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        call(lm)
    assert not (tmp_path / "x.txt").exists()


def test_write_takes_a_str_as_its_utf8_bytes(lm, tmp_path):
    """As score, compress and generate's prompt take one (before: TypeError "string argument
    without an encoding")."""
    lm.write("ACGT naïve", tmp_path / "x.bin")
    assert (tmp_path / "x.bin").read_bytes() == "ACGT naïve".encode()


def test_tokenizer_summaries_leave_stdout_to_the_data(tmp_path):
    """`tokenizer train/encode/decode -o /dev/stdout` (an output written through, fileguard.py):
    stdout holds the data alone, the summary goes to stderr (before: the summary line was appended
    to the ids or bytes, and decode reported '-> 0 bytes', the size of the pipe)."""
    import json
    import subprocess
    import sys
    src = tmp_path / "src.txt"
    src.write_bytes(b"hello hello world, the other world " * 40)

    def run(*args):
        r = subprocess.run([sys.executable, "-m", "bytemodel.cli", "tokenizer", *map(str, args)], cwd=tmp_path,
                           env=subprocess_env(), capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout, r.stderr.decode()

    tok_json, _ = run("train", src, "--merges", "5", "-o", "/dev/stdout")
    assert json.loads(tok_json)["format"] == "bytemodel-tokenizer"
    (tmp_path / "tok.json").write_bytes(tok_json)
    run("encode", src, "-t", "tok.json", "-o", "ids.u16")
    ids, _ = run("encode", src, "-t", "tok.json", "-o", "/dev/stdout")
    assert ids == (tmp_path / "ids.u16").read_bytes()
    data, summary = run("decode", "ids.u16", "-t", "tok.json", "-o", "/dev/stdout")
    assert data == src.read_bytes()
    assert f"-> {len(data):,} bytes" in summary


def test_info_and_chat_take_the_checkpoint_as_the_other_commands_do(trained, tmp_path):
    """generate, score, eval and compress take -c RUN; info and chat answered 'No such option: -c'
    and, with no run under ./runs, told the user to 'pass --checkpoint', an option they lacked."""
    code, out = cli(["info", "-c", trained])
    assert code == 0 and f"{trained}" in out and "model: d_model" in out, out
    assert refused(*cli(["info", trained, "-c", tmp_path]), "two checkpoints given")
    code, out = cli(["chat", "--checkpoint", trained], input="hi\n")
    assert refused(code, out, "no chat tokens"), out      # the run was found and loaded: not a chat model
    for command in (["info"], ["chat"]):
        code, out = cli(command, cwd=tmp_path)
        assert refused(code, out, "no trained run found", "give the run directory or checkpoint file"), out
        assert "--checkpoint" not in out


def _bytemodel(args, cwd, stdout=None):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "bytemodel.cli", *map(str, args)], cwd=cwd, env=subprocess_env(),
                          stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)


def test_dash_as_an_output_is_standard_output(trained, tmp_path):
    """`-o -` writes to stdout as Unix tools do (before: a file named '-' was made in the current
    folder), the summary staying on stderr; appending (>>) keeps what the file held."""
    src = tmp_path / "toy.txt"
    src.write_bytes((trained.parent / "toy.txt").read_bytes()[:2000])
    r = _bytemodel(["compress", src, "-c", trained, "-o", "-"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert _bytemodel(["compress", src, "-c", trained, "-o", "x.bmz"], tmp_path).returncode == 0
    assert r.stdout == (tmp_path / "x.bmz").read_bytes() and b"-> -" in r.stderr
    r = _bytemodel(["decompress", "x.bmz", "-c", trained, "-o", "-"], tmp_path)
    assert r.returncode == 0 and r.stdout == src.read_bytes(), r.stderr
    r = _bytemodel(["generate", "-c", trained, "-n", "40", "--seed", "2", "-o", "-"], tmp_path)
    assert r.returncode == 0 and len(r.stdout) >= 40, r.stderr
    assert _bytemodel(["generate", "-c", trained, "-n", "40", "--seed", "2", "-o", "g.txt"], tmp_path).returncode == 0
    assert r.stdout == (tmp_path / "g.txt").read_bytes()
    log = tmp_path / "log.txt"
    log.write_bytes(b"kept\n")
    with open(log, "ab") as f:
        assert _bytemodel(["decompress", "x.bmz", "-c", trained, "-o", "-"], tmp_path, stdout=f).returncode == 0
    assert log.read_bytes() == b"kept\n" + src.read_bytes()
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("args", [["score", "-"], ["eval", "-"], ["compress", "-"], ["train", "-"],
                                  ["generate", "--prompt", "@-"], ["tokenizer", "encode", "-", "-t", "tok.json", "-o", "x"]])
def test_dash_as_an_input_is_one_line_saying_stdin_is_not_read(trained, tmp_path, args):
    """(before: 'source not found: -', 'not a file: -')"""
    from bytemodel.tokenizer import Tokenizer
    Tokenizer().save(tmp_path / "tok.json")
    if args[0] not in ("train", "tokenizer"):
        args = args + ["-c", trained]
    code, out = cli(args, cwd=tmp_path)
    assert refused(code, out, "'-': standard input is not read"), out


def test_samples_to_dash_and_compress_to_a_device(trained, tmp_path):
    """--samples N with -o - made files named -.0, -.1; compress -o /dev/null asked for --force
    though a device replaces nothing."""
    assert refused(*cli(["generate", "-c", trained, "-n", "5", "-N", "2", "-o", "-"], cwd=tmp_path),
                   "--samples writes a file per sample")
    assert not list(tmp_path.iterdir())
    src = tmp_path / "toy.txt"
    src.write_bytes(b"ACGT" * 100)
    code, out = cli(["compress", src, "-c", trained, "-o", os.devnull])
    assert code == 0, out


def test_finetune_resume_names_the_settings_it_keeps(trained, tmp_path):
    """`finetune --resume --lr 0.9` kept the run's own rate without a word (train --resume says
    'note: --lr 0.9 ignored on --resume'); the API's finetune(resume=True, lr=...) as well."""
    src = trained.parent / "toy.txt"
    code, out = cli(["finetune", "--from", trained, "--source", src, "--steps", "2", "--out", tmp_path / "ft",
                     "-b", "4", "--eval-every", "2", "--eval-tokens", "256", "-q"])
    assert code == 0, out
    code, out = cli(["finetune", "--resume", "--out", tmp_path / "ft", "--steps", "3", "--lr", "0.9", "-q"])
    assert code == 0, out
    assert "note: --lr 0.9 ignored on --resume: the run keeps its own 0.0005" in out, out
    assert "--batch-size" not in out      # not given: no note
    logged = []
    bytemodel.finetune(None, None, tmp_path / "ft", resume=True, steps=4, warmup=7, log=logged.append)
    assert any(line.startswith("note: --warmup 7 ignored on --resume") for line in logged), logged


def test_every_option_whose_default_stands_for_something_says_what():
    """`finetune --help` showed '--batch-size  Windows per step. [default: 0]', '--eval-every' and
    '--eval-tokens' likewise: 0 windows a step, read literally. Every option of every command whose
    default is 0 or -1 (a seed aside: 0 is a seed like any other) says what that value means, as
    train's do ('0: the preset's; ...')."""
    import typer.main
    from bytemodel.cli import app

    def options(command, name):
        for sub, c in getattr(command, "commands", {}).items():
            yield from options(c, f"{name} {sub}")
        for p in getattr(command, "params", []):
            if getattr(p, "param_type_name", "") == "option" and not p.is_flag:
                yield name, p

    silent = [(name, p.opts[0]) for name, p in options(typer.main.get_command(app), "bytemodel")
              if p.default in (0, -1) and not isinstance(p.default, bool) and p.name != "seed"
              and f"{int(p.default)}:" not in (p.help or "")]
    assert silent == []


def test_score_and_eval_do_not_advise_a_reader_flag_they_lack(trained, tmp_path):
    """A file that is not of the run's reader's format: score and eval (which read with the run's
    reader and have no --reader) said 'use --reader text or raw' / '--reader raw models the bytes
    as they are'; they say what the run reads and what they offer instead."""
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(128, 256)) * 4)          # not UTF-8: the text run's reader refuses it
    fa = tmp_path / "g.fa"
    fa.write_text(">g\n" + (trained.parent / "toy.txt").read_text()[:3000] + "\n")
    bytemodel.train(fa, tmp_path / "dna", steps=2, plot=False, baseline=False, **MODEL_SETTINGS)
    text = tmp_path / "notes.txt"
    text.write_text("plain words, no header\n" * 20)
    for run, bad, view in ((trained, binary, "text"), (tmp_path / "dna", text, "fasta")):
        for command, offer in (("score", "--raw scores the bytes"), ("eval", "score --raw FILE")):
            code, out = cli([command, bad, "-c", run])
            assert refused(code, out, f"the run reads its files as {view}", offer), out
            assert "--reader" not in out
        code, out = cli(["score", bad, "-c", run, "--raw"])
        assert code == 0, out
    code, out = cli(["train", text, "--reader", "fasta", "--out", tmp_path / "t", "--steps", "1"])
    assert refused(code, out, "not FASTA (use --reader text or raw)"), out   # train has --reader: kept


def test_a_run_directory_that_is_a_file_is_named_so(trained, tmp_path):
    """(before: 'error: File exists: notes.txt', the OS's words for a failed mkdir)"""
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    src = trained.parent / "toy.txt"
    assert refused(*cli(["train", src, "--out", notes, "--steps", "1"]), "is a file, not a run directory")
    assert refused(*cli(["finetune", "--from", trained, "--source", src, "--out", notes, "--steps", "1"]),
                   "is a file, not a run directory")
    assert notes.read_text() == "keep me"


def test_compress_and_decompress_bound_their_workers(trained, tmp_path):
    """--workers -1 ran one thread without a word; --workers 2000 made 2000 model replicas (7.9 GB
    and 27x the time on a 200 kB file at 2000 streams). Both are refused, as train's --workers."""
    src = tmp_path / "toy.txt"
    src.write_bytes((trained.parent / "toy.txt").read_bytes()[:1000])
    for w in ("-1", "2000"):
        assert refused(*cli(["compress", src, "-c", trained, "--workers", w]), "workers must be 0 (one per core) .. 256")
        assert not (tmp_path / "toy.txt.bmz").exists()
    assert cli(["compress", src, "-c", trained, "--workers", "2", "-o", tmp_path / "x.bmz"])[0] == 0
    assert refused(*cli(["decompress", tmp_path / "x.bmz", "-c", trained, "--workers", "-1", "-o", tmp_path / "y"]),
                   "workers must be 0 (one per core) .. 256")
    lm = bytemodel.load(trained)
    with pytest.raises(ConfigError, match="workers must be"):
        lm.compress(b"ACGT" * 50, workers=10 ** 6)


@pytest.mark.parametrize("kw,words", [
    (dict(top_k=2.5), "top-k must be a whole number"),        # before: TypeError from np.argpartition
    (dict(temperature="hot"), "temperature must be a number"),  # before: TypeError in a comparison
    (dict(top_p="0.9"), "top-p must be a number"),
])
def test_sampling_settings_of_the_wrong_type_are_one_config_error(lm, kw, words):
    with pytest.raises(ConfigError, match=words):
        lm.generate(5, **kw)


@pytest.mark.parametrize("call,words", [
    (lambda lm: lm.compress(b"ACGT" * 40, streams=2.5), "streams must be a whole number, got 2.5"),   # was 2
    (lambda lm: lm.compress(b"ACGT" * 40, window="8"), "window must be a whole number, got '8'"),     # was 8
    (lambda lm: bytemodel.load(5), "load takes a run directory or checkpoint file path, not a int"),  # TypeError
])
def test_more_api_values_of_the_wrong_kind(lm, call, words):
    with pytest.raises(ConfigError) as e:
        call(lm)
    assert str(e.value) == words


def test_export_force_never_deletes_another_run(trained, tmp_path):
    """`export runs/a runs/b --force` (meant: runs/b-hf) replaced the run runs/b, checkpoints and
    all, with the export; --force still replaces any other non-empty folder (tests/test_hf.py)."""
    import shutil
    other = tmp_path / "other"
    shutil.copytree(trained, other)
    before = sorted(p.name for p in other.iterdir())
    assert refused(*cli(["export", trained, other, "--force"]), "holds a bytemodel run", "never replaces")
    assert sorted(p.name for p in other.iterdir()) == before
    assert cli(["export", trained, tmp_path / "hf"])[0] == 0
    assert cli(["export", trained, tmp_path / "hf", "--force"])[0] == 0   # an earlier export: replaced


def test_import_hf_into_a_trained_run_is_refused(trained, tmp_path):
    """`import-hf HF --out RUN --force` over a trained run replaced only its checkpoint.safetensors:
    its best.safetensors stayed, and generate, score and info (which read a run's best weights)
    went on using the old model, the import unseen; the run's resume state no longer matched."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert cli(["export", trained, tmp_path / "hf"])[0] == 0
    assert refused(*cli(["import-hf", tmp_path / "hf", "--out", run, "--force"]), "holds a trained run",
                   "import into a new directory")
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert cli(["import-hf", tmp_path / "hf", "--out", tmp_path / "imp"])[0] == 0
    assert cli(["import-hf", tmp_path / "hf", "--out", tmp_path / "imp", "--force"])[0] == 0   # an import: replaced


def test_a_run_folder_under_the_source_is_not_data(tmp_path, capfd):
    """`bytemodel train .` run twice in a data folder: the second run read the first run's
    checkpoints, token file and loss.png as training data (33 kB of text became 16.7 MB)."""
    from bytemodel.readers import source_files
    data = tmp_path / "data"
    data.mkdir()
    dna(data / "a.txt")
    settings = dict(steps=2, plot=False, baseline=False, **MODEL_SETTINGS)
    first = bytemodel.train(data, data / "runs" / "one", **settings)
    capfd.readouterr()
    assert source_files(data) == [data / "a.txt"]
    err = capfd.readouterr().err
    assert f"note: skipped {data / 'runs' / 'one'} (a bytemodel run's folder" in err, err
    second = bytemodel.train(data, data / "runs" / "two", **settings)
    assert bytemodel.load(second.run_dir).train_state["n_bytes"] == bytemodel.load(first.run_dir).train_state["n_bytes"]


def test_the_run_marks_are_the_run_files_names():
    from bytemodel import checkpoint as ck, corpus
    from bytemodel.fileguard import RUN_MARKS
    assert {ck.CKPT_NAME, ck.BEST_NAME, corpus.TOKENS_FILE} == set(RUN_MARKS)


def test_dash_for_a_folder_is_refused(trained, tmp_path):
    """Where '-' is a file output it is stdout; where the output is a folder (train/finetune --out,
    export, import-hf, data get --dest) a folder named '-' was made."""
    src = trained.parent / "toy.txt"
    assert cli(["export", trained, tmp_path / "hf"])[0] == 0
    for args in (["train", src, "--out", "-", "--steps", "1"],
                 ["finetune", "--from", trained, "--source", src, "--out", "-", "--steps", "1"],
                 ["export", trained, "-o", "-"], ["import-hf", tmp_path / "hf", "--out", "-"],
                 ["data", "get", "lambda-phage", "-d", "-"]):
        assert refused(*cli(args, cwd=tmp_path), "'-' (standard output) cannot be one"), args
    assert not (tmp_path / "-").exists()


def test_generate_never_replaces_a_file_without_force(trained, tmp_path):
    """`generate -o data.fa` replaced the file it was told to write, the user's training data among
    them; now an existing file (and any sample's file with --samples) needs --force, as compress's
    output does, and is refused before any work. Standard output and /dev/null need none."""
    mine = tmp_path / "data.txt"
    mine.write_bytes(b"my own data\n")
    code, out = cli(["generate", "-c", trained, "--bytes", "8", "-o", mine])
    assert refused(code, out, "exists (use --force to overwrite it)"), out
    assert mine.read_bytes() == b"my own data\n"
    (tmp_path / "s.1.txt").write_bytes(b"a sample kept\n")
    code, out = cli(["generate", "-c", trained, "--bytes", "8", "-N", "2", "-o", tmp_path / "s.txt"])
    assert refused(code, out, "s.1.txt exists"), out
    assert not (tmp_path / "s.0.txt").exists() and (tmp_path / "s.1.txt").read_bytes() == b"a sample kept\n"
    code, out = cli(["generate", "-c", trained, "--bytes", "8", "-o", mine, "--force", "--any-byte"])
    assert code == 0 and mine.read_bytes() != b"my own data\n", out
    code, out = cli(["generate", "-c", trained, "--bytes", "8", "-o", "/dev/null"])
    assert code == 0, out
