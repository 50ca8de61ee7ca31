"""A `kill` (SIGTERM) raised where the threads can take it (bytemodel/errors.py, its end).

The handler's exception used to land anywhere in the main thread, inside a ThreadPoolExecutor
starting a worker too; CI saw a killed training run never exit. Each test sends the signal to
the main thread itself (pthread_kill: a signal raised by a worker is delivered to that worker,
and the main thread would only see it once the worker was done anyway)."""
import signal
import threading
import time
import traceback

import numpy as np
import pytest

import bytemodel
from bytemodel.gradcheck import tiny_config
from bytemodel.errors import exit_on_signal
from bytemodel.model import Model
from bytemodel.ops import numpy_ops
from bytemodel.training.loop import Loop
from bytemodel.training.runner import CoreParallel

SIG = signal.SIGUSR1


@pytest.fixture
def exit_on_sig():
    old = signal.signal(SIG, exit_on_signal)
    yield
    signal.signal(SIG, old)


def kill_main():
    signal.pthread_kill(threading.main_thread().ident, SIG)


def test_a_kill_during_a_steps_slices_waits_for_the_workers(exit_on_sig):
    """The exit is raised once every slice's worker is done (not while one is still computing,
    as when the handler raised straight into the wait for the workers)."""
    cfg = tiny_config(context=16)
    m = Model(cfg, numpy_ops)
    m.init_weights(0)
    cp = CoreParallel(m, workers=2)
    done = []
    real = cp.replicas[1].loss_and_grad

    def slow(*a):
        kill_main()
        time.sleep(0.3)            # the main thread waits for this slice meanwhile
        out = real(*a)
        done.append(True)
        return out
    cp.replicas[1].loss_and_grad = slow
    x = np.random.default_rng(0).integers(0, cfg.vocab_size, (4, 16))
    with pytest.raises(SystemExit) as e:
        cp.loss_and_grad(x, x, 1.0 / x.size)
    assert done == [True]          # raised after the worker finished
    assert e.value.code == 128 + SIG
    cp.close()


def test_a_kill_in_the_training_loop_is_raised_before_the_next_step(tmp_path, dna_file, fast_settings, exit_on_sig,
                                                                   monkeypatch):
    """The loop is one held section: the exit comes from the poll before the next step, and no
    step after the signal is launched."""
    launched = []
    real = Loop.launch

    def launch(self, s):
        launched.append(s)
        if s == 3:
            kill_main()
        return real(self, s)
    monkeypatch.setattr(Loop, "launch", launch)
    with pytest.raises(SystemExit) as e:
        bytemodel.train(dna_file, tmp_path / "run", steps=50, **{**fast_settings, "workers": 2})
    assert e.value.code == 128 + SIG
    assert launched == [0, 1, 2, 3]
    where = traceback.extract_tb(e.value.__traceback__)[-1]
    assert where.name == "poll" and where.filename.endswith("errors.py"), where
    assert not (tmp_path / "run").exists()      # before the first checkpoint: the folder goes


def test_a_kill_while_compressing_is_raised_between_steps(exit_on_sig):
    """The compressor's lockstep loop on the CPU (lanes on a thread pool) is a held section too:
    a signal during step 3 is raised by the poll before step 4, the lanes' threads idle."""
    import bytemodel.compress.driver as bmz
    from bytemodel.compress.adapt import Fresh
    lm = Fresh("tiny")
    data = bytes(np.random.default_rng(0).integers(65, 69, 4000).astype(np.uint8))
    steps = []

    def progress(active):
        steps.append(active)
        if len(steps) == 3:
            kill_main()
    with pytest.raises(SystemExit) as e:
        bmz.compress(lm, data, streams=4, workers=2, progress=progress)
    assert e.value.code == 128 + SIG and len(steps) == 3
    where = traceback.extract_tb(e.value.__traceback__)[-1]
    assert where.name == "poll" and where.filename.endswith("errors.py"), where
