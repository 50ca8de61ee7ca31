"""decode.generate.device_ids, the driver of the on-device decoder for one sequence (chat on a GPU),
against plain_ids (the host loop) on the CPU, through a decoder written to the GPU Decoder's
contract in NumPy (ops/cuda_decode.py: begin loads the last logits and the position and sets t to 0;
step(n) samples n ids into out[:, t..] from the sampler's PCG64 stream, each fed through the model;
sample_only samples into out[:, t] without feeding; tokens(t0, t1) reads them). What this holds:
device_ids' chunks, its restart when the cache is full (the window rule) and the generator it leaves
behind when its caller stops, so that a conversation's later replies draw what the host loop's do.
The real decoder keeps that contract where tests/test_decode_gpu.py runs (fp32: the CPU's bytes past
the context)."""
import numpy as np
import pytest

from bytemodel.chat import Chat
from bytemodel.chat_template import chat_tokenizer
from bytemodel.config import ModelConfig
from bytemodel.decode.generate import device_ids, generate, plain_ids
from bytemodel.model import Model
from bytemodel.ops import numpy_ops
from bytemodel.sampling import rng_states, rng_words, sample_next
from bytemodel.tokenizer import Tokenizer


def _generator(w) -> np.random.Generator:
    g = np.random.Generator(np.random.PCG64())
    g.bit_generator.state = {"bit_generator": "PCG64", "has_uint32": 0, "uinteger": 0,
                             "state": {"state": (int(w[0]) << 64) | int(w[1]), "inc": (int(w[2]) << 64) | int(w[3])}}
    return g


class _Decoder:
    def __init__(self, model, B, vocab, seed, temperature, top_k, top_p, allowed=None, streams=None):
        self.model, self.B, self.V, self.sampling = model, B, vocab, (temperature, top_k, top_p)
        self.cache = model.new_cache(B, model.cfg.context)
        words = rng_states(seed, B) if streams is None else np.asarray(streams, dtype=np.uint64).reshape(B, 4)
        self.rngs = [_generator(w) for w in words]
        self.bias = 0.0 if allowed is None else np.where(allowed, 0.0, -np.inf)
        self.out = np.zeros((B, model.cfg.context + 1), dtype=np.int64)

    def run_prefill(self, fn):
        return fn()

    def begin(self, logits_row, pos, W=None):
        lg = np.asarray(logits_row)
        self.logits = np.broadcast_to(lg, (self.B, lg.shape[-1]))[:, :self.V]
        self.pos, self.t, self.W = pos, 0, W

    def _draw(self):
        return [sample_next(self.logits[i].astype(np.float64) + self.bias, self.rngs[i], *self.sampling)
                for i in range(self.B)]

    def step(self, n=1):
        for _ in range(n):
            nxt = self._draw()
            self.out[:, self.t] = nxt
            self.t += 1
            lg = self.model.forward_cached(np.array(nxt)[:, None], self.cache, self.pos, self.W)
            self.logits, self.pos = lg[:, -1, :self.V], self.pos + 1

    def sample_only(self):
        self.out[:, self.t] = self._draw()

    def tokens(self, t0, t1):
        return self.out[:, t0:t1].copy()


class _Module:
    Decoder = _Decoder

    @staticmethod
    def supports(cfg, vocab):
        return None


