"""`bytemodel export RUN --format hf OUT_DIR`: a checkpoint as a Hugging Face Llama directory.

Written with safetensors and JSON only (no torch). The directory is built complete in a temporary
folder beside OUT_DIR (every file through write_atomic, so fsynced), then renamed into place: OUT_DIR is either the old
one or the whole new one, never half. A non-empty OUT_DIR is refused unless force is set; with
force the old directory is moved aside, the new one renamed in, then the old one deleted. A
directory that holds a bytemodel run (its checkpoints) is refused even with force.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import checkpoint as ckpt
from ..atomic import write_atomic
from ..errors import ConfigError, named
from . import layout as hl
from . import tokenizer_json as tj
from .readme import readme_text
from .tensors import tensor_names

FORMATS = ("hf",)


@dataclass
class ExportResult:
    out_dir: Path
    files: list[str]
    dropped: list[str] = field(default_factory=list)   # checkpoint tensors the HF model has no place for


def _dropped_tensors(loaded) -> list[str]:
    """Tensors of the checkpoint (file and layout) that are not the Llama trunk, e.g. MTP heads."""
    extra = set(hl.extra_params(loaded.cfg))
    try:
        names = tensor_names(loaded.path)
    except (OSError, ValueError):
        names = []
    known = hl.trunk_names(loaded.cfg) | {"optim.m", "optim.v"}
    extra |= {n for n in names if n not in known}
    return sorted(extra)


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def export_hf(run, out_dir, force: bool = False, fmt: str = "hf", last: bool = False) -> ExportResult:
    """Export the checkpoint in `run` (a run directory or checkpoint file) to out_dir.

    In a run directory the best weights (best.safetensors) are exported, as generate and score
    use them; last=True takes the latest (the resume checkpoint)."""
    from safetensors.numpy import save as st_save
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; known: {', '.join(FORMATS)}")
    loaded = ckpt.load(ckpt.model_path(run, last=last))
    out_dir = Path(out_dir)
    _check_target(out_dir, loaded.path, force)
    cfg, tok = loaded.cfg, loaded.tokenizer
    dropped = _dropped_tensors(loaded)
    files = {
        "config.json": _json_bytes(hl.hf_config(cfg, tok.doc_id)),
        "generation_config.json": _json_bytes(generation_config(cfg, tok)),
        "tokenizer.json": _json_bytes(tj.tokenizer_json(tok)),
        "tokenizer_config.json": _json_bytes(tj.tokenizer_config(tok, cfg.context)),
        "special_tokens_map.json": _json_bytes(tj.special_tokens_map()),
        "README.md": readme_text(loaded, dropped).encode("utf-8"),
    }
    # transformers checks the "format" metadata; "pt" is what it expects of a PyTorch model
    files["model.safetensors"] = st_save(hl.to_hf(cfg, loaded.params), metadata={"format": "pt"})
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=parent))
    try:
        for name, data in files.items():
            write_atomic(tmp / name, data)
        os.chmod(tmp, 0o777 & ~_umask())  # as mkdir would make it (mkdtemp makes it private)
        _fsync(tmp)
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(out_dir, sorted(files), dropped)


def generation_config(cfg, tok) -> dict:
    """Sampling defaults as ours (temperature 1, no top-k / top-p), stopping at a document end."""
    g = {"bos_token_id": tok.doc_id, "eos_token_id": tok.doc_id, "pad_token_id": tok.doc_id,
         "do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    if cfg.vocab_size > tok.vocab_size:  # ids the tokenizer does not have are never sampled here
        g["suppress_tokens"] = list(range(tok.vocab_size, cfg.vocab_size))
    return g


def _check_target(out_dir: Path, ckpt_path: Path, force: bool) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir} exists and is not a directory")
    src = Path(ckpt_path).resolve()
    dst = out_dir.resolve()
    if src.parent == dst or dst in src.parents:
        raise ConfigError(f"{out_dir} holds the checkpoint being exported; choose another directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise ConfigError(f"{out_dir} is not empty; pass {named('--force', 'force=True')} to replace it")
    held = [n for n in (ckpt.CKPT_NAME, ckpt.BEST_NAME) if (out_dir / n).exists()]
    if held:   # another run's weights: --force meant for an old export would delete them (a typo away)
        raise ConfigError(f"{out_dir} holds a bytemodel run ({held[0]}); {named('--force', 'force=True')} never replaces one: "
                          f"choose another directory")


def _swap_in(tmp: Path, out_dir: Path) -> None:
    """Rename tmp to out_dir; an existing out_dir is moved aside first and deleted after."""
    old = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=tmp.parent))
        os.rmdir(old)
        os.replace(out_dir, old)
    try:
        os.replace(tmp, out_dir)
    except BaseException:
        if old is not None:
            os.replace(old, out_dir)
        raise
    _fsync(tmp.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
