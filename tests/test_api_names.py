"""The API's errors name the API's arguments, the CLI's the CLI's flags: one message serves both
(errors.named; the CLI's commands run inside errors.cli_names). Before, bytemodel.train(None) said
"no source given (--source PATH)", a flag a Python user does not have."""
from __future__ import annotations

import shutil

import pytest

import bytemodel
from bytemodel.errors import BytemodelError, ConfigError, SourceError
from conftest import MODEL_SETTINGS, cli, dna, refused


def test_train_without_a_source_names_the_argument(tmp_path):
    with pytest.raises(SourceError) as e:
        bytemodel.train(None, tmp_path / "run", steps=2, **MODEL_SETTINGS)
    assert str(e.value) == "no source given (source=PATH)"


def test_resume_without_a_run_directory_names_the_arguments():
    with pytest.raises(ConfigError) as e:
        bytemodel.train(None, None, resume=True)
    assert str(e.value) == "resume=True needs the run directory (out_dir=DIR)"
    with pytest.raises(ConfigError) as e:
        bytemodel.finetune(None, None, None, resume=True)
    assert str(e.value) == "resume=True needs the run directory (out_dir=DIR)"


def test_a_fine_tune_without_a_parent_names_the_argument(tmp_path):
    with pytest.raises(ConfigError) as e:
        bytemodel.finetune(None, dna(tmp_path / "toy.txt"), tmp_path / "ft")
    assert str(e.value) == "a fine-tune needs the run to start from (finetune(parent, ...))"


def test_a_run_directory_that_holds_a_run_names_the_arguments(trained, tmp_path):
    src = dna(tmp_path / "toy.txt")
    with pytest.raises(ConfigError) as e:
        bytemodel.train(src, trained, steps=2, **MODEL_SETTINGS)
    assert str(e.value) == f"{trained} already holds a checkpoint; use resume=True to continue it or another out_dir"
    run = shutil.copytree(trained, tmp_path / "run")
    with pytest.raises(ConfigError) as e:                 # a fine-tune into a run (lineage.py)
        bytemodel.finetune(trained, src, run, steps=2)
    assert str(e.value) == f"{run} already holds a checkpoint; use resume=True to continue it or another out_dir"
    with pytest.raises(ConfigError) as e:
        bytemodel.finetune(trained, src, trained, steps=2)
    assert str(e.value) == "the fine-tune needs its own run directory (out_dir), not its parent's"


def test_the_cli_keeps_its_flags(trained, tmp_path):
    """The same messages from the command name its flags, word for word as before."""
    src = dna(tmp_path / "toy.txt")
    code, out = cli(["train", "--resume"], cwd=tmp_path)
    assert refused(code, out) and out.strip() == "error: --resume needs the run directory (--out DIR)", out
    code, out = cli(["train", "--source", str(src), "--out", str(trained), "--steps", "2"], cwd=tmp_path)
    assert refused(code, out) and out.strip().endswith(
        "already holds a checkpoint; use --resume to continue it or another --out"), out
    code, out = cli(["finetune", "--from", str(trained), "--source", str(src), "--out", str(trained)], cwd=tmp_path)
    assert refused(code, out) and out.strip() == \
        "error: the fine-tune needs its own run directory (--out), not its parent's", out
    # and an API call after a CLI one names the arguments again
    with pytest.raises(SourceError, match=r"\(source=PATH\)"):
        bytemodel.train(None, tmp_path / "run2")


def test_last_with_a_checkpoint_file_is_refused(trained, tmp_path):
    """load(file, last=True) loaded the file and ignored last without a word: last picks a run
    directory's weights, so with a file it is one ConfigError (the CLI's --last the same)."""
    best = trained / "best.safetensors"
    with pytest.raises(ConfigError) as e:
        bytemodel.load(best, last=True)
    assert str(e.value) == (f"last=True picks a run directory's latest weights; {best} is a checkpoint file, "
                            f"loaded as it is: give its run directory, or leave out last")
    assert bytemodel.load(best).path == best                        # without last: the file
    assert bytemodel.load(trained, last=True).path.name == "checkpoint.safetensors"
    code, out = cli(["generate", "-c", str(best), "--last", "--bytes", "8"], cwd=tmp_path)
    assert refused(code, out, "--last picks a run directory's latest weights", "leave out --last"), out


def test_an_unknown_compress_option_is_one_config_error(trained):
    """lm.compress(data, bogus=1) was Python's "got an unexpected keyword argument 'bogus'"
    TypeError; decompress the same: one ConfigError naming the options there are."""
    lm = bytemodel.load(trained)
    with pytest.raises(ConfigError) as e:
        lm.compress(b"ACGT" * 20, bogus=1, streems=2)
    assert str(e.value).startswith("compress takes no option 'bogus', 'streems' (its options: streams, window, ")
    assert "reader" in str(e.value) and "adapt" in str(e.value)
    with pytest.raises(ConfigError) as e:
        lm.decompress(b"", bogus=1)
    assert str(e.value).startswith("decompress takes no option 'bogus' (its options: workers")


