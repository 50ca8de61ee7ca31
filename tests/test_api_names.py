"""The API's errors name the API's arguments, the CLI's the CLI's flags: one message serves both
(errors.named; the CLI's commands run inside errors.cli_names). Before, bytemodel.train(None) said
"no source given (--source PATH)", a flag a Python user does not have."""
from __future__ import annotations

import shutil

import pytest

import bytemodel
from bytemodel.errors import ConfigError, SourceError
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
