"""The files of a run folder, checked and kept tidy: token file, corpus.json, metrics.jsonl.

- ``verify_tokens``: on resume, the token file is hashed again (one streaming pass) and compared
  with the hash the checkpoint was trained on; a flipped bit is refused, and so is an id past the
  vocabulary (which only a crafted run can hold, but would crash the embedding lookup).
- ``check_corpus_info``: corpus.json is plain JSON a user can edit; every field is checked.
- ``trim_metrics``: a run killed after logging a step but before its checkpoint resumes from the
  checkpoint's step; the lines after that step, and a last line cut short by the kill, go, so the
  log holds each step once and every line parses.
- ``new_folders`` / ``remove_failed_run``: a fresh run that fails before its first checkpoint
  removes what it created (its files, and the folders it made), leaving no empty run folder.
- ``lock_run``: one writer per run folder. The writer (train, --resume, finetune; rank 0 under
  MPI) holds an advisory lock (flock) on the folder itself for the run's life, so no lock file is
  left behind and a killed writer's lock goes with its process. A second writer is refused before
  it writes anything; readers (generate, score, load) never take it.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from .errors import ConfigError, SourceError, named

RUN_FILES = ("tokens.u16", "corpus.json", "metrics.jsonl",   # what a run writes before its checkpoint
             "examples.json", "mask.u8", "spans.i64")          # (a fine-tune's examples: pairs.py)
_HASH_CHUNK = 1 << 22   # tokens per hashing step: 8 MiB


def verify_tokens(tokens: np.ndarray, want_sha256: str, vocab_size: int, where) -> None:
    """Hash the token stream and check its ids; SourceError on any mismatch."""
    h = hashlib.sha256()
    top = -1
    for i in range(0, len(tokens), _HASH_CHUNK):
        chunk = np.ascontiguousarray(tokens[i:i + _HASH_CHUNK])
        h.update(chunk.view(np.uint8))
        if len(chunk):
            top = max(top, int(chunk.max()))
    if h.hexdigest() != want_sha256:
        raise SourceError(f"the token file in {where} is damaged or changed: it does not match the hash "
                          f"the checkpoint was trained on")
    if top >= vocab_size:
        raise SourceError(f"the token file in {where} holds id {top}, outside the vocabulary of {vocab_size} ids")


def check_corpus_info(info, n_tokens_on_disk: int, where) -> dict:
    """corpus.json's fields, each of the right type and range; SourceError otherwise."""
    if not isinstance(info, dict):
        raise SourceError(f"corpus.json in {where} is damaged: not a JSON object")
    for k in ("n_tokens", "split", "n_bytes", "n_docs"):
        v = info.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise SourceError(f"corpus.json in {where} is damaged: {k} is {v!r}")
    if info["n_bytes"] == 0 or info["n_docs"] == 0:
        raise SourceError(f"corpus.json in {where} is damaged: a corpus of {info['n_bytes']} bytes in "
                          f"{info['n_docs']} documents")
    if not isinstance(info.get("sha256"), str):
        raise SourceError(f"corpus.json in {where} is damaged: no sha256")
    if info["n_tokens"] != n_tokens_on_disk:
        raise SourceError(f"corpus in {where} is damaged (length {n_tokens_on_disk}, expected {info['n_tokens']})")
    if not 0 < info["split"] < info["n_tokens"]:
        raise SourceError(f"corpus.json in {where} is damaged: split {info['split']} is not inside the "
                          f"{info['n_tokens']} tokens")
    return info


def trim_metrics(path: Path, step: int) -> None:
    """Keep the whole lines of metrics.jsonl for steps 1..step (none for a fresh run)."""
    from .atomic import write_atomic
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return
    keep = []
    for line in raw.split(b"\n"):
        try:
            rec = json.loads(line)
            s = rec["step"]
        except (ValueError, TypeError, KeyError):
            continue          # a line cut short by a kill, or not ours
        if isinstance(s, int) and 0 < s <= step:
            keep.append(line)
    text = b"".join(line + b"\n" for line in keep)
    if text != raw:
        write_atomic(path, text)


def new_folders(path: Path) -> list[Path]:
    """The folders that creating `path` would make, deepest first."""
    out = []
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        out.append(p)
        p = p.parent
    return out


def remove_failed_run(run_dir: Path, made: list[Path]) -> None:
    """Remove what a fresh run wrote before its first checkpoint, and the folders it made."""
    for name in RUN_FILES:
        try:
            (run_dir / name).unlink()
        except OSError:
            pass
    for d in made:            # deepest first; a folder someone else filled meanwhile stays
        try:
            d.rmdir()
        except OSError:
            break


class RunLock:
    """The advisory lock on a run folder (see lock_run); release() or the process's end frees it."""

    def __init__(self, fd: int | None):
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)      # closing the descriptor drops the flock
            self.fd = None


def lock_run(run_dir: Path) -> RunLock:
    """Take the folder's writer lock, or raise ConfigError if another process holds it."""
    import fcntl
    try:
        fd = os.open(run_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as e:
        raise ConfigError(f"cannot open the run folder {run_dir}: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ConfigError(f"{run_dir} is in use: another bytemodel process is training into it "
                              f"(wait for it to end, or give another {named('--out', 'out_dir')})") from None
        return RunLock(None)       # a file system without flock: run unlocked, as before
    return RunLock(fd)
