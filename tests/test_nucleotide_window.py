"""Base reads nucleotides through a shorter window (training/autoconf.nucleotide_window): a fresh
run on data that is all nucleotide codes, at base, that left --context and --batch-size to the run
gets NUCLEOTIDE_CONTEXT tokens a window and the batch that keeps base's tokens a step; anything the
user gave, other data and the other presets keep theirs."""
import numpy as np
import pytest

from bytemodel.config import PRESETS, TrainConfig
from bytemodel.training.autoconf import NUCLEOTIDE_CONTEXT, PRESET_TRAIN, nucleotide_window, resolve
from bytemodel.training.prepare import prepare


def _resolved(nucleotides=True, **given):
    tc = TrainConfig(**{"preset": "base", "precision": "bf16", **given})
    resolve(tc, "cuda", 20_000_000, 1, train_tokens=18_000_000, nucleotides=nucleotides)
    return tc


def test_base_on_nucleotides_reads_short_windows_of_the_same_tokens_a_step():
    tc = _resolved()
    assert NUCLEOTIDE_CONTEXT == 256
    assert (tc.context, tc.batch_size) == (256, 128)
    assert tc.context * tc.batch_size == PRESETS["base"]["context"] * PRESET_TRAIN["base"]["batch_size"]


@pytest.mark.parametrize("given", [dict(context=1024), dict(context=512), dict(batch_size=32), dict(batch_size=8)])
def test_what_the_user_gave_is_kept(given):
    tc = _resolved(**given)
    assert tc.context == given.get("context", 0)          # 0: the preset's, as without the rule
    assert tc.batch_size == given.get("batch_size", PRESET_TRAIN["base"]["batch_size"])


def test_other_data_other_presets_and_fine_tunes_keep_the_preset_window():
    assert (_resolved(nucleotides=False).context, _resolved(nucleotides=False).batch_size) == (0, 32)
    for preset in ("tiny", "small"):
        assert nucleotide_window(preset, 32) is None
        tc = _resolved(preset=preset)
        assert (tc.context, tc.batch_size) == (0, PRESET_TRAIN[preset]["batch_size"])
    tc = TrainConfig(preset="base", precision="bf16")     # no training tokens: a fine-tune's settings
    resolve(tc, "cuda", None, 1, nucleotides=True)
    assert (tc.context, tc.batch_size) == (0, 32)


def _fasta(path, n, letters=b"ACGT", seed=0):
    rng = np.random.default_rng(seed)
    seq = np.frombuffer(letters, np.uint8)[rng.integers(0, len(letters), n)].tobytes()
    path.write_bytes(b">chr1 test\n" + b"\n".join(seq[i:i + 70] for i in range(0, n, 70)) + b"\n")
    return path


def test_a_run_on_a_genome_at_base_is_prepared_with_the_short_window(tmp_path):
    src = _fasta(tmp_path / "g.fa", 30_000)
    run = prepare(TrainConfig(source=str(src), out_dir=str(tmp_path / "run"), preset="base", steps=2,
                              device="cpu", reader="fasta:revcomp=no"))
    assert run.cfg.context == 256 and run.tc.batch_size == 128 and run.tc.context == 256
    assert any(n.startswith("nucleotides: base reads windows of 256 tokens, 128 a step") for n in run.notes)
    # the same bytes in letters that are not nucleotide codes: base's own window
    other = _fasta(tmp_path / "o.fa", 30_000, letters=b"EFHIJ")
    run = prepare(TrainConfig(source=str(other), out_dir=str(tmp_path / "run2"), preset="base", steps=2,
                              device="cpu", reader="fasta:revcomp=no"))
    assert run.cfg.context == 1024 and run.tc.batch_size == 32
    assert not any(n.startswith("nucleotides:") for n in run.notes)
