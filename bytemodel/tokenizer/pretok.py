"""Pre-splitting: cutting bytes into pieces before merges are learned or applied.

Shared by training (tokenizer/train.py) and encoding (tokenizer/encode.py), so encoding never
imports the training module. A merge never crosses a piece boundary.
"""
from __future__ import annotations

import re

from ..errors import TokenizerError

# Our own text pre-split (bytes regex, ASCII classes; bytes >= 0x80 count as letters so UTF-8
# words stay whole): contractions, an optional space + letters, an optional space + up to 3
# digits, an optional space + other symbols, whitespace runs (the last space of a run before a
# word goes with the word). Every byte falls in some class, so the pieces concatenate back to
# the input exactly.
TEXT_PATTERN = (
    rb"'(?:[sdmt]|ll|ve|re)"
    rb"| ?[A-Za-z\x80-\xff]+"
    rb"| ?[0-9]{1,3}"
    rb"| ?[^\sA-Za-z0-9\x80-\xff]+"
    rb"|\s+(?!\S)"
    rb"|\s+"
)
PRE_SPLITS = {"text": re.compile(TEXT_PATTERN)}


def pre_split_pieces(data: bytes, pre_split: str | None) -> list[bytes]:
    """Split data into pieces with the named pattern; None -> [data]. Pieces join back to data."""
    if pre_split is None:
        return [data]
    try:
        pat = PRE_SPLITS[pre_split]
    except KeyError:
        raise TokenizerError(f"unknown pre-split {pre_split!r}; known: {', '.join(PRE_SPLITS)}") from None
    return pat.findall(data)
