"""The chat template (round trip, mask), the chat REPL (a scripted session through a pipe, Ctrl-C,
UTF-8 streaming, the context window) and the finetune / chat commands' errors."""
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from bytemodel.chat import Chat, Utf8Stream, repl
from bytemodel.chat_template import ROLES, chat_tokenizer, parse, prompt_ids, render
from bytemodel.cli import app
from bytemodel.errors import ConfigError, SourceError
from bytemodel.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
TOK = chat_tokenizer(Tokenizer())
BPE = chat_tokenizer(Tokenizer([(97, 98), (256, 99), (32, 32)]))   # "ab", "abc", "  "

messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": st.binary(max_size=40)}),
                    max_size=6)


@settings(max_examples=150, deadline=None)
@given(messages, st.sampled_from([TOK, BPE]))
def test_template_round_trip(msgs, tok):
    ids, mask = render(msgs, tok)
    assert parse(ids, tok) == msgs
    # the mask counts exactly the assistant turns' content and their <end>
    want = sum(len(tok.encode(m["content"])) + 1 for m in msgs if m["role"] == "assistant")
    assert int(mask.sum()) == want and len(mask) == len(ids)


def test_template_by_hand():
    u, a, e = TOK.special_id("<user>"), TOK.special_id("<assistant>"), TOK.special_id("<end>")
    assert (TOK.doc_id, u, a, e) == (256, 258, 259, 260) and TOK.vocab_size == 261
    ids, mask = render([{"role": "user", "content": b"hi"}, {"role": "assistant", "content": b"yo"}], TOK)
    assert ids.tolist() == [u, 104, 105, e, a, 121, 111, e]
    assert mask.tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    assert prompt_ids([{"role": "user", "content": b"hi"}], TOK).tolist() == [u, 104, 105, e, a]
    with pytest.raises(SourceError, match="inside an unfinished"):
        parse([u, 104, a], TOK)


def test_chat_specials_keep_their_ids_and_old_tokenizers_load():
    d = TOK.to_dict()
    assert Tokenizer.from_dict(d).specials == TOK.specials
    assert Tokenizer.from_dict({"type": "bytes", "merges": [], "specials": ["<doc>"]}).vocab_size == 257  # older checkpoints
    from bytemodel.errors import TokenizerError
    with pytest.raises(TokenizerError):
        Tokenizer.from_dict({**d, "specials": ["<doc>", "<user>"]})   # not a prefix: ids would move


def test_utf8_stream_cuts_at_character_boundaries():
    buf = io.BytesIO()
    s = Utf8Stream(buf)
    writes = []
    buf.write = lambda b: writes.append(b) or len(b)
    data = "héllo wörld €".encode()
    for i in range(len(data)):
        s.write(data[i:i + 1])
    s.write(b"\xff")                                   # not UTF-8: shows as U+FFFD
    s.end()
    for w in writes:
        w.decode("utf-8")                              # every piece written is whole characters
    assert b"".join(writes) == "héllo wörld €\ufffd\n".encode()


class _Stub:
    """A model whose next-token logits come from a fixed list, to test Chat without training."""

    def __init__(self, ids, context=16, vocab=261):
        from bytemodel.config import ModelConfig
        from bytemodel.ops import numpy_ops
        self.cfg = ModelConfig(vocab_size=vocab, d_model=8, n_layers=1, n_heads=2, d_ff=8, context=context)
        self.ops, self.ids, self.calls = numpy_ops, list(ids), []

    def weights(self):
        return None

    def new_cache(self, B, S):
        return None

    def forward_cached(self, idx, cache, pos, W=None):
        self.calls.append((idx.shape[1], pos))
        out = np.zeros((1, idx.shape[1], self.cfg.vocab_size))
        out[0, -1, self.ids.pop(0)] = 50.0
        return out


