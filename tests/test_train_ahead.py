"""The training loop has one path for every backend: it queues step s before reading step s-1's
loss and norm (ops.fetch_async), and clips/skips inside ops.adamw_step. On the CPU it must end
with exactly the weights of a plain loop written out here from the same parts (batches, forward
and backward, global norm, clip, AdamW), and saves must hold settled steps."""
import numpy as np

import bytemodel
from bytemodel import checkpoint as ck
from bytemodel.config import preset
from bytemodel.corpus import open_corpus, sample_batch
from bytemodel.model import Model
from bytemodel.ops import numpy_ops
from bytemodel.training.optim import AdamW, lr_at


def plain_loop(run_dir, tc, steps):
    """A straight loop with no run-ahead: read each step's norm on the host, clip, step."""
    corpus = open_corpus(run_dir)
    cfg = preset(tc["preset"], 257, **{**tc["model"], "context": tc["context"]})
    model = Model(cfg, numpy_ops)
    model.init_weights(tc.get("seed", 0))
    opt = AdamW(model, betas=(0.9, 0.95), weight_decay=0.1)
    for s in range(steps):
        x, y = sample_batch(corpus.train, tc["batch_size"], cfg.context, tc.get("seed", 0), s)
        model.grads[...] = 0
        model.loss_and_grad(x, y, 1.0 / x.size)   # the mean
        g = model.grads.astype(np.float64)
        norm = float(np.sqrt(g @ g))
        c = min(1.0, 1.0 / (norm + 1e-6))      # clip at the default grad_clip 1.0
        opt.t += 1
        lr = lr_at(s, 2e-3, tc["warmup"], steps)
        numpy_ops.adamw_step(model.params, model.grads, opt.m, opt.v, opt.mask, lr, 0.9, 0.95, 1e-8,
                             0.1, opt.t, grad_scale=c)
    return model.params, opt.m


def test_the_loop_matches_a_plain_loop(tmp_path, dna_file, fast_settings, monkeypatch):
    settings = {**fast_settings, "workers": 1, "eval_every": 4}
    fetched = []
    real_fetch = numpy_ops.fetch_async

    def counting_fetch(*arrays):
        fetched.append(len(arrays))
        return real_fetch(*arrays)
    monkeypatch.setattr(numpy_ops, "fetch_async", counting_fetch)
    r = bytemodel.train(dna_file, tmp_path / "run", steps=10, **settings)
    assert fetched == [2] * 10                               # every step read through fetch_async
    params, m = plain_loop(tmp_path / "run", settings, 10)
    got = ck.load(r.checkpoint)
    assert np.array_equal(got.params, params) and np.array_equal(got.m, m)
    assert [h["step"] for h in r.history] == list(range(1, 11))             # every step recorded, in order
    # a stop between validations settles the queued step first and saves exactly that state
    stopped = bytemodel.train(dna_file, tmp_path / "stopped", steps=10, stop_at=6, **settings)
    assert stopped.step == 6 and ck.load(stopped.checkpoint).train["step"] == 6
    assert [h["loss"] for h in stopped.history] == [h["loss"] for h in r.history[:6]]
    resumed = bytemodel.train(None, tmp_path / "stopped", resume=True)
    assert np.array_equal(ck.load(resumed.checkpoint).params, got.params)
