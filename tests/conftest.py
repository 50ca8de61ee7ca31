import os
import shutil
from pathlib import Path

import numpy as np
import pytest

# the compressor codes with the model even where its toy models expand a file (bytemodel would pack
# such a file's bytes instead: compress/driver.py): the tests exercise the model's coding; the tests
# of the packed view turn it back on (monkeypatch.setenv("BYTEMODEL_PACK", "1"))
os.environ["BYTEMODEL_PACK"] = "0"

# a small model and short runs so the training tests take seconds on two cores
# (no loss.png and no compressor baselines: tests of those turn them on)
FAST = dict(preset="tiny", context=32, batch_size=4, eval_every=5, eval_tokens=512, warmup=2,
            model={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64}, plot=False, baseline=False)


@pytest.fixture
def step_clock(monkeypatch):
    """A fake clock for time budgets: every training step takes exactly 0.1 s, validations and
    saves none (training/budget.py and training/loop.py read it)."""
    from bytemodel.training import budget

    class Clock:
        t = 100.0
        step = 0.1    # seconds a step takes (a test may change it mid-run)

        def perf_counter(self):
            return self.t

        def time(self):
            return 1.7e9 + self.t
    clock = Clock()
    monkeypatch.setattr(budget, "time", clock)
    monkeypatch.setattr("bytemodel.training.loop.time", clock)
    real_mark = budget.Budget.mark

    def mark(self, step):
        clock.t += clock.step
        real_mark(self, step)
    monkeypatch.setattr(budget.Budget, "mark", mark)
    return clock


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


def refused(code: int, out: str, *words: str) -> bool:
    """A refusal: exit status 2, exactly one line, starting 'error: ', no traceback, naming the words."""
    return code == 2 and one_error_line(out) and all(w.lower() in out.lower() for w in words)


def ends_refused(code: int, out: str, *words: str) -> bool:
    """Like refused, for commands that print progress first: the last line is the error."""
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    return bool(lines) and refused(code, lines[-1], *words) and "Traceback" not in out


# The fault tests' small model (what the CLI flags and the API settings say), and a finished CLI run's files
MODEL_FLAGS = ["--context", "32", "--batch-size", "4", "--eval-every", "5", "--eval-tokens", "256",
               "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--d-ff", "64", "-q", "--no-baseline"]
MODEL_SETTINGS = dict(preset="tiny", context=32, batch_size=4, eval_every=5, eval_tokens=256, warmup=2,
                      model={"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64})
CORE_FILES = {"checkpoint.safetensors", "tokens.u16", "corpus.json", "metrics.jsonl",
              "best.safetensors", "loss.png", "baselines.json"}


def dna(path: Path, n: int = 6000, seed: int = 0) -> Path:
    """Synthetic DNA of n bytes with repeated motifs (the same bytes as dna_file's for the defaults)."""
    rng = np.random.default_rng(seed)
    motifs = ["".join(rng.choice(list("ACGT"), 12)) for _ in range(8)]
    path.write_text("".join(motifs[i] for i in rng.integers(0, 8, n // 12)))
    return path


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A finished 5-step run (checkpoint at step 5), shared read-only: tests that change it take run_copy."""
    import bytemodel
    base = tmp_path_factory.mktemp("trained")
    src = dna(base / "toy.txt")
    bytemodel.train(src, base / "run", steps=5, **MODEL_SETTINGS)
    return base / "run"


@pytest.fixture
def run_copy(trained, tmp_path):
    """A copy of the trained run that a test may damage."""
    dst = tmp_path / "run"
    shutil.copytree(trained, dst)
    return dst


def subprocess_env() -> dict:
    """The environment for a child python that must import this tree's bytemodel."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# A child python's own peak memory in KiB, as source to paste into its script. Not ru_maxrss: Linux
# carries the forking parent's high-water mark across exec into it, so under pytest (hundreds of MB
# after the earlier tests) it measures the parent. /proc/self/status's VmHWM belongs to the new image.
PEAK_KB = (
    "def peak_kb():\n"
    "    try:\n"
    "        return int(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])\n"
    "    except (OSError, IndexError):\n"
    "        import resource\n"
    "        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n")


def leftovers(folder: Path) -> list[str]:
    """Temporary files a writer left behind."""
    return sorted(p.name for p in folder.iterdir() if "tmp" in p.name.lower())


def gpu_marks(cp) -> list:
    """A GPU test file's pytestmark: `cp = pytest.importorskip("cupy")` skips the file without CuPy,
    then `pytestmark = gpu_marks(cp)` marks its tests `gpu` and skips them without a CUDA device (CI)."""
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception:  # CuPy installed, no driver
        n = 0
    return [pytest.mark.gpu, pytest.mark.skipif(n == 0, reason="no CUDA GPU")]


def _hopper_bwd_under_test():
    """BYTEMODEL_TEST_HOPPER_BWD=flash_bwd_h64_m160 (kernels of
    benchmarks/kernels/flash_hopper_variants.cu, comma-separated, at most one a head dim): the GPU
    tests run the Hopper backward at each kernel's head dim on it instead of the shipped one (with
    attention dropout too where the file has its twin name + "_drop", else the shipped dropout
    kernel), so that a study variant is tested as if shipped before it ships
    (benchmarks/device_check.sh dq)."""
    names = [n for n in os.environ.get("BYTEMODEL_TEST_HOPPER_BWD", "").split(",") if n]
    if not names:
        return
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks" / "kernels"))
    import flash_attn
    from bytemodel.ops import cuda_ops
    by_d = {int(n.split("_h", 1)[1].split("_", 1)[0]): n for n in names}
    shipped = cuda_ops.CudaBackend._hopper_bwd_kernel

    def variant(self, D_, drop=False):
        name = by_d.get(D_)
        if name is None or (drop and not flash_attn.hopper_bwd_has_drop(name)):
            return shipped(self, D_, drop=drop)
        fn, tiles = flash_attn.hopper_bwd_variant(self.precision, name, D_, drop=drop)
        # in the shipped kernel's slot, where the tests look for which backward ran
        self._fns["flash_hopper.cu", cuda_ops.FLASH_BWD_HOPPER[D_][0] + ("_drop" if drop else "")] = fn
        return fn, tiles
    cuda_ops.CudaBackend._hopper_bwd_kernel = variant


_hopper_bwd_under_test()


def cuda_backend(precision: str, hopper: bool | None = None):
    """The CUDA backend at this precision; the test is skipped where that precision cannot run
    (bf16 without ml_dtypes). hopper: None, the GPU's own attention path; True, the wgmma kernels
    (skipped off compute capability 9.x); False, FlashAttention-2's everywhere."""
    from bytemodel.ops.cuda_ops import CudaBackend
    if hopper:
        import cupy
        if int(cupy.cuda.Device().compute_capability) // 10 != 9:
            pytest.skip("the wgmma kernels need compute capability 9.x")
    try:
        return CudaBackend(precision, hopper=hopper)
    except RuntimeError as e:
        pytest.skip(str(e))


def cuda_backends():
    """A module's `backend(precision)`: cuda_backend made once per precision for that module."""
    made = {}

    def backend(precision: str):
        if precision not in made:
            made[precision] = cuda_backend(precision)
        return made[precision]
    return backend
