"""The id space every tokenizer shares: 256 byte ids, then the merges, then the specials.

    vocab_size = 256 + n_merges + number of specials (SPECIALS, or more of KNOWN_SPECIALS)

Ids are uint16, so the vocabulary is at most 65,536 ids.
"""
from __future__ import annotations

SPECIALS = ("<doc>",)  # reserved ids after the merges; <doc> separates documents
# the chat roles and the end of a turn (bytemodel.chat_template), appended after <doc> only when a
# run fine-tunes on conversations; a tokenizer's specials are always a prefix of KNOWN_SPECIALS,
# so an id means the same special in every run
CHAT_SPECIALS = ("<system>", "<user>", "<assistant>", "<end>")
KNOWN_SPECIALS = SPECIALS + CHAT_SPECIALS
MAX_VOCAB = 65536
