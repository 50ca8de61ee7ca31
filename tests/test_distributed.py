"""Data parallel over MPI ranks (bytemodel.training.distributed).

The MPI tests start real jobs with `mpiexec -n 2` on this machine's CPU (the `[mpi]` extra's
mpi4py + MPICH, or a system MPI) and skip cleanly where mpi4py or mpiexec is missing.

Tolerance for "the same run": a rank sums its share of the batch and MPI adds the two shares,
where one process sums all rows in one pass, so gradients differ by float32 rounding (~1e-7
relative). AdamW normalises each update to about lr (2e-3 here) per step, so after 10 steps the
weights may differ by a few 1e-7 (measured: 6e-7 at most, weights up to 1.0). We allow
atol 1e-5 + rtol 1e-5: 200x below one step's update, so a rank that skipped the all-reduce or
weighted its share wrongly (a change of order lr in every weight it touches) fails.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.training import distributed
from bytemodel.corpus import sample_batch
from bytemodel.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
ATOL = RTOL = 1e-5


def _mpiexec():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    beside = Path(sys.executable).parent / "mpiexec"     # the `mpich` wheel installs it here
    return str(beside) if beside.exists() else shutil.which("mpiexec")


MPIEXEC = _mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="needs mpi4py and mpiexec (pip install 'bytemodel[mpi]')")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "SLURM_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update(extra)
    return env


def _close(a, b):
    return np.allclose(a, b, atol=ATOL, rtol=RTOL)


# ------------------------------------------------------------------ without MPI
def test_rows_partition_the_batch_in_order():
    for batch in (2, 5, 7, 16):
        for size in (1, 2, 3):
            if batch < size:
                continue
            parts = [distributed.rows(batch, r, size) for r in range(size)]
            got = np.concatenate([np.arange(batch)[s] for s in parts])
            assert np.array_equal(got, np.arange(batch))
            assert max(s.stop - s.start for s in parts) - min(s.stop - s.start for s in parts) <= 1


def test_a_ranks_rows_are_those_rows_of_the_whole_batch():
    tokens = np.arange(5000, dtype=np.uint16)
    x, y = sample_batch(tokens, 5, 16, seed=3, step=9)
    for r in range(2):
        s = distributed.rows(5, r, 2)
        xr, yr = sample_batch(tokens, 5, 16, seed=3, step=9, rows=s)
        assert np.array_equal(xr, x[s]) and np.array_equal(yr, y[s])


def test_launcher_environment_decides_the_world(monkeypatch):
    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(var, raising=False)
    assert distributed.launched_size() == 1
    assert isinstance(distributed.connect("auto"), distributed.Single)
    assert isinstance(distributed.connect("off"), distributed.Single)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    assert distributed.launched_size() == 4
    assert isinstance(distributed.connect("off"), distributed.Single)
    with pytest.raises(ConfigError, match="unknown distributed mode"):
        distributed.connect("nccl")


def test_launched_without_mpi4py_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setattr(distributed, "_mpi_world", None)
    monkeypatch.setitem(sys.modules, "mpi4py", None)      # import fails as if not installed
    with pytest.raises(ConfigError, match=r"mpi4py is not installed .*bytemodel\[mpi\]"):
        distributed.connect("auto")


def test_bad_collective_timeout_is_refused(monkeypatch):
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "soon")
    with pytest.raises(ConfigError, match=distributed.TIMEOUT_ENV):
        distributed.collective_timeout()
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "2.5")
    assert distributed.collective_timeout() == 2.5


def test_shard_optimizer_alone_is_plain_training(tmp_path, dna_file, fast_settings):
    """One process: --shard-optimizer has nothing to split and changes nothing, bit for bit."""
    a = bytemodel.train(dna_file, tmp_path / "a", steps=6, workers=1, **fast_settings)
    b = bytemodel.train(dna_file, tmp_path / "b", steps=6, workers=1, shard_optimizer=True, **fast_settings)
    assert np.array_equal(ck.load(a.checkpoint).params, ck.load(b.checkpoint).params)


# ------------------------------------------------------------------ with MPI
@needs_mpi
def test_two_ranks_train_the_run_of_one_process(tmp_path, dna_file, fast_settings):
    fast = dict(fast_settings)
    # one process: the references, and the start of a run that 2 ranks will continue
    one = bytemodel.train(dna_file, tmp_path / "one", steps=10, workers=1, **fast)
    one5 = bytemodel.train(dna_file, tmp_path / "one5", steps=10, workers=1, **{**fast, "batch_size": 5})
    bytemodel.train(dna_file, tmp_path / "grow", steps=10, workers=1, stop_at=4, **{**fast, "batch_size": 5})

    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(ROOT / "tests" / "mpi_runs.py"), str(tmp_path),
                        str(dna_file), json.dumps(fast)], capture_output=True, text=True, timeout=240, env=_env())
    assert r.returncode == 0, r.stdout + r.stderr

    # 1. two ranks, 2 windows each == one process, 4 windows: weights, moments, losses
    a, b = ck.load(one.checkpoint), ck.load(tmp_path / "dp")
    assert _close(b.params, a.params), np.abs(b.params - a.params).max()
    assert _close(b.m, a.m) and _close(b.v, a.v)
    assert not np.array_equal(a.params, ck.load(tmp_path / "one5").params)   # the check can fail
    la = [json.loads(s) for s in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(s) for s in (tmp_path / "dp" / "metrics.jsonl").read_text().splitlines()]
    assert [d["step"] for d in lb] == list(range(1, 11))                     # rank 0 alone writes
    assert np.allclose([d["loss"] for d in lb], [d["loss"] for d in la], rtol=1e-6)
    assert np.isclose(b.train["val_bpb"], a.train["val_bpb"], rtol=1e-6)  # validation split over ranks

    # 2. ZeRO-1 on 3 + 2 windows, stopped at 6 (seen by rank 1 only), resumed by one process unsharded
    z = ck.load(tmp_path / "zero")
    assert z.train["step"] == 6 and z.m.shape == z.params.shape          # full moments in the file
    assert len((tmp_path / "zero" / "metrics.jsonl").read_text().splitlines()) == 6
    bytemodel.train(None, tmp_path / "zero", resume=True)
    ref = ck.load(one5.checkpoint)
    z = ck.load(tmp_path / "zero")
    assert z.train["step"] == 10
    assert _close(z.params, ref.params) and _close(z.m, ref.m) and _close(z.v, ref.v)

    # 3. started by one process (to step 4), continued on 2 ranks sharded: the same run again
    g = ck.load(tmp_path / "grow")
    assert g.train["step"] == 10
    assert _close(g.params, ref.params) and _close(g.m, ref.m) and _close(g.v, ref.v)


def _rank_pid(launcher_pid: int, rank: int, timeout: float = 30):
    """The pid of an MPI rank started under the launcher (found through /proc)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        children = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(d.name))
        todo, below = [launcher_pid], []
        while todo:
            for c in children.get(todo.pop(), []):
                below.append(c)
                todo.append(c)
        for pid in below:
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"PMI_RANK={rank}".encode() in env or f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
                return pid
        time.sleep(0.2)
    return None


