"""Checkpoints: safetensors tensors + JSON metadata, written atomically.

File layout (one .safetensors file):
    tensors  <param name>  fp32, one per named parameter (e.g. "layers.0.wqkv")
             "optim.m", "optim.v"  fp32 flat AdamW moments (optional: absent in export-only files)
    metadata {"bytemodel": JSON string} with
             format, version, config (ModelConfig), tokenizer, train (settings and state: step,
             seed, optimizer step count, loss scale, corpus hash), sha256
    sha256: one SHA-256 over everything else in the file: the metadata (canonical JSON, sorted keys)
             and every tensor (name, dtype, shape and bytes, in name order), so a flipped bit in a
             weight or an AdamW moment, or an edited step, context or learning rate, is refused

Writing: bytes go to a temporary file in the same directory, fsync, then os.replace over the old
file, then the directory is fsynced: a crash or Ctrl-C at any point leaves the previous checkpoint
intact. Reading never unpickles anything (safetensors holds raw arrays and a JSON header) and
refuses files that are not ours, are not regular files, are truncated or corrupt, or do not match
the model.
"""
from __future__ import annotations

import hashlib
import os  # noqa: F401  (tests/test_train.py patches checkpoint.os.fsync to crash a save midway)
import json
from pathlib import Path

import numpy as np

from .atomic import write_atomic
from .config import ModelConfig
from .errors import CheckpointError, ConfigError, TokenizerError, named
from .model import layout, views
from .tokenizer import Tokenizer

FORMAT = "bytemodel-checkpoint"
VERSION = 2   # 2: the checksum covers every tensor and all metadata (1: the weights only; still read)
CKPT_NAME = "checkpoint.safetensors"   # the resume checkpoint: the latest weights + optimizer state
BEST_NAME = "best.safetensors"         # the lowest-validation weights (no optimizer state)


def _sha(flat: np.ndarray) -> str:
    """SHA-256 of flat fp32 weights: the weights' identity (compress/driver.py records it in .bmz files)."""
    return hashlib.sha256(np.ascontiguousarray(flat, dtype="<f4").tobytes()).hexdigest()


