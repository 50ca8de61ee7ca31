"""`bytemodel import-hf DIR --out RUN`: a Hugging Face Llama directory -> a bytemodel checkpoint.

Reads config.json, the safetensors weights (any float dtype, sharded or not) and tokenizer.json.
Works on what `bytemodel export` writes and on any LlamaForCausalLM whose shapes bytemodel can
represent (head_dim = hidden_size / heads, SwiGLU, no biases, plain RoPE). Without a
tokenizer.json the ids are taken as plain bytes (0..255) with <doc> at 256. The checkpoint holds
weights only (no optimizer state, no training state): a starting point for fine-tuning, or for
generate / score / export.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import checkpoint as ckpt
from ..config import ModelConfig
from ..errors import CheckpointError, ConfigError, TokenizerError, named
from ..tokenizer import Tokenizer
from . import layout as hl
from .tensors import read_dir_tensors
from .tokenizer_json import read_tokenizer_json


@dataclass
class ImportResult:
    checkpoint: Path
    cfg: ModelConfig
    tokenizer: Tokenizer
    note: str = ""   # what was assumed, if anything


def _read_json(path: Path, err):
    from ..fileguard import regular_file
    from ..jsonguard import loads
    try:
        raw = regular_file(path, "file", err).read_bytes()
    except OSError as e:
        raise err(f"cannot read {path}: {e.strerror}") from None
    return loads(raw, str(path), err)


def import_hf(src, out_dir, force: bool = False) -> ImportResult:
    src, out_dir = Path(src), Path(out_dir)
    if not src.is_dir():
        raise ConfigError(f"{src} is not a directory (give the folder holding config.json)")
    if not (src / "config.json").is_file():
        raise ConfigError(f"{src}: no config.json; not a Hugging Face model directory")
    cfg = hl.config_from_hf(_read_json(src / "config.json", ConfigError), str(src / "config.json"))
    if (out_dir / ckpt.BEST_NAME).exists():   # before: written beside it, generate/score/info kept using it
        raise ConfigError(f"{out_dir} holds a trained run ({ckpt.BEST_NAME}, its best weights, which generate, "
                          f"score and info would go on using, {named('--force', 'force=True')} or not); import into a new directory")
    target = out_dir / ckpt.CKPT_NAME
    if target.exists() and not force:
        raise ConfigError(f"{target} exists; pass {named('--force', 'force=True')} to replace it")
    note = ""
    if (src / "tokenizer.json").is_file():
        where = str(src / "tokenizer.json")
        tok = read_tokenizer_json(_read_json(src / "tokenizer.json", TokenizerError), where)
    else:
        tok = Tokenizer()
        note = f"no tokenizer.json: ids 0..255 taken as the bytes, {tok.doc_id} as <doc>"
    if tok.vocab_size > cfg.vocab_size:
        raise TokenizerError(f"{src}: the tokenizer has {tok.vocab_size} ids but the model only {cfg.vocab_size}")
    flat = hl.from_hf(cfg, read_dir_tensors(src), str(src))
    if not np.isfinite(flat).all():
        bad = int((~np.isfinite(flat)).sum())
        raise CheckpointError(f"{src}: {bad:,} weights are NaN or infinite; a model cannot compute with them")
    try:
        ckpt.save(target, cfg, tok, flat)
    except OSError as e:
        raise CheckpointError(f"cannot write {target}: {e.strerror}") from None
    return ImportResult(target, cfg, tok, note)
