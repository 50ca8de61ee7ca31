"""Examples for fine-tuning: prompt -> completion pairs and chat conversations, with a loss mask.

Input files are JSON Lines, one example per line:
    pairs  {"prompt": P, "completion": C}
    chat   {"messages": [{"role": "system" | "user" | "assistant", "content": X}, ...]}
where each text is a JSON string (stored as UTF-8) or {"b64": "..."} for any bytes.

An example becomes token ids and a 0/1 mask saying which targets the loss counts:
    pair   enc(P) enc(C) <doc>           counted: C's ids and the <doc> after them (where it ends)
    chat   the chat template (chat_template.render), counted: assistant turns and their <end>
P and C are encoded separately, so a byte-pair merge never spans the boundary.

The run's stream (tokens.u16, as a plain corpus) is <doc> ex_1 <doc> ex_2 <doc> ... with the
training examples first and the held-out ones after `split`; beside it mask.u8 (1 byte per token:
is this token a counted target) and spans.i64 ((n, 2): each example's preceding <doc> and its last
token). Training windows start at an example's <doc> (so a completion always sees its prompt; in an
example longer than the context, also every context/2 tokens) and never reach past the training
examples; the rest of a window is padding that counts for nothing. The sampler is a pure function
of (seed, step), as for plain corpora; ExampleCorpus answers the corpus protocol (corpus.py:
sample, score, verify) as a plain corpus does.

Shapes: tokens (n,) uint16, mask (n,) uint8, spans (E, 2) int64; batches x, y, m (B, T).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .atomic import write_atomic
from .errors import SourceError, named
from .jsonguard import loads as json_loads
from .tokenizer import Tokenizer

KINDS = ("pairs", "chat")
TOKENS_FILE = "tokens.u16"
MASK_FILE = "mask.u8"
SPANS_FILE = "spans.i64"
INFO_FILE = "examples.json"
LN2 = math.log(2)


# ---------------------------------------------------------------------------------------------
# reading JSON Lines

def _bytes_of(v, where: str) -> bytes:
    if isinstance(v, str):
        try:
            return v.encode("utf-8")
        except UnicodeEncodeError:    # "\ud800": a lone surrogate is no text
            raise SourceError(f"{where}: not valid Unicode text (a lone surrogate); give any bytes as "
                              f"{{\"b64\": ...}}") from None
    if isinstance(v, dict) and set(v) == {"b64"} and isinstance(v["b64"], str):
        try:
            return base64.b64decode(v["b64"], validate=True)
        except (binascii.Error, ValueError):
            raise SourceError(f"{where}: invalid base64") from None
    raise SourceError(f"{where}: expected a string or {{\"b64\": ...}}, got {json.dumps(v)[:60]}")


def read_examples(path, kind: str) -> list:
    """A JSONL file -> [(prompt, completion)] (pairs) or [[{"role", "content": bytes}]] (chat)."""
    if kind not in KINDS:
        raise SourceError(f"unknown example kind {kind!r}; choose one of {', '.join(KINDS)}")
    from .fileguard import regular_file
    p = regular_file(path, "examples file")      # a FIFO would block, a device never end
    try:
        lines = p.read_bytes().splitlines()
    except OSError as e:
        raise SourceError(f"cannot read {p}: {e.strerror}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p}:{n}"
        d = json_loads(line, where, SourceError)
        if not isinstance(d, dict):
            raise SourceError(f"{where}: each line must be a JSON object")
        if kind == "pairs":
            if set(d) != {"prompt", "completion"}:
                raise SourceError(f"{where}: a pair needs exactly the keys \"prompt\" and \"completion\""
                                  + (" (this line is a chat: use " + named('--chat', 'examples="chat"') + ")" if "messages" in d else ""))
            out.append((_bytes_of(d["prompt"], where + " prompt"), _bytes_of(d["completion"], where + " completion")))
        else:
            msgs = d.get("messages")
            if set(d) != {"messages"} or not isinstance(msgs, list) or not msgs:
                raise SourceError(f"{where}: a chat needs exactly the key \"messages\", a non-empty list"
                                  + (" (this line is a pair: use " + named('--pairs', 'examples="pairs"') + ")" if "prompt" in d else ""))
            conv = []
            for i, m in enumerate(msgs, 1):
                if not isinstance(m, dict) or set(m) != {"role", "content"}:
                    raise SourceError(f"{where}: message {i} needs exactly the keys \"role\" and \"content\"")
                from .chat_template import ROLES
                if m["role"] not in ROLES:
                    raise SourceError(f"{where}: message {i}: role must be one of {', '.join(ROLES)}, got {m['role']!r}")
                conv.append({"role": m["role"], "content": _bytes_of(m["content"], f"{where} message {i}")})
            if not any(m["role"] == "assistant" for m in conv):
                raise SourceError(f"{where}: the conversation has no assistant turn to learn from")
            out.append(conv)
    if not out:
        raise SourceError(f"{p} holds no examples")
    return out


def encode_example(example, kind: str, tok: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """One example -> (ids, mask), ending with the <doc> that closes it (see the module doc)."""
    if kind == "pairs":
        prompt, completion = example
        p, c = tok.encode(prompt).astype(np.int64), tok.encode(completion).astype(np.int64)
        ids = np.concatenate([p, c, [tok.doc_id]])
        mask = np.concatenate([np.zeros(len(p), np.uint8), np.ones(len(c) + 1, np.uint8)])
        return ids, mask
    from .chat_template import render
    ids, mask = render(example, tok)
    return np.concatenate([ids, [tok.doc_id]]), np.concatenate([mask, [0]]).astype(np.uint8)


def stream_of(encoded: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[(ids, mask)] -> (tokens, mask, spans) laid out as <doc> ex_1 <doc> ex_2 <doc> ..."""
    doc_first = [np.zeros(1, np.int64)]  # placeholder for the leading <doc>, filled by the caller
    toks, masks, spans = doc_first, [np.zeros(1, np.uint8)], []
    pos = 0  # index of the <doc> before the next example
    for ids, m in encoded:
        toks.append(ids)
        masks.append(m)
        spans.append((pos, pos + len(ids)))
        pos += len(ids)
    return np.concatenate(toks), np.concatenate(masks), np.array(spans, dtype=np.int64).reshape(-1, 2)