def _model(vocab, context=40, seed=3):
    cfg = ModelConfig(vocab_size=vocab, d_model=32, n_layers=1, n_heads=2, d_ff=48, context=context)
    m = Model(cfg, numpy_ops)
    m.init_weights(seed)
    m.load_flat(m.ops.to_numpy(m.params) * 3)
    return m


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.7, top_k=9, top_p=0.8), dict(temperature=0)])
@pytest.mark.parametrize("stop", [1, 5, 8, 30, 77, 130])
def test_device_ids_draws_the_host_loops_ids_and_leaves_its_generator(kw, stop):
    """The first `stop` ids (past the context of 40 at 77 and 130: restarts) are plain_ids', and the
    generator is left where plain_ids leaves it after as many draws, whatever the chunk the
    decoder had sampled ahead (stops inside a chunk, on its edge, and at the first id)."""
    m = _model(257)
    hist = [256] + list(b"ACGTTGCA")
    a, b = np.random.default_rng(11), np.random.default_rng(11)
    want, got = [], []
    for src, out, rng in ((plain_ids(m, hist, a, **kw), want, a), (device_ids(_Module, m, hist, b, **kw), got, b)):
        for nxt in src:
            out.append(nxt)
            if len(out) == stop:
                break
        src.close()
    assert got == want
    assert b.bit_generator.state == a.bit_generator.state
    assert a.random() == b.random()


def test_device_ids_takes_the_mask():
    m = _model(257)
    allowed = np.zeros(257, dtype=bool)
    allowed[list(b"ACGT")] = True
    bias = np.where(allowed, 0.0, -np.inf)
    a, b = np.random.default_rng(2), np.random.default_rng(2)
    want = [x for x, _ in zip(plain_ids(m, [256], a, bias=bias), range(60))]
    got = [x for x, _ in zip(device_ids(_Module, m, [256], b, allowed=allowed), range(60))]
    assert got == want and set(got) <= set(b"ACGT")


def test_rng_words_round_trip():
    g = np.random.default_rng(5)
    g.random(3)
    h = _generator(rng_words(g))
    assert h.random() == g.random()
    with pytest.raises(ValueError):
        rng_words(np.random.Generator(np.random.MT19937(1)))


def test_chat_through_the_device_driver_is_the_host_loops(monkeypatch):
    """A conversation of four turns with replies of random lengths (ended by a special id or
    max_bytes, past the context): through device_ids (the decoder above standing in for the GPU's)
    the replies and the generator after each are the host loop's."""
    import bytemodel.ops as ops_mod
    tok = chat_tokenizer(Tokenizer())
    m = _model(tok.vocab_size, context=48, seed=7)
    turns = (b"hello", b"and then?", b"more", b"x" * 30)
    for kw in (dict(temperature=0.9, seed=3), dict(temperature=0.7, top_k=20, top_p=0.9, seed=4)):
        a = Chat(m, tok, b"sys " * 6, max_bytes=70, **kw)
        want = []
        for t in turns:
            want.append((a.reply(t), a.rng.bit_generator.state))
        monkeypatch.setattr(ops_mod, "device_decoder", lambda ops: _Module)
        b = Chat(m, tok, b"sys " * 6, max_bytes=70, **kw)
        got = []
        for t in turns:
            got.append((b.reply(t), b.rng.bit_generator.state))
        monkeypatch.undo()
        assert got == want, kw
        assert len({len(r) for r, _ in want}) > 1


@pytest.mark.parametrize("samples", [1, 3])
def test_generate_through_the_device_driver_is_the_host_loops(samples, monkeypatch):
    """generate's driver of the on-device decoder (_generate_device: chunks, the restart when the
    cache is full, a shared prompt's cache copied to every sample, the byte mask) through the decoder
    above gives the host paths' bytes, past the context of 40."""
    import bytemodel.ops as ops_mod
    m, tok = _model(257), Tokenizer()
    allowed = np.zeros(257, dtype=bool)
    allowed[list(b"ACGT\n")] = True
    allowed[tok.doc_id] = True
    for kw in (dict(seed=3), dict(seed=4, top_k=8, top_p=0.9, temperature=0.8), dict(seed=5, allowed=allowed)):
        want = generate(m, tok, 130, b"AC", samples=samples, **kw)
        monkeypatch.setattr(ops_mod, "device_decoder", lambda ops: _Module)
        got = generate(m, tok, 130, b"AC", samples=samples, **kw)
        monkeypatch.undo()
        assert got == want, kw
