"""A fine-tune's parent: the model, tokenizer and weights a fine-tuning run starts from.

Used by training/prepare.py and training/loop.py when a run's settings name a parent (finetune.py is
the user's entry). What a fine-tune is:

A fine-tune is an ordinary run (the same loop, checkpoints, metrics, exact resume) that
    - starts from its parent's weights instead of random ones, with a fresh optimizer state and
      its own schedule (steps, lr, warmup);
    - keeps the parent's model and tokenizer (byte-pair merges are not relearned), and records the
      parent (path and weights checksum) in its settings: `bytemodel info` shows it;
    - learns from plain data (like pretraining), or from examples (bytemodel.pairs): prompt ->
      completion pairs or chat conversations, the loss counting completions / assistant turns only.

Chat needs the role specials (tokenizer.CHAT_SPECIALS). A parent without them gets them appended
after its specials, and its embedding and LM head grow by as many rows; each new row starts as a
copy of the <doc> row, the one special the parent knows (so a new turn marker starts out meaning
"a boundary", and <end> starts as likely as the end of a document was).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import checkpoint as ckpt
from .errors import ConfigError, CheckpointError, named
from .model import buffer_size, layout, views

DEFAULTS = dict(steps=300, lr=5e-4, warmup=20)  # gentler than pretraining: the weights already work


def prepare_finetune(tc, next_run_dir):
    """prepare() for a new fine-tune run: -> (run_dir, tok, corpus, cfg); fills the draft settings
    `tc` in (parent, its checksum, context, out_dir). next_run_dir(source): the run directory when
    tc.out_dir is not given."""
    from .chat_template import chat_tokenizer
    from .config import ModelConfig
    from .corpus import build_corpus
    from .pairs import KINDS, build_examples, read_examples, split_examples
    if tc.merges or tc.tokenizer:
        raise ConfigError(f"a fine-tune keeps its parent's tokenizer: drop {named('--merges / --tokenizer', 'merges / tokenizer')}")
    if tc.examples and tc.examples not in KINDS:
        raise ConfigError(f"unknown example kind {tc.examples!r}; choose one of {', '.join(KINDS)}")
    if tc.val_source and not tc.examples:
        raise ConfigError(f"{named('--val FILE', 'val_source=FILE')} is for examples "
                          "(" + named('--pairs / --chat', 'examples="pairs" / "chat"') + "); plain data holds out its tail")
    parent = ckpt.load(tc.parent)
    tok = parent.tokenizer
    if tc.examples == "chat":
        tok = chat_tokenizer(tok)
    cfg = parent.cfg
    if tok.vocab_size > cfg.vocab_size:
        cfg = ModelConfig.from_dict({**cfg.to_dict(), "vocab_size": tok.vocab_size})
    tc.parent = str(tc.parent)
    tc.parent_sha256 = _params_sha(parent)
    tc.context = cfg.context
    tc.model = {}
    run_dir = Path(tc.out_dir) if tc.out_dir else next_run_dir(tc.source)
    tc.out_dir = str(run_dir)
    if run_dir.resolve() == Path(parent.path).resolve().parent:
        raise ConfigError(f"the fine-tune needs its own run directory ({named('--out', 'out_dir')}), not its parent's")
    ckpt.check_new_run(run_dir)
    if tc.examples:
        examples = read_examples(tc.source, tc.examples)
        if tc.val_source:
            train, held = examples, read_examples(tc.val_source, tc.examples)
        else:
            train, held = split_examples(examples, tc.val_fraction, tc.seed)
        corpus = build_examples(run_dir, tok, tc.examples, train, held)
    else:
        from .readers import read_documents
        corpus = build_corpus(read_documents(tc.source, tc.reader or None), tok, run_dir, tc.val_fraction,
                              cfg.context)
    return run_dir, tok, corpus, cfg


def _params_sha(loaded) -> str:
    return ckpt._sha(loaded.params)


def parent_weights(tc, cfg) -> np.ndarray:
    """The parent's weights laid out for `cfg` (the vocabulary grown if the fine-tune added specials)."""
    parent = ckpt.load(tc.parent)
    if tc.parent_sha256 and _params_sha(parent) != tc.parent_sha256:
        raise CheckpointError(f"the parent {tc.parent} changed since this fine-tune was set up")
    return grow_vocab(parent.params, parent.cfg, cfg, doc_id=parent.tokenizer.doc_id)


def grow_vocab(params: np.ndarray, old, new, doc_id: int) -> np.ndarray:
    """Flat params of config `old` -> flat params of `new`, which may have a larger vocabulary.

    Every tensor is copied; rows of wte (V, C) and columns of lm_head (C, V) past the old V start
    as copies of the <doc> row / column. Everything but vocab_size (and the training-only dropout
    rates, which shape no weight) must match.
    """
    free = {"vocab_size": 0, "dropout": 0, "dropout_attn": 0}
    if {**old.to_dict(), **free} != {**new.to_dict(), **free}:
        raise ConfigError("the fine-tune's model must be its parent's (only the vocabulary may grow)")
    if new.vocab_size < old.vocab_size:
        raise ConfigError("the vocabulary cannot shrink")
    if new.vocab_size == old.vocab_size:
        return params
    out = np.zeros(buffer_size(new), dtype=np.float32)
    src, dst = views(np.asarray(params, dtype=np.float32), old), views(out, new)
    V = old.vocab_size
    for name, _, _ in layout(new):
        if name == "wte":
            dst[name][:V] = src[name]
            dst[name][V:] = src[name][doc_id]
        elif name == "lm_head":
            dst[name][:, :V] = src[name]
            dst[name][:, V:] = src[name][:, doc_id:doc_id + 1]
        else:
            dst[name][...] = src[name]
    return out