def test_chat_stops_at_end_and_keeps_the_window():
    e = TOK.special_id("<end>")
    m = _Stub([104, 105, e] + [120] * 40 + [e], context=16)
    c = Chat(m, TOK, system=b"sys", temperature=0, max_bytes=100)
    got = []
    assert c.reply(b"hello", got.append) == b"hi" and got == [b"h", b"i"]
    assert c.messages[-1] == {"role": "assistant", "content": b"hi"}
    assert c.reply(b"a much longer message than fits") == b"x" * 40   # a reply longer than the window
    assert all(n + pos <= 16 for n, pos in m.calls)   # never beyond the context
    c.messages.append({"role": "user", "content": b"q"})
    p = c.prompt()                                     # the old turns do not fit 3/4 of the window
    assert len(p) <= 12 and p[0] == TOK.doc_id
    assert parse(p[1:-1], TOK) == [{"role": "system", "content": b"sys"}, {"role": "user", "content": b"q"}]


class _KeptStub(_Stub):
    """_Stub with a cache object, so Chat's kept cache (decode.generate.KeptCache) is used."""

    def new_cache(self, B, S):
        return ["a cache"]


def test_a_reply_reads_only_its_new_turn():
    """The conversation's keys and values are kept between replies: the second reply's first read
    starts after what the first one read and fed (its prompt, then every reply id but the <end>
    that stopped it, which was sampled and never fed), and reads only the rest."""
    e = TOK.special_id("<end>")
    m = _KeptStub([104, 105, e, 111, 107, e], context=64)
    c = Chat(m, TOK, system=b"sys", temperature=0)
    c.messages.append({"role": "user", "content": b"hello"})
    p1 = c.prompt()
    c.messages.pop()
    assert c.reply(b"hello") == b"hi"
    assert m.calls == [(len(p1), 0), (1, len(p1)), (1, len(p1) + 1)]
    assert c.kept.ids == p1 + [104, 105]
    m.calls.clear()
    c.messages.append({"role": "user", "content": b"again"})
    p2 = c.prompt()
    c.messages.pop()
    assert p2[:len(p1) + 2] == p1 + [104, 105]
    assert c.reply(b"again") == b"ok"
    assert m.calls[0] == (len(p2) - len(p1) - 2, len(p1) + 2)
    c.reset()                        # a new conversation starts from an empty cache
    m.ids, m.calls = [120, e], []
    c.reply(b"new")
    assert m.calls[0][1] == 0


def test_the_kept_cache_holds_what_a_whole_read_gives():
    """A real model over three turns: after each reply the kept cache's rows are those a fresh
    read of the same ids writes (float32: the rows come from reads of other lengths, so the
    products round differently; 1e-4 of their scale), and the next reply reads from there."""
    from bytemodel.config import ModelConfig
    from bytemodel.model import Model
    from bytemodel.ops import numpy_ops
    cfg = ModelConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=2, n_heads=4, d_ff=64, context=128)
    m = Model(cfg, numpy_ops)
    m.init_weights(3)
    c = Chat(m, TOK, system=b"be brief", temperature=1.0, seed=2, max_bytes=12)
    starts, read = [], m.forward_cached

    def recording(idx, cache, pos, W=None, **kw):
        if idx.shape[1] > 1:
            starts.append(pos)       # a read (a fed id is one token)
        return read(idx, cache, pos, W, **kw)
    m.forward_cached = recording
    held = 0
    for turn in (b"one", b"two", b"three"):
        c.reply(turn)
        assert starts[-1] == held    # this reply's read began where the last reply's cache ended
        ids = c.kept.ids
        c.messages.append({"role": "user", "content": b"next"})
        nxt = c.prompt()
        c.messages.pop()
        assert nxt[:len(ids)] == ids and len(ids) > len(c.prompt()) // 2   # what the next reply reuses
        held = len(ids)
        fresh = m.new_cache(1, cfg.context)
        m.forward_cached(np.array([ids]), fresh, 0)
        for (k, v), (k2, v2) in zip(c.kept.cache, fresh):
            for a, b in ((k, k2), (v, v2)):
                a, b = a[:, :, :len(ids)], b[:, :, :len(ids)]
                assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max(), turn


