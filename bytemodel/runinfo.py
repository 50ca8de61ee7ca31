"""What a run records about its data, and what the commands that use the model take from it.

A run stores, in its checkpoints' training state under the key "data" (written by training):

    source       the source as an absolute path
    reader       the reader spec that read it, resolved: the one given (--reader), else the one
                 detection picked for every file ("fasta" for the quick start's .fa.gz); None when
                 the files of a directory were read by different readers (then "readers" lists
                 them) or for fine-tuning examples (JSONL)
    byte_values  the byte values (0..255) the run's data holds, sorted; a fine-tune adds its
                 parent's (None when the parent recorded none: then any byte may be right)

`RunData.of(train_state)` reads it back. Runs trained before this was recorded have no "data":
their reader is the one their settings name ("" = detect per file, the old behaviour) and no byte
set is known (generation samples every byte); `RunData.note` says so in one line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CheckpointError

CHUNK = 1 << 24   # tokens counted at a time: bounded memory for a token file of any size


def byte_values(tokens: np.ndarray, tok) -> list[int]:
    """The byte values that the ids in `tokens` (a uint16 array or memmap) spell."""
    counts = np.zeros(tok.vocab_size, dtype=np.int64)
    for i in range(0, len(tokens), CHUNK):
        counts += np.bincount(np.asarray(tokens[i:i + CHUNK]), minlength=tok.vocab_size)[:tok.vocab_size]
    seen = np.zeros(256, dtype=bool)
    seen[np.nonzero(counts[:256])[0]] = True
    for i in np.nonzero(counts[256:])[0] + 256:   # merges spell several bytes; specials none
        seen[list(tok.vocab[i])] = True
    return [int(b) for b in np.nonzero(seen)[0]]


def resolved_readers(source: str, reader: str) -> list[str]:
    """The reader specs that read `source`: the given one, else what detection picks per file."""
    from .readers import detect, get_reader, source_files
    if reader:
        return [get_reader(reader).spec]
    return sorted({detect(f).spec for f in source_files(source)})


def _parent_values(parent: str) -> list[int] | None:
    """The parent's recorded byte values (its metadata only: the weights are not read)."""
    from safetensors import safe_open
    from .checkpoint import resolve
    with safe_open(str(resolve(parent)), framework="numpy") as f:
        meta = json.loads((f.metadata() or {}).get("bytemodel", "{}"))
    return RunData.of(meta.get("train", {}), str(parent)).byte_values_list()


def run_data(tc, corpus, tok) -> dict:
    """The "data" record of a new run (tc its TrainConfig, corpus its built Corpus)."""
    readers = [] if tc.examples else resolved_readers(tc.source, tc.reader)
    values = byte_values(corpus.tokens, tok)
    if tc.parent:
        parent = _parent_values(tc.parent)
        values = None if parent is None else sorted(set(values) | set(parent))
    d = {"source": str(Path(tc.source).resolve()) if tc.source else "",
         "reader": readers[0] if len(readers) == 1 else None, "byte_values": values}
    if len(readers) > 1:
        d["readers"] = readers
    return d


@dataclass
class RunData:
    reader: str | None             # spec for reading and writing files like the run's data; None: detect
    byte_values: frozenset | None  # the bytes the data holds; None: not known (any byte)
    source: str = ""
    recorded: bool = False         # False: a run from before the record (old behaviour)
    readers: tuple = ()            # a directory read by several readers

    @classmethod
    def of(cls, train: dict, where: str = "checkpoint") -> "RunData":
        """From a checkpoint's training state; checked, since a checkpoint is a file anyone can craft."""
        d = train.get("data")
        if d is None:
            cfg = train.get("config") if isinstance(train.get("config"), dict) else {}
            return cls(str(cfg.get("reader") or "") or None, None, str(cfg.get("source") or ""))
        bad = CheckpointError(f"{where}: the run's data record is not valid")
        if not isinstance(d, dict):
            raise bad
        reader, values, source = d.get("reader"), d.get("byte_values"), d.get("source", "")
        readers = d.get("readers", [])
        if not (reader is None or isinstance(reader, str)) or not isinstance(source, str):
            raise bad
        if not isinstance(readers, list) or not all(isinstance(r, str) for r in readers):
            raise bad
        if values is not None:
            if not (isinstance(values, list) and all(isinstance(v, int) and not isinstance(v, bool)
                                                     and 0 <= v < 256 for v in values)):
                raise bad
            values = frozenset(values)
        return cls(reader or None, values, source, True, tuple(readers))

    def byte_values_list(self) -> list[int] | None:
        return None if self.byte_values is None else sorted(self.byte_values)

    def allowed_ids(self, tok) -> np.ndarray | None:
        """bool (V,): the ids generation may sample (every byte of the id in the data; specials
        always); None when every id is allowed."""
        if self.byte_values is None:
            return None
        ok = np.zeros(256, dtype=bool)
        ok[list(self.byte_values)] = True
        allowed = np.array([ok[list(b)].all() if b else True for b in tok.vocab[:tok.vocab_size]])
        return None if allowed.all() else allowed

    def note(self, path) -> str:
        """One line for a checkpoint without the record ("" for a run that has it): a run from
        before the record, or weights from `import-hf`."""
        if self.recorded:
            return ""
        how = f"reader {self.reader}" if self.reader else "files read by detection"
        return (f"note: {path} has no record of the reader and byte values it was trained on (a run from "
                f"before the record, or imported weights): {how}, every byte may be sampled")


def describe_bytes(values) -> str:
    """'4 values: A C G T' / '97 values: 0x0a, 0x20-0x7e'."""
    values = sorted(values)
    if len(values) <= 24 and all(33 <= v < 127 for v in values):
        return f"{len(values)} values: " + " ".join(chr(v) for v in values)
    runs, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            runs.append(f"0x{start:02x}" if start == v else f"0x{start:02x}-0x{v:02x}")
            start = None
    return f"{len(values)} values: " + ", ".join(runs)
