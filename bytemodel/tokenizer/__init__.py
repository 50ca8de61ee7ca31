"""Tokenizers: bytes <-> token ids, with one front door: `Tokenizer`.

    tok = Tokenizer()                                   # identity on bytes (vocabulary 257)
    tok = Tokenizer.train(data, 500, pre_split="text")  # learn byte-pair merges
    ids = tok.encode(b"...")                            # uint16 ids
    tok.decode(ids)                                     # bytes (specials give none)
    tok.save("tok.json"); Tokenizer.load("tok.json")

The identity tokenizer maps each byte to its own id (0..255). Merge i turns the pair (a, b) into
id 256 + i. After the merges come the reserved special ids; the first is the document separator
that the corpus puts between documents so the model can learn where one ends (see vocab.py).

Parts, each importing only those above it:
    vocab.py   the id space (SPECIALS, MAX_VOCAB)
    seq.py     the linked-list token sequence shared by training and encoding
    pretok.py  the regex pre-splits (shared, so encoding never imports training)
    train.py   learning merges from any bytes
    encode.py  applying merges fast (whole inputs, bounded-memory streams, files), decoding

tok.json (UTF-8 JSON, one object; `Tokenizer.to_dict()`, also stored in every checkpoint):
    format         "bytemodel-tokenizer"
    version        1
    vocab_size     256 + M + number of specials (informative; checked on load)
    merges         [[a, b], ...]  M pairs of ids, in priority order
    specials       ["<doc>"]      reserved ids after the merges
    pre_split      null or "text" (the regex pre-split used in training, applied when encoding)
    merges_sha256  hex SHA-256 of the merges as little-endian uint16 a0 b0 a1 b1 ...
A file whose checksum, format or version does not match is refused with a TokenizerError.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ..atomic import write_atomic
from ..errors import TokenizerError
from ..validation import bytes_like
from .encode import FlatVocab, MergeTable, encode_bytes, encode_chunks, encode_file
from .pretok import PRE_SPLITS
from .train import DEFAULT_MAX_SAMPLE_BYTES, train_bpe
from .vocab import CHAT_SPECIALS, KNOWN_SPECIALS, MAX_VOCAB, SPECIALS

FORMAT = "bytemodel-tokenizer"
VERSION = 1

__all__ = ["Tokenizer", "SPECIALS", "CHAT_SPECIALS", "KNOWN_SPECIALS", "MAX_VOCAB", "FORMAT", "VERSION", "merges_sha256"]


def merges_sha256(merges: list[tuple[int, int]]) -> str:
    """Hex SHA-256 of the merges as little-endian uint16 pairs."""
    arr = np.asarray(merges, dtype="<u2").reshape(-1, 2)
    return hashlib.sha256(arr.tobytes()).hexdigest()


class Tokenizer:
    """Bytes plus optional merges. With no merges it is the identity on bytes."""

    def __init__(self, merges: list[tuple[int, int]] | None = None, pre_split: str | None = None,
                 specials: tuple[str, ...] = SPECIALS):
        self.merges = [tuple(int(a) for a in m) for m in (merges or [])]
        if pre_split is not None and pre_split not in PRE_SPLITS:
            raise TokenizerError(f"unknown pre-split {pre_split!r}; known: {', '.join(PRE_SPLITS)}")
        self.pre_split = pre_split  # regex pre-split the merges were learned with (None: none)
        self.n_merges = len(self.merges)
        self.specials = tuple(specials)   # always a prefix of KNOWN_SPECIALS: ids never move
        if not self.specials or self.specials != KNOWN_SPECIALS[:len(self.specials)]:
            raise TokenizerError(f"specials {list(self.specials)} are not a prefix of {list(KNOWN_SPECIALS)}")
        self.vocab_size = 256 + self.n_merges + len(self.specials)
        if self.vocab_size > MAX_VOCAB:
            raise TokenizerError(f"vocabulary of {self.vocab_size} ids exceeds {MAX_VOCAB}")
        for i, (a, b) in enumerate(self.merges):
            if not (0 <= a < 256 + i and 0 <= b < 256 + i):
                raise TokenizerError(f"merge {i} refers to an id not yet defined: ({a}, {b})")
        # byte string of every id; specials decode to nothing
        vocab = [bytes([i]) for i in range(256)]
        for a, b in self.merges:
            vocab.append(vocab[a] + vocab[b])
        vocab += [b""] * len(self.specials)
        self.vocab = vocab
        self.token_lengths = np.array([len(v) for v in vocab], dtype=np.int64)  # bytes per id
        self._table: MergeTable | None = None     # built at first use
        self._flat: FlatVocab | None = None

    @classmethod
    def train(cls, data, n_merges: int, *, pre_split: str | None = None,
              max_sample_bytes: int = DEFAULT_MAX_SAMPLE_BYTES, seed: int = 0) -> "Tokenizer":
        """Learn n_merges merges from bytes or an iterable of byte documents (see train.py)."""
        merges = train_bpe(data, n_merges, pre_split=pre_split, max_sample_bytes=max_sample_bytes, seed=seed)
        return cls(merges, pre_split)

    def with_specials(self, specials: tuple[str, ...]) -> "Tokenizer":
        """The same merges with (at least) these specials; ids of existing specials are kept."""
        keep = self.specials if len(self.specials) >= len(specials) else tuple(specials)
        return Tokenizer(self.merges, self.pre_split, keep)

    def special_id(self, name: str) -> int:
        """The id of a special by name ("<doc>", "<user>", ...); an error if this tokenizer lacks it."""
        if name not in self.specials:
            raise TokenizerError(f"this tokenizer has no {name} token (its specials: {', '.join(self.specials)})")
        return 256 + self.n_merges + self.specials.index(name)

    # ids of the specials
    @property
    def doc_id(self) -> int:
        return 256 + self.n_merges

    def is_special(self, i: int) -> bool:
        return i >= 256 + self.n_merges

    @property
    def kind(self) -> str:
        """'bytes' (identity) or 'bytes+bpe'."""
        return "bytes+bpe" if self.merges else "bytes"

    @property
    def table(self) -> MergeTable:
        """The merges' lookup structures, built once."""
        if self._table is None:
            self._table = MergeTable(self.merges)
        return self._table

    def encode(self, data: bytes) -> np.ndarray:
        """bytes -> uint16 ids (identity when there are no merges). data: bytes-like, or a str (its
        UTF-8 bytes); anything else is a ConfigError (an int n was n zero bytes)."""
        return encode_bytes(bytes_like(data, "encode"), self.table, self.pre_split)

    def encode_chunks(self, chunks, **kw):
        """A stream of byte chunks -> uint16 id arrays, in bounded memory (see encode.py)."""
        return encode_chunks(chunks, self.table, self.pre_split, **kw)

    def encode_file(self, src, dst, **kw) -> tuple[int, int]:
        """The raw bytes of src -> uint16 little-endian ids in dst; returns (bytes, ids)."""
        return encode_file(src, dst, self.table, self.pre_split, **kw)

    def decode(self, ids) -> bytes:
        """ids -> bytes; special ids decode to no bytes; an id past the vocabulary is an error."""
        if self._flat is None:
            self._flat = FlatVocab(self.vocab)
        return self._flat.decode(ids)

    # ------------------------------------------------------------------ tok.json
    def to_dict(self) -> dict:
        """The tok.json object (the checkpoint stores the same object)."""
        return {"format": FORMAT, "version": VERSION, "vocab_size": self.vocab_size,
                "merges": [list(m) for m in self.merges], "specials": list(self.specials),
                "pre_split": self.pre_split, "merges_sha256": merges_sha256(self.merges)}

    @classmethod
    def from_dict(cls, d: dict, where: str = "tokenizer") -> "Tokenizer":
        """Check a tok.json object and build the Tokenizer; TokenizerError if it is not valid."""
        if isinstance(d, dict) and "format" not in d and d.get("type") in ("bytes", "bytes+bpe"):
            d = _from_v0(d, where)    # checkpoints written before tok.json was the one format
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise TokenizerError(f"{where}: not a bytemodel tokenizer file (format is not {FORMAT!r})")
        if d.get("version") != VERSION:
            raise TokenizerError(f"{where}: tokenizer format version {d.get('version')!r}, this bytemodel reads {VERSION}")
        try:
            merges = [(int(a), int(b)) for a, b in d["merges"]]
        except (KeyError, TypeError, ValueError) as e:
            raise TokenizerError(f"{where}: corrupt merges list ({type(e).__name__})") from None
        if any(not (0 <= a < 65536 and 0 <= b < 65536) for a, b in merges):
            raise TokenizerError(f"{where}: merges hold ids outside 0..65535")
        if d.get("merges_sha256") != merges_sha256(merges):
            raise TokenizerError(f"{where}: merges checksum mismatch (the file is corrupt or was edited)")
        specials = d.get("specials", list(SPECIALS))
        if not isinstance(specials, list) or not specials or specials != list(KNOWN_SPECIALS[:len(specials)]):
            raise TokenizerError(f"{where}: tokenizer has specials {specials}, this version knows {list(KNOWN_SPECIALS)}")
        pre_split = d.get("pre_split")
        if pre_split is not None and pre_split not in PRE_SPLITS:
            raise TokenizerError(f"{where}: unknown pre-split {pre_split!r}")
        tok = cls(merges, pre_split, tuple(specials))
        if "vocab_size" in d and d["vocab_size"] != tok.vocab_size:
            raise TokenizerError(f"{where}: vocab_size {d['vocab_size']} does not match {tok.vocab_size} from the merges")
        return tok

    def save(self, path: str | os.PathLike) -> Path:
        """Write tok.json atomically (temporary file in the same folder, fsync, rename)."""
        text = json.dumps(self.to_dict(), separators=(",", ":")) + "\n"
        return write_atomic(path, text.encode("utf-8"), error=TokenizerError)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        """Read and check tok.json; TokenizerError on a missing, corrupt or edited file."""
        from ..fileguard import regular_file
        path = regular_file(path, "tokenizer", TokenizerError)   # not a FIFO or /dev/zero
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise TokenizerError(f"cannot read tokenizer {path}: {e.strerror}") from None
        from ..jsonguard import loads
        return cls.from_dict(loads(raw, f"{path} (the file is corrupt)", TokenizerError), str(path))


def _from_v0(d: dict, where: str) -> dict:
    """The description older checkpoints stored ({"type", "merges", "specials", "pre_split"},
    no checksum) as a tok.json object, so those checkpoints still load."""
    try:
        merges = [(int(a), int(b)) for a, b in d.get("merges", [])]
    except (TypeError, ValueError) as e:
        raise TokenizerError(f"{where}: corrupt merges list ({type(e).__name__})") from None
    return {"format": FORMAT, "version": VERSION, "merges": merges, "specials": d.get("specials", list(SPECIALS)),
            "pre_split": d.get("pre_split"), "merges_sha256": merges_sha256(merges)}