def test_prompt_drops_oldest_turns_first_and_keeps_the_system_message():
    c = Chat(_Stub([], context=64), TOK, system=b"S", temperature=0)
    for i in range(6):
        c.messages += [{"role": "user", "content": b"q%d" % i}, {"role": "assistant", "content": b"a%d" % i}]
    c.messages.append({"role": "user", "content": b"last"})
    msgs = parse(c.prompt()[1:-1], TOK)
    assert msgs[0] == {"role": "system", "content": b"S"} and msgs[-1]["content"] == b"last"
    assert len(c.prompt()) <= 48 and {"role": "user", "content": b"q0"} not in msgs
    assert {"role": "assistant", "content": b"a5"} in msgs


def test_repl_reads_lines_until_end_of_input():
    e = TOK.special_id("<end>")
    m = _Stub([111, 107, e, 104, e])
    c = Chat(m, TOK, temperature=0)
    out = io.BytesIO()
    code = repl(c, io.BytesIO(b"first\n\n/reset\nsecond\n"), out, io.StringIO())
    assert code == 0 and out.getvalue() == b"ok\nh\n"
    assert [x["content"] for x in c.messages] == [b"second", b"h"]   # /reset forgot the first turn


def test_chat_needs_chat_tokens():
    with pytest.raises(ConfigError, match="no chat tokens"):
        Chat(_Stub([], vocab=257), Tokenizer())


# ------------------------------------------------------------------------------- through a pipe
@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    import bytemodel
    from bytemodel.training.finetune import finetune
    from conftest import FAST
    d = tmp_path_factory.mktemp("chat")
    (d / "src.txt").write_text("hello there. general kenobi. " * 40)
    bytemodel.train(d / "src.txt", d / "pre", steps=3, **{**FAST, "model": dict(FAST["model"])})
    with open(d / "chat.jsonl", "w") as f:
        for w in ["hello", "there", "kenobi", "general"]:
            f.write(json.dumps({"messages": [{"role": "user", "content": w},
                                             {"role": "assistant", "content": w.upper()}]}) + "\n")
    finetune(d / "pre", d / "chat.jsonl", d / "ft", examples="chat", steps=3, batch_size=2, eval_every=3,
             eval_tokens=256)
    return d / "ft"


def _cli(*args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "bytemodel.cli", *args], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_scripted_session_through_a_pipe(chat_run):
    """Two messages piped in: the replies are what the Python API gives for the same seed, each
    valid UTF-8 on its own line, and the end of input ends the session with status 0."""
    p = _cli("chat", str(chat_run), "--seed", "3", "--max-bytes", "30", "--system", "be brief")
    out, err = p.communicate(b"hello\nwho are you?\n", timeout=120)
    assert p.returncode == 0, err.decode()[-2000:]
    assert b"Traceback" not in err
    import bytemodel
    lm = bytemodel.load(chat_run)
    c = Chat(lm.model, lm.tokenizer, b"be brief", 0.8, 0, 1.0, 3, 30)
    want = b"".join(c.reply(t).decode("utf-8", "replace").encode() + b"\n" for t in (b"hello", b"who are you?"))
    assert out == want and out.count(b"\n") >= 2
    out.decode("utf-8")


def test_ctrl_c_at_the_prompt_ends_cleanly(chat_run):
    p = _cli("chat", str(chat_run))
    line = p.stderr.readline()                       # the banner: the model is loaded, input is next
    assert b"Ctrl-D" in line
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and b"Traceback" not in err, err.decode()[-2000:]


def test_cli_errors_are_one_line(chat_run, tmp_path):
    r = CliRunner()
    for args, msg in [(["finetune", "--pairs", "x.jsonl"], "--from RUN"),
                      (["finetune", "--from", str(chat_run), "--pairs", "a", "--chat", "b"], "exactly one of"),
                      (["finetune", "--from", str(tmp_path / "none"), "--pairs", "a"], "not found"),
                      (["chat", str(tmp_path / "none")], "not found")]:
        res = r.invoke(app, args)
        lines = [x for x in res.output.strip().splitlines() if x.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and msg in lines[0], res.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    res = r.invoke(app, ["finetune", "--from", str(chat_run), "--chat", str(bad), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "bad.jsonl:1" in res.output and "no assistant turn" in res.output
