"""Training-only augmentation of a built corpus (e.g. `fasta:revcomp`): extra documents made from
the training part, inserted between it and the held-out tail.

The token file becomes
    [training part, as built] [copies of its documents] [held-out tail, as built]
and the split moves past the copies. The tail is the very same tokens as without augmentation
(its size is decided on the unaugmented stream), so validation figures with and without it are
measured on the same data. A document cut by the split contributes only its training part.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ..atomic import write_atomic
from ..corpus import CORPUS_FILE, TOKENS_FILE, Corpus, open_corpus
from ..errors import SourceError
from ..tokenizer import Tokenizer


def add_training_copies(run_dir: str | os.PathLike, corpus: Corpus, tokenizer: Tokenizer, copies) -> Corpus:
    """copies(doc bytes) -> list of extra documents; rewrites the run's corpus; returns it reopened."""
    run_dir = Path(run_dir)
    train = np.array(corpus.train)        # copies: the file under these views is replaced below
    val = np.array(corpus.val)
    h = hashlib.sha256()
    sep = np.array([tokenizer.doc_id], dtype="<u2").tobytes()
    n = {"tokens": 0, "bytes": 0, "docs": 0}

    def write(f):
        def put(b: bytes):
            f.write(b)
            h.update(b)
        put(train.astype("<u2").tobytes())
        if len(train) and train[-1] != tokenizer.doc_id:
            put(sep)                      # the split cut a document: close it before the copies
            n["tokens"] += 1
        cuts = np.flatnonzero(train == tokenizer.doc_id)
        for s, e in zip(np.concatenate([[0], cuts + 1]), np.concatenate([cuts, [len(train)]])):
            if e <= s:
                continue
            for extra in copies(tokenizer.decode(train[s:e])):
                if extra:
                    ids = tokenizer.encode(extra).astype("<u2").tobytes() + sep
                    put(ids)
                    n["tokens"] += len(ids) // 2
                    n["bytes"] += len(extra)
                    n["docs"] += 1
        put(val.astype("<u2").tobytes())

    info = json.loads((run_dir / CORPUS_FILE).read_text())
    write_atomic(run_dir / TOKENS_FILE, write, error=SourceError)
    info.update(n_tokens=info["n_tokens"] + n["tokens"], split=info["split"] + n["tokens"],
                n_bytes=info["n_bytes"] + n["bytes"], n_docs=info["n_docs"] + n["docs"],
                sha256=h.hexdigest(), augmented_docs=n["docs"])
    write_atomic(run_dir / CORPUS_FILE, json.dumps(info).encode(), error=SourceError)
    return open_corpus(run_dir)