def _start_long_run(tmp_path, dna_file, **env):
    run_dir = tmp_path / "run"
    args = [MPIEXEC, "-n", "2", sys.executable, "-m", "bytemodel.cli", "train", "--source", str(dna_file),
            "--out", str(run_dir), "--steps", "100000", "--context", "32", "--batch-size", "4",
            "--eval-every", "100000", "--eval-tokens", "256", "--d-model", "32", "--n-layers", "2",
            "--n-heads", "2", "--d-ff", "64", "--workers", "1", "-q"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(**env))
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None and (not metrics.exists() or metrics.stat().st_size == 0):
        time.sleep(0.1)
    assert p.poll() is None and metrics.exists(), p.communicate()
    pid = _rank_pid(p.pid, 1)
    assert pid is not None, "rank 1 not found under mpiexec"
    return p, pid


@needs_mpi
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the rank through /proc")
def test_a_killed_rank_ends_the_job_with_an_error(tmp_path, dna_file):
    p, pid = _start_long_run(tmp_path, dna_file, **{distributed.TIMEOUT_ENV: "20"})
    t0 = time.time()
    os.kill(pid, signal.SIGKILL)
    try:
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0, (out, err)
    assert time.time() - t0 < 60


@needs_mpi
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the rank through /proc")
def test_a_hung_rank_times_out_the_collectives(tmp_path, dna_file):
    """A rank that stops answering (SIGSTOP: the launcher sees nothing wrong) must not hang the
    job: the other rank's collective times out and aborts it."""
    p, pid = _start_long_run(tmp_path, dna_file, **{distributed.TIMEOUT_ENV: "3"})
    t0 = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert p.returncode != 0, (out, err)
    assert "got no answer from the other ranks" in err, err
    assert "Traceback" not in err
    assert time.time() - t0 < 60


@needs_mpi
def test_a_user_error_under_mpiexec_is_one_line(tmp_path):
    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "bytemodel.cli", "train", "--source",
                        str(tmp_path / "missing.txt"), "--out", str(tmp_path / "run"), "-q"],
                       capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "missing.txt" in errors[0], r.stderr
    assert "Traceback" not in r.stderr
