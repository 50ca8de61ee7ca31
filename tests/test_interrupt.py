"""A real Ctrl-C (SIGINT) during `bytemodel train`: saves, exits 130, and the run resumes."""
import signal
import subprocess
import sys
import time

import numpy as np

from bytemodel import checkpoint as ck


def test_sigint_saves_and_resumes(tmp_path, dna_file):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "bytemodel.cli", "train", "--source", str(dna_file), "--out", str(run_dir),
            "--steps", "100000", "--context", "32", "--batch-size", "4", "--eval-every", "100000",
            "--eval-tokens", "256", "--d-model", "32", "--n-layers", "2", "--n-heads", "2", "--d-ff", "64", "-q"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and (not metrics.exists() or metrics.stat().st_size == 0):
        time.sleep(0.1)
    assert metrics.exists(), p.communicate()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (out, err)
    assert "Traceback" not in err
    assert "interrupted: saved step" in out
    saved = ck.load(run_dir)
    step = saved.train["step"]
    assert 0 < step < 100000
    # every recorded step up to the save is in the metrics file
    assert len(metrics.read_text().splitlines()) == step
    r = subprocess.run([sys.executable, "-m", "bytemodel.cli", "train", "--resume", "--out", str(run_dir),
                        "--steps", str(step + 2), "-q", "--no-baseline"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert ck.load(run_dir).train["step"] == step + 2
    assert not np.array_equal(ck.load(run_dir).params, saved.params)