# ---------------------------------------------------------------------------------------------
# the corpus of examples in a run directory

@dataclass
class ExampleCorpus:
    tokens: np.ndarray   # (n,) uint16 memmap: <doc> ex <doc> ex ...
    mask: np.ndarray     # (n,) uint8 memmap: 1 where the token is a counted target
    spans: np.ndarray    # (E, 2) int64: [index of the <doc> before the example, index of its last token]
    n_train: int         # spans[:n_train] are training examples, the rest held out
    n_bytes: int         # bytes of all examples' content
    sha256: str          # of tokens, mask and spans, to check a resumed run reads the same data
    kind: str
    _anchors: dict = field(default_factory=dict, repr=False)  # context -> window starts

    @property
    def split(self) -> int:
        """Tokens before this index belong to training examples (and their closing <doc>)."""
        return int(self.spans[self.n_train - 1, 1]) + 1

    @property
    def n_docs(self) -> int:
        return len(self.spans)

    @property
    def train(self) -> np.ndarray:
        return self.tokens[:self.split]

    @property
    def val(self) -> np.ndarray:
        return self.tokens[self.split - 1:]

    def verify(self, vocab_size: int, where) -> None:
        """Hash tokens, mask and spans again (resume) and check they make sense; SourceError if not."""
        h = hashlib.sha256()
        h.update(np.ascontiguousarray(self.tokens, dtype="<u2").tobytes())
        h.update(np.ascontiguousarray(self.mask, dtype=np.uint8).tobytes())
        h.update(np.ascontiguousarray(self.spans, dtype="<i8").tobytes())
        if h.hexdigest() != self.sha256:
            raise SourceError(f"the examples in {where} are damaged or changed: they do not match the hash "
                              f"the checkpoint was trained on")
        s = self.spans
        n = len(self.tokens)
        if (len(s) < 2 or not 0 < self.n_train < len(s) or s[0, 0] != 0 or (s[:, 1] <= s[:, 0]).any()
                or (s[1:, 0] != s[:-1, 1]).any() or s[-1, 1] != n - 1):
            raise SourceError(f"the example spans in {where} are damaged")
        if int(np.asarray(self.tokens).max()) >= vocab_size or int(np.asarray(self.mask).max()) > 1:
            raise SourceError(f"the examples in {where} hold ids outside the vocabulary or a bad mask")

    def anchors(self, context: int) -> np.ndarray:
        """Window starts for training: every training example's <doc>, and in one longer than the
        context also every context/2 tokens, so each counted target has a window with at least
        context/2 tokens of the example before it."""
        if context in self._anchors:
            return self._anchors[context]
        out = []
        step = max(context // 2, 1)
        for s, e in self.spans[:self.n_train]:
            a = int(s)
            out.append(a)
            while a + context < e:
                a += step
                out.append(a)
        self._anchors[context] = np.array(out, dtype=np.int64)
        return self._anchors[context]

    def window(self, start: int, context: int, limit: int):
        """x, y, m (context,) from `start`, padded with <doc> / mask 0 past `limit` (exclusive)."""
        end = min(start + context + 1, limit)
        w = np.asarray(self.tokens[start:end]).astype(np.int64)
        m = np.asarray(self.mask[start + 1:end]).astype(np.uint8)
        pad = context + 1 - len(w)
        if pad > 0:
            w = np.concatenate([w, np.full(pad, int(self.tokens[0]), np.int64)])
            m = np.concatenate([m, np.zeros(pad, np.uint8)])
        return w[:-1], w[1:], m

    def sample(self, batch: int, context: int, seed: int, step: int):
        """x, y (B, T) int64 and mask (B, T) uint8, from random anchors. Pure in (seed, step)."""
        anchors = self.anchors(context)
        rng = np.random.default_rng([seed, step])
        picks = anchors[rng.integers(0, len(anchors), size=batch)]
        rows = [self.window(int(a), context, self.split) for a in picks]
        return tuple(np.stack(r) for r in zip(*rows))

    def score(self, nll, tokenizer: Tokenizer, context: int, max_tokens: int, batch: int = 16) -> tuple[float, float]:
        """Bits per byte of the held-out examples' counted targets (score_windows over
        eval_windows); its standard error is nan (no per-window spread is kept here)."""
        return (score_windows(nll, self.eval_windows(context, max_tokens), tokenizer, batch)["bits_per_byte"],
                float("nan"))

    def eval_windows(self, context: int, max_tokens: int):
        """Windows (start, x, y, m) over held-out examples, evenly spread up to ~max_tokens targets;
        every counted target of a chosen example is scored exactly once (long examples in windows
        that overlap by context/2, as `score` does)."""
        held = self.spans[self.n_train:]
        sizes = held[:, 1] - held[:, 0]
        keep = len(held)
        if max_tokens <= 0:           # 0: every held-out target, as the plain corpus's eval_windows
            max_tokens = int(sizes.sum())
        if sizes.sum() > max_tokens:  # evenly spread examples whose tokens fit the budget
            keep = max(1, int(len(held) * max_tokens / sizes.sum()))
        picks = np.linspace(0, len(held) - 1, keep).round().astype(int) if keep < len(held) else range(len(held))
        out, left = [], max(int(max_tokens), 1)   # one held-out example longer than the budget is cut to it
        for i in picks:
            a, e = int(held[i, 0]), int(held[i, 1])
            e = min(e, a + left)
            out += example_windows(self, a, e, context)
            left -= e - a
            if left <= 0:
                break
        return out


def example_windows(corpus, start: int, end: int, context: int) -> list:
    """Windows covering the targets start+1 .. end of one example, each scored once."""
    out, a, done = [], start, start  # targets at positions <= done are scored already
    while done < end:
        x, y, m = corpus.window(a, context, end + 1)
        pos = a + 1 + np.arange(context)              # the position of each target
        m = (m * ((pos > done) & (pos <= end))).astype(np.uint8)
        if m.any():  # a window of prompt only scores nothing
            out.append((x, y, m))
        done = min(a + context, end)
        a = max(done - context // 2, start)
    return out


def score_windows(nll, windows, tokenizer: Tokenizer, batch: int = 16) -> dict:
    """Sum the counted targets' losses over windows, `batch` windows a call; nll(x, y, m) -> each
    window's summed nats over its counted targets (host, float64; corpus.py's window scorer).

    Returns {'bits', 'bytes', 'tokens', 'bits_per_byte'}: bits over the counted targets, bytes
    those targets decode to (specials decode to none but their bits count)."""
    nats, n_bytes, n_tok = 0.0, 0, 0
    for i in range(0, len(windows), batch):
        group = windows[i:i + batch]
        L = max(int(np.nonzero(m)[0].max()) + 1 if m.any() else 1 for _, _, m in group)
        x = np.stack([w[0][:L] for w in group])
        y = np.stack([w[1][:L] for w in group])
        m = np.stack([w[2][:L] for w in group]).astype(bool)
        nats += float(np.asarray(nll(x, y, m.astype(np.uint8)), dtype=np.float64).sum())
        n_tok += int(m.sum())
        n_bytes += int(tokenizer.token_lengths[y[m]].sum())
    bits = nats / LN2
    return {"bits": bits, "bytes": n_bytes, "tokens": n_tok, "bits_per_byte": bits / max(n_bytes, 1)}


def build_examples(run_dir, tok: Tokenizer, kind: str, train_examples: list, val_examples: list) -> ExampleCorpus:
    """Encode examples into the run directory (tokens.u16, mask.u8, spans.i64, examples.json)."""
    if not train_examples or not val_examples:
        raise SourceError("need at least one training and one held-out example")
    enc = [encode_example(e, kind, tok) for e in list(train_examples) + list(val_examples)]
    tokens, mask, spans = stream_of(enc)
    tokens[0] = tok.doc_id
    if tokens.max() >= 65536:
        raise SourceError("token id beyond uint16")
    n_bytes = (sum(len(p) + len(c) for p, c in list(train_examples) + list(val_examples)) if kind == "pairs"
               else sum(len(m["content"]) for conv in list(train_examples) + list(val_examples) for m in conv))
    if n_bytes == 0:
        raise SourceError("the examples hold no bytes at all (every prompt and completion is empty)")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    blobs = {TOKENS_FILE: tokens.astype("<u2").tobytes(), MASK_FILE: mask.astype(np.uint8).tobytes(),
             SPANS_FILE: spans.astype("<i8").tobytes()}
    h = hashlib.sha256()
    for name in (TOKENS_FILE, MASK_FILE, SPANS_FILE):
        h.update(blobs[name])
        write_atomic(run_dir / name, blobs[name])
    info = dict(kind=kind, n_tokens=len(tokens), n_examples=len(spans), n_train=len(train_examples),
                n_bytes=n_bytes, sha256=h.hexdigest())
    write_atomic(run_dir / INFO_FILE, json.dumps(info).encode())
    return open_examples(run_dir)


def open_examples(run_dir) -> ExampleCorpus:
    run_dir = Path(run_dir)
    try:
        info = json_loads((run_dir / INFO_FILE).read_bytes(), f"{INFO_FILE} in {run_dir}", SourceError)
        if not isinstance(info, dict):
            raise SourceError(f"{INFO_FILE} in {run_dir} is damaged: not a JSON object")
        tokens = np.memmap(run_dir / TOKENS_FILE, dtype="<u2", mode="r")
        mask = np.memmap(run_dir / MASK_FILE, dtype=np.uint8, mode="r")
        spans = np.fromfile(run_dir / SPANS_FILE, dtype="<i8").reshape(-1, 2)
    except (OSError, ValueError, AttributeError) as e:
        raise SourceError(f"cannot open the examples in {run_dir}: {e}") from None
    for k in ("n_tokens", "n_examples", "n_train", "n_bytes"):
        if isinstance(info.get(k), bool) or not isinstance(info.get(k), int) or info[k] < 0:
            raise SourceError(f"{INFO_FILE} in {run_dir} is damaged: {k} is {info.get(k)!r}")
    if info.get("kind") not in KINDS or not isinstance(info.get("sha256"), str) or info["n_bytes"] == 0:
        raise SourceError(f"{INFO_FILE} in {run_dir} is damaged")
    if len(tokens) != info["n_tokens"] or len(mask) != len(tokens) or len(spans) != info["n_examples"]:
        raise SourceError(f"the examples in {run_dir} are damaged")
    return ExampleCorpus(tokens, mask, spans, int(info["n_train"]), int(info["n_bytes"]), info["sha256"],
                         info["kind"])


def split_examples(examples: list, val_fraction: float, seed: int) -> tuple[list, list]:
    """Hold out a seeded random val_fraction of the examples (at least one, at most all but one)."""
    n = len(examples)
    if n < 2:
        raise SourceError(f"{n} example(s): need at least 2 to hold one out (or give {named('--val FILE', 'val_source=FILE')})")
    k = min(max(1, int(round(n * val_fraction))), n - 1)
    held = set(np.random.default_rng([seed, 7]).permutation(n)[:k].tolist())
    return [e for i, e in enumerate(examples) if i not in held], [e for i, e in enumerate(examples) if i in held]


def score_examples(model, tok: Tokenizer, examples: list, kind: str, batch: int = 16) -> dict:
    """Bits per byte of the counted targets (completions / assistant turns) of examples, under a
    Model. Each example is scored from its <doc>, long ones in overlapping windows."""
    enc = [encode_example(e, kind, tok) for e in examples]
    tokens, mask, spans = stream_of(enc)
    tokens[0] = tok.doc_id
    c = ExampleCorpus(tokens, mask, spans, 0, 0, "", kind)
    T = model.cfg.context
    wins = [w for s, e in spans for w in example_windows(c, int(s), int(e), T)]
    ops = model.ops

    def nll(x, y, m):      # the model's per-token losses, summed over each window's counted targets
        out = ops.to_numpy(model.forward(ops.asarray(x), ops.asarray(y))).astype(np.float64).reshape(x.shape)
        model._acts = None
        return (out * m).sum(axis=1)
    return score_windows(nll, wins, tok, batch)
