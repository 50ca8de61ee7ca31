"""The CPU step's second thread (decode/cpu_pair.py): the column parts of a product give the
bits of the whole product (np.array_equal: generation must draw the same bytes), every chunk runs
exactly once whoever takes it, an error in the helper reaches the caller, and the choice between
one thread and two follows the measured times."""
import threading
import time

import numpy as np
import pytest

from bytemodel.decode import cpu_step, generate as gen
from bytemodel.decode.cpu_pair import ALIGN, Faster, Pair, bounds
from bytemodel.tokenizer import Tokenizer
from tests.test_decode_cpu_step import CFGS, _model


@pytest.mark.parametrize("n, parts", [(257, 2), (300, 2), (1152, 2), (2048, 4), (96, 3), (16, 2), (5, 2)])
def test_bounds_cover_the_columns_in_aligned_parts(n, parts):
    b = bounds(n, parts)
    assert b[0] == 0 and b[-1] == n and all(lo < hi for lo, hi in zip(b, b[1:]))
    assert all(c % ALIGN == 0 for c in b[1:-1]) and len(b) - 1 <= parts
    assert len(b) - 1 == min(parts, -(-n // ALIGN))      # as many parts as ALIGN allows


@pytest.mark.parametrize("name", sorted(CFGS))
def test_the_step_on_two_threads_gives_the_one_thread_bits(name, monkeypatch):
    """Every product split (PAIR_MACS 0), at 2 and 3 parts: logits np.array_equal to the one-thread
    step's and to forward_cached's at every position, the caches equal."""
    monkeypatch.setattr(cpu_step, "PAIR_MACS", 0)
    m = _model(name)
    T, W = m.cfg.context, m.weights()
    ids = np.random.default_rng(3).integers(0, m.cfg.vocab_size, T)
    caches = [m.new_cache(1, T) for _ in range(4)]
    for c in caches:
        m.forward_cached(ids[None, :3], c, 0, W)
    pairs = [Pair(2), Pair(3)]
    one, two, three = (cpu_step.OneToken(m, c, W, p) for c, p in zip(caches[1:], [None] + pairs))
    try:
        assert len(two.ways[1][0][0][0].args[0]) == 2 and len(three.ways[1][0][0][0].args[0]) == 3  # qkv split
        for pos in range(3, T):
            want = m.forward_cached(ids[None, pos:pos + 1], caches[0], pos, W)[0, -1]
            a = one(int(ids[pos]), pos).copy()
            b = two._step(two.ways[1], int(ids[pos]), pos).copy()
            c = three._step(three.ways[1], int(ids[pos]), pos).copy()
            assert np.array_equal(a, want) and np.array_equal(b, want) and np.array_equal(c, want), pos
    finally:
        two.close(), three.close()
    for (k0, v0), *rest in zip(caches[0], *caches[1:]):
        assert all(np.array_equal(k0, k) and np.array_equal(v0, v) for k, v in rest)


def test_the_pair_is_for_small_not_tiny():
    """At the small preset the step's large products run in parts, at tiny none would (at most 98k
    multiply-adds: too short to share); small's column bounds."""
    from bytemodel.config import preset
    from bytemodel.ops.scorer import _cores
    assert cpu_step.pair_for(preset("small")) == (_cores() >= 2) and not cpu_step.pair_for(preset("tiny"))
    assert bounds(1152, 2) == [0, 576, 1152] and bounds(257, 2) == [0, 128, 257]


def test_every_chunk_runs_once_and_the_helper_takes_some():
    """Chunk 0 on the caller's thread; the others exactly once each, on either thread; a slow
    chunk 0 (sleep releases the GIL, as np.matmul does) leaves the last chunks to the helper."""
    pair = Pair(3)
    try:
        for slow in (0.0, 0.02):
            seen = []
            for run in range(20 if slow == 0 else 3):
                ran = []

                def chunk(i, run=run):
                    def f():
                        if i == 0 and slow:
                            time.sleep(slow)
                        ran.append((i, threading.get_ident()))
                    return f
                pair.run([chunk(i) for i in range(3)])
                assert sorted(i for i, _ in ran) == [0, 1, 2]
                assert dict(ran)[0] == threading.get_ident()
                seen += ran
            helper = {i for i, t in seen if t != threading.get_ident()}
            assert slow == 0 or helper and helper <= {1, 2}
    finally:
        pair.close()
    assert not pair.thread.is_alive()


def test_an_error_in_the_helper_reaches_the_caller():
    pair = Pair(2)

    def boom():
        raise ValueError("in the helper")
    try:
        with pytest.raises(ValueError, match="in the helper"):
            pair.run([lambda: time.sleep(0.05), boom])      # the helper takes chunk 1 while 0 sleeps
        pair.run([lambda: None, lambda: None])               # and the pair still runs
    finally:
        pair.close()


def test_faster_follows_the_times_and_probes_the_other_way():
    """One step each way first; then the faster by its recent median; the other way tried after
    PROBE steps, the gap doubling while the tries confirm the choice; a way that turns slow (the
    machine got busy) loses within a few tries."""
    f = Faster()
    assert f.pick() == 0
    f.took(0, 1.0)
    assert f.pick() == 1
    f.took(1, 0.5)
    picks = []
    for _ in range(200):
        w = f.pick()
        picks.append(w)
        f.took(w, 0.5 if w == 1 else 1.0)
    tries = [i for i, w in enumerate(picks) if w == 0]
    gaps = [b - a for a, b in zip(tries, tries[1:])]
    assert gaps[:3] == [16, 32, 64] and set(gaps[3:]) == {64}, gaps     # 8 first, then doubled to MAX_GAP
    for _ in range(Faster.MAX_GAP * Faster.KEEP):    # the pair turns slow: one thread wins
        w = f.pick()
        f.took(w, 2.0 if w == 1 else 1.0)
    assert f.best == 0
    assert f.steps[0] + f.steps[1] == f.n


def test_generate_draws_the_same_bytes_with_the_pair(monkeypatch):
    """generate on two threads (the pair forced on, every product split, one thread and two in
    turn every token) against one thread: the same bytes, 3 seeds, past a full cache and its
    re-read; the helper threads end with their generations."""
    def alternate(self):
        self.n += 1
        return self.n % 2
    m, tok = _model("gqa"), Tokenizer()
    n = 2 * m.cfg.context + 5
    monkeypatch.setattr(cpu_step, "PAIR_MACS", 0)
    monkeypatch.setattr(Faster, "pick", alternate)
    made, real = [], Pair.__init__

    def counted(self, *a):
        made.append(self)
        real(self, *a)
    monkeypatch.setattr(Pair, "__init__", counted)
    outs = {}
    monkeypatch.setattr(gen, "PAIR_STEP", True)          # off by default (generate.PAIR_STEP)
    for on in (True, False):
        monkeypatch.setattr(gen, "pair_for", lambda cfg, on=on: on)
        outs[on] = [gen.generate(m, tok, n, b"AB", seed=s) for s in (0, 1, 2)]
    assert outs[True] == outs[False] and len(set(outs[True])) == 3
    assert len(made) == 3 and not any(p.thread.is_alive() for p in made)