@pytest.mark.parametrize("settings,words", [
    (dict(steps="x"), "steps must be a whole number, got 'x'"),
    (dict(lr="1e-3"), "lr must be a number, got '1e-3'"),
])
def test_train_config_validate_is_a_config_error_for_a_wrong_type(settings, words):
    """bytemodel.TrainConfig, public, checked by itself: a setting of the wrong type is one
    ConfigError from validate() (validation.check_train_types), not a TypeError from comparing it."""
    with pytest.raises(ConfigError) as e:
        bytemodel.TrainConfig(**settings).validate()
    assert str(e.value) == words


def _file(tmp_path, trained):
    """A file where a run directory goes."""
    p = tmp_path / "a-file"
    p.write_text("x")
    return p


def _chat_line(tmp_path, trained):
    p = tmp_path / "qa.jsonl"
    p.write_text('{"prompt": "a", "completion": "b"}\n{"messages": []}\n')
    return p


# (API call, its words; CLI args, the words the CLI said before and still says): the messages raised
# outside bytemodel/cli/ that named a flag to a Python user (errors.named since)
NAMED = {
    "cpu-precision": (
        lambda t, tmp, src: bytemodel.train(src, tmp / "r", steps=2, device="cpu", precision="bf16", **MODEL_SETTINGS),
        'the CPU backend computes in fp32 only (use precision="fp32")',
        lambda t, tmp, src: ["train", "--source", src, "--out", tmp / "r", "--steps", "2", "--device", "cpu",
                             "--precision", "bf16"],
        "the CPU backend computes in fp32 only (use --precision fp32)"),
    "finetune-tokenizer": (
        lambda t, tmp, src: bytemodel.finetune(t, src, tmp / "ft", merges=10),
        "a fine-tune keeps its parent's tokenizer: drop merges / tokenizer",
        None, None),
    "val-without-examples": (
        lambda t, tmp, src: bytemodel.finetune(t, src, tmp / "ft", val_source=src),
        'val_source=FILE is for examples (examples="pairs" / "chat"); plain data holds out its tail',
        lambda t, tmp, src: ["finetune", "--from", t, "--source", src, "--out", tmp / "ft", "--val", src],
        "--val FILE is for examples (--pairs / --chat); plain data holds out its tail"),
    "pair-file-holds-a-chat": (
        lambda t, tmp, src: bytemodel.finetune(t, _chat_line(tmp, t), tmp / "ft", examples="pairs"),
        '(this line is a chat: use examples="chat")',
        lambda t, tmp, src: ["finetune", "--from", t, "--pairs", _chat_line(tmp, t), "--out", tmp / "ft"],
        "(this line is a chat: use --chat)"),
    "speculative-without-heads": (
        lambda t, tmp, src: bytemodel.load(t).generate(8, speculative=True),
        "speculative decoding needs a model trained with multi-token heads (mtp=2 or more)",
        None, None),   # the CLI's generate --speculative says its own first
    "content-not-an-image": (
        lambda t, tmp, src: bytemodel.load(t).compress(b"ACGT" * 20, content=True),
        "content=True codes an image's pixels",
        lambda t, tmp, src: ["compress", src, "-c", t, "--content", "-o", tmp / "x.bmz"],
        "--content codes an image's pixels"),
    "out-is-a-file": (
        lambda t, tmp, src: bytemodel.train(src, _file(tmp, t), steps=2, **MODEL_SETTINGS),
        "is a file, not a run directory",
        lambda t, tmp, src: ["train", "--source", src, "--out", _file(tmp, t), "--steps", "2"],
        "--out {tmp}/a-file is a file, not a run directory"),
    "resume-behind-the-run": (
        lambda t, tmp, src: bytemodel.train(None, shutil.copytree(t, tmp / "r"), resume=True, steps=3),
        "the run is already at step 5; give steps larger than that to continue",
        lambda t, tmp, src: ["train", "--resume", "--out", shutil.copytree(t, tmp / "r"), "--steps", "3"],
        "the run is already at step 5; give --steps larger than that to continue"),
    "too-little-data": (
        lambda t, tmp, src: bytemodel.train(dna(tmp / "small.txt", 60), tmp / "r", steps=2, **MODEL_SETTINGS),
        "(try a smaller context)",
        lambda t, tmp, src: ["train", "--source", dna(tmp / "small.txt", 60), "--out", tmp / "r", "--steps", "2",
                             "--preset", "tiny", "--context", "32"],
        "(try a smaller --context)"),
}


@pytest.mark.parametrize("case", NAMED)
def test_shared_messages_name_the_api_arguments(case, trained, tmp_path):
    """Each message names the API's argument to a Python caller (before: the CLI's flag, e.g.
    "use --precision fp32" from bytemodel.train(..., precision="bf16"))."""
    call, words, _, _ = NAMED[case]
    with pytest.raises(BytemodelError) as e:
        call(trained, tmp_path, dna(tmp_path / "toy.txt"))
    assert words in str(e.value), str(e.value)
    assert " --" not in str(e.value) and not str(e.value).startswith("--"), str(e.value)


@pytest.mark.parametrize("case", [c for c in NAMED if NAMED[c][2]])
def test_shared_messages_keep_the_cli_flags(case, trained, tmp_path):
    """The same messages from the commands name their flags, word for word as before."""
    _, _, args, words = NAMED[case]
    code, out = cli(args(trained, tmp_path, dna(tmp_path / "toy.txt")), cwd=tmp_path)
    assert code == 2 and out.strip().splitlines()[-1].startswith("error: "), out
    assert words.format(tmp=tmp_path) in out.strip().splitlines()[-1], out
