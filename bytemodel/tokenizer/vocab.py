"""The id space every tokenizer shares: 256 byte ids, then the merges, then the specials.

    vocab_size = 256 + n_merges + len(SPECIALS)

Ids are uint16, so the vocabulary is at most 65,536 ids.
"""
from __future__ import annotations

SPECIALS = ("<doc>",)  # reserved ids after the merges; <doc> separates documents
MAX_VOCAB = 65536
