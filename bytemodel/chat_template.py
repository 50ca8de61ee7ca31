"""The byte-level chat template: a conversation <-> token ids, and which ids the loss counts.

A conversation is a list of messages {"role": system | user | assistant, "content": bytes}. Each
message is its role's special id, the content's ids (the tokenizer's encoding of the bytes), and
the special <end>:

    <system> You are terse. <end> <user> hi <end> <assistant> hello <end> <user> ... <end>

Role markers and <end> are reserved ids after the merges (tokenizer.CHAT_SPECIALS), which no byte
string encodes to, so any content, binary included, round-trips exactly (parse(render(m)) == m).
In the corpus a conversation is one document (followed by <doc>, like every document).

The loss counts the assistant's content ids and the <end> that closes its turn (the model learns
when to stop); everything else is context. The chat REPL ends the prompt with <assistant> and
stops the reply at the first special id the model produces.

Shapes: ids (n,) int64; mask (n,) uint8, mask[i] = 1 when ids[i] is a counted target.
"""
from __future__ import annotations

import numpy as np

from .errors import SourceError
from .tokenizer import CHAT_SPECIALS, SPECIALS, Tokenizer

ROLES = ("system", "user", "assistant")
END = "<end>"
CHAT_TOKENS = SPECIALS + CHAT_SPECIALS  # what a chat tokenizer's specials must include


def role_token(role: str) -> str:
    return f"<{role}>"


def chat_tokenizer(tok: Tokenizer) -> Tokenizer:
    """The tokenizer with the chat specials appended (ids of the existing ones unchanged)."""
    return tok.with_specials(CHAT_TOKENS)


def has_chat_tokens(tok: Tokenizer) -> bool:
    return all(s in tok.specials for s in CHAT_TOKENS)


def render(messages: list[dict], tok: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Messages -> (ids, mask): the template's ids and 1 where the loss counts (assistant turns)."""
    ids, mask = [], []
    end = tok.special_id(END)
    for i, msg in enumerate(messages):
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES:
            raise SourceError(f"message {i + 1}: role must be one of {', '.join(ROLES)}, got {role!r}")
        if not isinstance(content, (bytes, bytearray)):
            raise SourceError(f"message {i + 1}: content must be bytes here, got {type(content).__name__}")
        body = [int(t) for t in tok.encode(bytes(content))]
        counted = 1 if role == "assistant" else 0
        ids += [tok.special_id(role_token(role))] + body + [end]
        mask += [0] + [counted] * len(body) + [counted]
    return np.array(ids, dtype=np.int64), np.array(mask, dtype=np.uint8)


def prompt_ids(messages: list[dict], tok: Tokenizer) -> np.ndarray:
    """The ids that ask for the next assistant turn: the conversation so far, then <assistant>."""
    ids, _ = render(messages, tok)
    return np.concatenate([ids, [tok.special_id("<assistant>")]]).astype(np.int64)


def parse(ids, tok: Tokenizer) -> list[dict]:
    """Ids -> messages (the inverse of render). A trailing turn without <end> is kept as it is."""
    by_id = {tok.special_id(role_token(r)): r for r in ROLES}
    end = tok.special_id(END)
    out, role, body = [], None, []
    for t in (int(i) for i in ids):
        if t in by_id:
            if role is not None:
                raise SourceError(f"a {by_id[t]} turn starts inside an unfinished {role} turn")
            role, body = by_id[t], []
        elif t == end:
            if role is None:
                raise SourceError("<end> outside a turn")
            out.append({"role": role, "content": tok.decode(body)})
            role = None
        elif tok.is_special(t):
            raise SourceError(f"unexpected special id {t} in a conversation")
        elif role is None:
            raise SourceError("content outside a turn")
        else:
            body.append(t)
    if role is not None:
        out.append({"role": role, "content": tok.decode(body)})
    return out
