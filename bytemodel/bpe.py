"""Byte-level BPE: the public functions, and the tokenizer file (tok.json).

Training lives in bpe_train.py, encoding/decoding in bpe_encode.py, the shared linked-list engine
in bpe_seq.py. Merge i turns the pair (a, b) into id 256 + i (see bytemodel.tokenizer).

tok.json (UTF-8 JSON, one object):
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

from .bpe_encode import MergeTable, apply_merges, decode_ids, encode_bytes, encode_chunks, encode_file
from .bpe_train import DEFAULT_MAX_SAMPLE_BYTES, PRE_SPLITS, TEXT_PATTERN, sample_segments, train_bpe
from .atomic import write_atomic
from .errors import TokenizerError
from .tokenizer import SPECIALS, Tokenizer

FORMAT = "bytemodel-tokenizer"
VERSION = 1


def merges_sha256(merges: list[tuple[int, int]]) -> str:
    """Hex SHA-256 of the merges as little-endian uint16 pairs."""
    arr = np.asarray(merges, dtype="<u2").reshape(-1, 2)
    return hashlib.sha256(arr.tobytes()).hexdigest()


def tokenizer_to_json(tok: Tokenizer, pre_split: str | None = None) -> dict:
    """The tok.json object of a tokenizer (pre_split defaults to tok.pre_split if set)."""
    if pre_split is None:
        pre_split = getattr(tok, "pre_split", None)
    merges = [list(m) for m in tok.merges]
    return {"format": FORMAT, "version": VERSION, "vocab_size": tok.vocab_size, "merges": merges,
            "specials": list(SPECIALS), "pre_split": pre_split, "merges_sha256": merges_sha256(tok.merges)}


def tokenizer_from_json(d: dict, where: str = "tokenizer") -> Tokenizer:
    """Check a tok.json object and build the Tokenizer (with .pre_split set)."""
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
    pre_split = d.get("pre_split")
    if pre_split is not None and pre_split not in PRE_SPLITS:
        raise TokenizerError(f"{where}: unknown pre-split {pre_split!r}")
    tok = Tokenizer.from_dict({"merges": merges, "specials": d.get("specials", list(SPECIALS))})
    if "vocab_size" in d and d["vocab_size"] != tok.vocab_size:
        raise TokenizerError(f"{where}: vocab_size {d['vocab_size']} does not match {tok.vocab_size} from the merges")
    tok.pre_split = pre_split
    return tok


def save_tokenizer(tok: Tokenizer, path: str | os.PathLike, pre_split: str | None = None) -> None:
    """Write tok.json atomically (temporary file in the same folder, fsync, rename)."""
    path = Path(path)
    text = json.dumps(tokenizer_to_json(tok, pre_split), separators=(",", ":")) + "\n"
    try:
        write_atomic(path, text.encode("utf-8"))
    except OSError as e:
        raise TokenizerError(f"cannot write {path}: {e.strerror or e}") from None


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Read and check tok.json; raises TokenizerError on a missing, corrupt or edited file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TokenizerError(f"cannot read tokenizer {path}: {e.strerror}") from None
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path}: not valid JSON ({e.__class__.__name__}); the file is corrupt") from None
    return tokenizer_from_json(d, str(path))


def encode(tok: Tokenizer, data: bytes) -> np.ndarray:
    """bytes -> uint16 ids with the tokenizer's merges and its pre_split (if any)."""
    return encode_bytes(data, _table(tok), getattr(tok, "pre_split", None))


def _table(tok: Tokenizer) -> MergeTable:
    """The tokenizer's MergeTable, built once and cached on it."""
    t = getattr(tok, "_bpe_table", None)
    if t is None:
        t = MergeTable(tok.merges)
        tok._bpe_table = t
    return t


def train_tokenizer(data, n_merges: int, *, pre_split: str | None = None,
                    max_sample_bytes: int = DEFAULT_MAX_SAMPLE_BYTES, seed: int = 0) -> Tokenizer:
    """train_bpe, wrapped into a Tokenizer that remembers its pre_split."""
    tok = Tokenizer(train_bpe(data, n_merges, pre_split=pre_split, max_sample_bytes=max_sample_bytes, seed=seed))
    tok.pre_split = pre_split
    return tok


__all__ = [
    "FORMAT", "VERSION", "TEXT_PATTERN", "DEFAULT_MAX_SAMPLE_BYTES", "MergeTable",
    "train_bpe", "train_tokenizer", "sample_segments", "apply_merges", "encode", "encode_bytes",
    "encode_chunks", "encode_file", "decode_ids", "merges_sha256", "save_tokenizer", "load_tokenizer",
    "tokenizer_to_json", "tokenizer_from_json",
]
