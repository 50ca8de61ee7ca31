"""Chatting with a model fine-tuned on conversations (bytemodel finetune --chat).

`Chat` keeps the conversation (messages of bytes) and produces the assistant's next reply with a
KV cache, streaming it as it is sampled (on a GPU through the on-device decoder, the same ids in
fp32 as the host loop):
    - the prompt is the chat template of the conversation so far, then <assistant>; on the host
      loop the conversation's KV cache is kept between replies (decode/generate.KeptCache), so a
      reply reads only what follows the part of the prompt the cache already holds;
    - the reply ends at the first special id the model produces (<end>, normally), or after
      max_bytes;
    - the conversation is kept within the context window: the oldest turns (not a system
      message) are dropped until the prompt fits in 3/4 of the context, leaving room to reply; a
      single message longer than that keeps its last tokens. If a reply fills the window, the
      last half of it is re-read into a fresh cache (as `generate` does) and sampling goes on;
    - streamed output is cut at valid UTF-8 boundaries: an incremental decoder holds back an
      unfinished character, and bytes that are not UTF-8 show as U+FFFD (the reply itself, kept
      in the conversation, is the bytes as sampled).

`repl` is the `bytemodel chat` loop: one line of input is one user message; Ctrl-D ends the
session, Ctrl-C at the prompt too, Ctrl-C during a reply stops that reply (what was said so far
stays in the conversation). `/reset` starts a new conversation.
"""
from __future__ import annotations

import codecs
import os
import sys
from contextlib import closing

import numpy as np

from .chat_template import has_chat_tokens, prompt_ids
from .errors import ConfigError, named
from .decode.generate import KeptCache, _check_sampling, device_ids, on_device, plain_ids

MAX_LINE = 1 << 20   # bytes in one input line (a message longer than any context; an endless one is refused)

KEEP = 0.75  # the prompt may fill this much of the context; the rest is room for the reply


class Chat:
    def __init__(self, model, tokenizer, system: bytes | None = None, temperature: float = 0.8, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0, max_bytes: int = 1024):
        if not has_chat_tokens(tokenizer):
            raise ConfigError("this model has no chat tokens: fine-tune it on conversations first "
                              + named("(bytemodel finetune --from RUN --chat FILE.jsonl)",
                                    "(bytemodel.finetune(RUN, FILE.jsonl, examples=\"chat\"))"))
        _check_sampling(temperature, top_k, top_p)
        if max_bytes <= 0:
            raise ConfigError(f"max-bytes must be positive, got {max_bytes}")
        self.model, self.tok = model, tokenizer
        self.system = system
        self.sampling = (temperature, top_k, top_p)
        self.rng = np.random.default_rng(seed)
        self.max_bytes = max_bytes
        self.specials = {tokenizer.special_id(s) for s in tokenizer.specials}
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.kept = KeptCache()     # the host loop's cache of this conversation: a reply reads only its new turn

    def prompt(self) -> list[int]:
        """<doc> + the template of the conversation + <assistant>, within KEEP of the context."""
        limit = max(int(self.model.cfg.context * KEEP), 2)
        msgs = list(self.messages)
        head = 1 if msgs and msgs[0]["role"] == "system" else 0
        while True:
            ids = [self.tok.doc_id] + [int(i) for i in prompt_ids(msgs, self.tok)]
            if len(ids) <= limit or len(msgs) - head <= 1:
                break
            del msgs[head]  # the oldest turn after the system message
        if len(ids) > limit and head and len(msgs) > 1:  # the system message must give way too
            ids = [self.tok.doc_id] + [int(i) for i in prompt_ids(msgs[1:], self.tok)]
        return ids[-limit:]

    def reply(self, text: bytes, on_bytes=None) -> bytes:
        """Add a user message, sample the assistant's reply (streamed to on_bytes) and keep it."""
        self.messages.append({"role": "user", "content": bytes(text)})
        out = bytearray()
        try:
            self._sample(self.prompt(), out, on_bytes)
        finally:  # also on Ctrl-C: what was said stays said
            self.messages.append({"role": "assistant", "content": bytes(out)})
        return bytes(out)

    def _sample(self, history: list[int], out: bytearray, on_bytes) -> None:
        """Sample after `history` (generation's KV-cache loop and window rule) into out: on a GPU
        whose decoder takes the model, on the device (the same ids in fp32, the rng left where
        the host loop leaves it), else the host loop."""
        if len(out) >= self.max_bytes:
            return
        V = self.tok.vocab_size
        dec = on_device(self.model, V)
        if dec is not None:
            ids = device_ids(dec, self.model, history, self.rng, *self.sampling, vocab=V)
        else:
            ids = plain_ids(self.model, history, self.rng, *self.sampling, vocab=V, kept=self.kept)
        with closing(ids):    # also on Ctrl-C: the rng is left after the draws made
            for nxt in ids:
                if nxt in self.specials:
                    break
                chunk = self.tok.vocab[nxt][: self.max_bytes - len(out)]
                out += chunk
                if on_bytes is not None:
                    on_bytes(chunk)
                if len(out) >= self.max_bytes:
                    break


class Utf8Stream:
    """Writes bytes to a binary stream only at UTF-8 character boundaries (invalid bytes -> U+FFFD)."""

    def __init__(self, stream):
        self.stream = stream
        self.dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, data: bytes) -> None:
        text = self.dec.decode(data)
        if text:
            self.stream.write(text.encode("utf-8"))
            self.stream.flush()

    def end(self) -> None:
        text = self.dec.decode(b"", final=True)
        self.dec.reset()
        self.stream.write(text.encode("utf-8") + b"\n")
        self.stream.flush()


def repl(chat: Chat, stdin=None, stdout=None, stderr=None, banner: str = "") -> int:
    """Read user lines, stream replies. Returns the exit status (0 on Ctrl-D / Ctrl-C)."""
    if stdin is None and sys.stdin is None:
        raise ConfigError("stdin is closed: chat reads your lines from it")
    if stdout is None and sys.stdout is None:
        raise ConfigError("stdout is closed: chat writes its replies to it")
    stdin = stdin or sys.stdin.buffer
    stdout = stdout or sys.stdout.buffer
    stderr = stderr or sys.stderr or open(os.devnull, "w")
    interactive = hasattr(stdin, "isatty") and stdin.isatty()
    out = Utf8Stream(stdout)
    try:
        if banner:
            stderr.write(banner + "\n")
            stderr.flush()
        while True:
            if interactive:
                stderr.write("> ")
                stderr.flush()
            line = stdin.readline(MAX_LINE + 1)      # bounded: an endless line is not read whole
            if len(line) > MAX_LINE:
                raise ConfigError(f"a line of more than {MAX_LINE:,} bytes; chat takes one message a line")
            if not line:           # Ctrl-D / end of the piped input
                if interactive:
                    stderr.write("\n")
                return 0
            text = line.rstrip(b"\r\n")
            if not text.strip():
                continue
            if text.strip() == b"/reset":
                chat.reset()
                stderr.write("(new conversation)\n")
                continue
            try:
                chat.reply(text, out.write)
            except KeyboardInterrupt:  # stop this reply, keep the session
                stderr.write("\n(reply interrupted)\n")
            out.end()
    except KeyboardInterrupt:          # at the prompt: the session ends
        stderr.write("\n")
        return 0
