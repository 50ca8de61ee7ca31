import os
import numpy as np
import pytest

# a small model and short runs so the training tests take seconds on two cores
# (no loss.png and no compressor baselines: tests of those turn them on)
FAST = dict(preset="tiny", context=32, batch_size=4, eval_every=5, eval_tokens=512, warmup=2,
            model={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64}, plot=False, baseline=False)


@pytest.fixture
def fast_settings():
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in FAST.items()}


@pytest.fixture
def dna_file(tmp_path):
    """Synthetic DNA with repeated motifs: learnable, 6 kB."""
    rng = np.random.default_rng(0)
    motifs = ["".join(rng.choice(list("ACGT"), 12)) for _ in range(8)]
    seq = "".join(motifs[i] for i in rng.integers(0, 8, 500))
    p = tmp_path / "toy.txt"
    p.write_text(seq)
    return p


def cli(args, cwd=None, input=None):
    """The `bytemodel` command in-process (typer's runner) -> (exit code, output); cwd: run it there."""
    from typer.testing import CliRunner
    from bytemodel.cli import app
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        r = CliRunner().invoke(app, [str(a) for a in args], input=input)
    finally:
        os.chdir(old)
    return r.exit_code, r.output


def one_error_line(out: str) -> bool:
    """What a user error must print: exactly one line, starting 'error: ', and no traceback."""
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    return len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out
