"""Checkpoint writes beside the training (training/saver.py): in order, errors surfaced, and what a
slow write stores is the state at its step, not the weights the next steps made."""
from __future__ import annotations

import time

import numpy as np
import pytest

from bytemodel.training.saver import Saver


def test_writes_in_order_and_all_done_by_wait():
    done, s = [], Saver()
    for i in range(6):
        s.submit(lambda i: (time.sleep(0.01 * (i % 2)), done.append(i)), i)
    s.wait()
    assert done == list(range(6))
    s.close()


def test_a_failed_write_is_raised_and_the_later_ones_skipped():
    done, s = [], Saver()

    def fail():
        raise OSError(28, "No space left on device")
    s.submit(done.append, 1)
    s.submit(fail)
    s.submit(done.append, 3)
    with pytest.raises(OSError, match="No space"):
        s.wait()
    assert done == [1]
    s.submit(done.append, 4)      # the error was reported once; the saver goes on
    s.close()
    assert done == [1, 4]


def test_close_quiet_keeps_the_error_to_itself():
    s = Saver()
    s.submit(lambda: 1 / 0)
    s.close(quiet=True)


def test_a_slow_write_stores_its_own_step(tmp_path, dna_file, fast_settings, monkeypatch):
    """Every write sleeps first, so training runs on while it waits: the step-6 checkpoint a run
    of 12 steps wrote must still hold the weights and moments of a run stopped at step 6."""
    import bytemodel
    from bytemodel import checkpoint as ck
    real, seen = ck.save, {}

    def slow(path, cfg, tok, params, train=None, m=None, v=None):
        time.sleep(0.3)
        if m is not None:
            seen[train["step"]] = (params.copy(), m.copy())
        return real(path, cfg, tok, params, train, m, v)
    monkeypatch.setattr(ck, "save", slow)
    s = {**fast_settings, "workers": 1, "eval_every": 6, "dropout": 0.0}
    bytemodel.train(dna_file, tmp_path / "a", steps=12, **s)
    monkeypatch.setattr(ck, "save", real)
    stopped = ck.load(bytemodel.train(dna_file, tmp_path / "b", steps=12, stop_at=6, **s).checkpoint)
    assert stopped.train["step"] == 6 and 6 in seen
    assert np.array_equal(seen[6][0], stopped.params) and np.array_equal(seen[6][1], stopped.m)