def digest(meta: dict, tensors: dict[str, np.ndarray]) -> str:
    """SHA-256 of the metadata (without its "sha256" key) and of every tensor, in name order."""
    h = hashlib.sha256()
    body = {k: v for k, v in meta.items() if k != "sha256"}
    h.update(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8"))
    for name in sorted(tensors):
        t = np.ascontiguousarray(tensors[name])
        h.update(f"\n{name} {t.dtype.str} {list(t.shape)}\n".encode("utf-8"))
        h.update(t.reshape(-1).view(np.uint8))
    return h.hexdigest()


def save(path, cfg: ModelConfig, tokenizer: Tokenizer, params: np.ndarray, train_state: dict | None = None,
         m: np.ndarray | None = None, v: np.ndarray | None = None) -> Path:
    """Write a checkpoint atomically. params/m/v are flat host arrays in the model's layout."""
    from safetensors.numpy import save as st_save
    path = Path(path)
    params32 = np.asarray(params, dtype=np.float32)
    tensors = {name: np.ascontiguousarray(t) for name, t in views(params32, cfg).items()}
    if m is not None:
        tensors["optim.m"] = np.asarray(m, dtype=np.float32)
        tensors["optim.v"] = np.asarray(v, dtype=np.float32)
    meta = {"format": FORMAT, "version": VERSION, "config": cfg.to_dict(), "tokenizer": tokenizer.to_dict(),
            "train": train_state or {}}
    meta = json.loads(json.dumps(meta))   # exactly what a reader will parse back
    meta["sha256"] = digest(meta, tensors)
    blob = st_save(tensors, metadata={"bytemodel": json.dumps(meta)})
    write_atomic(path, blob)
    return path


class Loaded:
    """What a checkpoint holds: config, tokenizer, flat params (+ moments), train state."""

    def __init__(self, cfg, tokenizer, params, train, m=None, v=None, path=None):
        self.cfg, self.tokenizer, self.params, self.train = cfg, tokenizer, params, train
        self.m, self.v, self.path = m, v, path


def resolve(path) -> Path:
    """A checkpoint file, or a run directory holding one."""
    from .fileguard import regular_file
    p = Path(path)
    if p.is_dir():
        p = p / CKPT_NAME
    return regular_file(p, "checkpoint", CheckpointError)


def model_path(path, last: bool = False) -> Path:
    """The weights a user means by `path`: a file as it is; in a run directory the best
    checkpoint where there is one, else (or with last=True) the resume checkpoint. last=True with
    a file is refused (before: the file was loaded and last silently ignored)."""
    p = Path(path)
    if last and p.exists() and not p.is_dir():
        raise ConfigError(f"{named('--last', 'last=True')} picks a run directory's latest weights; {p} is a "
                          f"checkpoint file, loaded as it is: give its run directory, or leave out "
                          f"{named('--last', 'last')}")
    if p.is_dir() and not last and (p / BEST_NAME).exists():
        return p / BEST_NAME
    return resolve(p)


def check_new_run(run_dir) -> None:
    """A new run (or fine-tune) is not written over one that run_dir already holds."""
    if (Path(run_dir) / CKPT_NAME).exists():
        raise ConfigError(f"{run_dir} already holds a checkpoint; use {named('--resume', 'resume=True')} to "
                          f"continue it or another {named('--out', 'out_dir')}")


def load(path) -> Loaded:
    from safetensors import SafetensorError
    from safetensors.numpy import load as st_load
    p = resolve(path)
    try:
        blob = p.read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {p}: {e.strerror}") from None
    try:
        meta = _read_meta(blob)
        tensors = st_load(blob)
    except (SafetensorError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        what = _looks_like(blob)
        if what:
            raise CheckpointError(f"{p} is {what}, not a bytemodel checkpoint (a run directory or its "
                                  f"{BEST_NAME} / {CKPT_NAME})") from None
        raise CheckpointError(f"{p} is not a valid bytemodel checkpoint ({str(e).splitlines()[0][:120]})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{p} is not a bytemodel checkpoint")
    version = meta.get("version")
    if version not in (1, VERSION) or isinstance(version, bool):
        raise CheckpointError(f"{p} has checkpoint version {version!r}; this bytemodel reads 1 and {VERSION}")
    if version == 1 and _newer_than_v1(meta):
        raise CheckpointError(f"{p} says version 1 but holds what only a later version writes (a re-signed "
                              f"file?); refused: version 1's checksum covers the weights only")
    if version == VERSION and digest(meta, tensors) != meta.get("sha256"):
        raise CheckpointError(f"{p} is corrupt: its tensors or metadata do not match their checksum")
    try:
        if not (isinstance(meta.get("config"), dict) and isinstance(meta.get("tokenizer"), dict)):
            raise TypeError("config and tokenizer must be JSON objects")
        cfg = ModelConfig.from_dict(meta["config"])
        tok = Tokenizer.from_dict(meta["tokenizer"])
    except (ConfigError, TokenizerError, KeyError, TypeError) as e:
        raise CheckpointError(f"{p} has an invalid model description: {e}") from None
    train = meta.get("train", {})
    if not isinstance(train, dict) or not isinstance(train.get("config", {}), dict):
        raise CheckpointError(f"{p} has an invalid training state (not a JSON object)")
    if tok.vocab_size > cfg.vocab_size:
        raise CheckpointError(f"{p}: tokenizer has {tok.vocab_size} ids but the model only {cfg.vocab_size}")
    from .model import buffer_size
    flat = np.zeros(buffer_size(cfg), dtype=np.float32)
    for name, shape, off in layout(cfg):
        t = tensors.get(name)
        if t is None or tuple(t.shape) != tuple(shape) or t.dtype != np.float32:
            got = None if t is None else f"{t.dtype}{tuple(t.shape)}"
            raise CheckpointError(f"{p}: tensor {name} is {got}, expected float32{tuple(shape)}")
        flat[off:off + t.size] = t.reshape(-1)
    if version == 1 and _sha(flat) != meta.get("params_sha256"):
        # version 1 (written before the checksum covered everything) still loads: its checksum
        # covers the weights, which are verified; the next save writes version 2
        raise CheckpointError(f"{p} is corrupt: its weights do not match their checksum")
    m, v = tensors.get("optim.m"), tensors.get("optim.v")
    if m is not None and (m.shape != flat.shape or v is None or v.shape != flat.shape):
        raise CheckpointError(f"{p}: optimizer state does not match the model")
    for what, a in (("weights", flat), ("optimizer moments", m), ("optimizer moments", v)):
        if a is not None and not np.isfinite(a).all():
            raise CheckpointError(f"{p}: its {what} hold NaN or infinity; a model cannot compute with them")
    return Loaded(cfg, tok, flat, train, m, v, p)


# what version 1 (the checksum over the weights only) wrote: a file that says version 1 but holds
# more was re-signed to dodge version 2's full checksum
_V1_META = {"format", "version", "config", "tokenizer", "train", "params_sha256"}
_V1_TRAIN = {"config", "step", "optim", "scaler", "corpus_sha256", "val_bpb", "val_se", "n_bytes", "best"}
_V1_SETTINGS = {"source", "out_dir", "preset", "steps", "batch_size", "context", "lr", "min_lr_ratio", "warmup",
                "weight_decay", "beta1", "beta2", "grad_clip", "seed", "eval_every", "eval_tokens", "val_fraction",
                "device", "precision", "reader", "merges", "tokenizer", "workers", "distributed",
                "shard_optimizer", "model"}


def _newer_than_v1(meta: dict) -> bool:
    train = meta.get("train")
    if set(meta) - _V1_META or not isinstance(train, dict) or set(train) - _V1_TRAIN:
        return True
    return isinstance(train.get("config"), dict) and bool(set(train["config"]) - _V1_SETTINGS)


# what a file given where a checkpoint belongs more likely is, by its first bytes
_KINDS = ((b"\x89BMZ\r\n\x1a\n", "a file made by `bytemodel compress` (decompress it with `bytemodel decompress`)"),
          (b"\x89PNG", "a PNG image"), (b"\xfd7zXZ", "an xz file"), (b"\x28\xb5\x2f\xfd", "a zstd file"),
          (b"\x1f\x8b", "a gzip file"), (b"PK\x03\x04", "a zip file"), (b"\x7fELF", "an executable"))


def _looks_like(blob: bytes) -> str:
    """Words for a file that is not a checkpoint but something recognisable ("" if not)."""
    for magic, what in _KINDS:
        if blob.startswith(magic):
            return what
    head = blob[:4096].lstrip()
    if head.startswith(b"{"):
        if b'"merges"' in head:
            return f"a tokenizer file (give it with {named('--tokenizer', 'tokenizer=')})"
        if b'"model_type"' in head or b'"architectures"' in head:
            return "a Hugging Face config (import its folder with `bytemodel import-hf`)"
        return "a JSON file"
    return ""


def _read_meta(blob: bytes) -> dict:
    from .jsonguard import loads
    if len(blob) < 8:
        raise ValueError("file too short")
    n = int.from_bytes(blob[:8], "little")
    if n <= 0 or 8 + n > len(blob):
        raise ValueError("bad header length")
    header = loads(blob[8:8 + n], "the safetensors header", CheckpointError)
    meta = loads(header["__metadata__"]["bytemodel"], "the bytemodel metadata", CheckpointError, constants=True)
    if not isinstance(meta, dict):
        raise ValueError("the metadata is not a JSON object")
    return meta
