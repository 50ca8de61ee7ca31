"""Tokenizers: bytes <-> token ids.

The identity tokenizer maps each byte to its own id (0..255). Byte-pair merges (bytemodel.bpe) add
ids 256..256+M-1. After the merges come the reserved special ids; the first is the document
separator that the corpus puts between documents so the model can learn where one ends.

    vocab_size = 256 + len(merges) + len(SPECIALS)

Ids are uint16, so the vocabulary is at most 65,536.
"""
from __future__ import annotations

import numpy as np

from .errors import TokenizerError

SPECIALS = ("<doc>",)  # reserved ids after the merges; <doc> separates documents
MAX_VOCAB = 65536


class Tokenizer:
    """Bytes plus optional merges. With no merges it is the identity on bytes."""

    def __init__(self, merges: list[tuple[int, int]] | None = None, pre_split: str | None = None):
        self.merges = [tuple(int(a) for a in m) for m in (merges or [])]
        self.pre_split = pre_split  # regex pre-split the merges were learned with (None: none)
        self.n_merges = len(self.merges)
        self.vocab_size = 256 + self.n_merges + len(SPECIALS)
        if self.vocab_size > MAX_VOCAB:
            raise TokenizerError(f"vocabulary of {self.vocab_size} ids exceeds {MAX_VOCAB}")
        for i, (a, b) in enumerate(self.merges):
            if not (0 <= a < 256 + i and 0 <= b < 256 + i):
                raise TokenizerError(f"merge {i} refers to an id not yet defined: ({a}, {b})")
        # byte string of every id; specials decode to nothing
        vocab = [bytes([i]) for i in range(256)]
        for a, b in self.merges:
            vocab.append(vocab[a] + vocab[b])
        vocab += [b""] * len(SPECIALS)
        self.vocab = vocab
        self.token_lengths = np.array([len(v) for v in vocab], dtype=np.int64)  # bytes per id

    # ids of the specials
    @property
    def doc_id(self) -> int:
        return 256 + self.n_merges

    def is_special(self, i: int) -> bool:
        return i >= 256 + self.n_merges

    def encode(self, data: bytes) -> np.ndarray:
        """bytes -> uint16 ids (identity when there are no merges)."""
        if self.merges:
            from .bpe import encode
            return encode(self, bytes(data))
        return np.frombuffer(bytes(data), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids) -> bytes:
        """ids -> bytes; special ids decode to no bytes."""
        if self.merges:
            from .bpe import decode_ids
            return decode_ids(np.asarray(ids), self)
        vocab = self.vocab
        return b"".join(vocab[int(i)] for i in ids)

    def to_dict(self) -> dict:
        return {"type": "bytes+bpe" if self.merges else "bytes", "merges": [list(m) for m in self.merges],
                "specials": list(SPECIALS), "pre_split": self.pre_split}

    @classmethod
    def from_dict(cls, d: dict) -> "Tokenizer":
        try:
            merges = [(int(a), int(b)) for a, b in d.get("merges", [])]
            specials = list(d.get("specials", SPECIALS))
            pre_split = d.get("pre_split")
            if pre_split is not None and not isinstance(pre_split, str):
                raise ValueError(f"pre_split must be a name, got {pre_split!r}")
        except (TypeError, ValueError, AttributeError) as e:
            raise TokenizerError(f"corrupt tokenizer description: {e}") from None
        if specials != list(SPECIALS):
            raise TokenizerError(f"tokenizer has specials {specials}, this version knows {list(SPECIALS)}")
        return cls(merges, pre_split)
