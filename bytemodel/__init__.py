"""bytemodel: byte-level transformers for any 8-bit stream, with hand-written gradients.

The public Python API (the CLI is a thin layer over it):

    import bytemodel
    result = bytemodel.train("genome.fa", preset="tiny", steps=500)     # -> TrainResult
    lm = bytemodel.load(result.run_dir)                                 # -> LanguageModel
    data = lm.generate(4096, prompt=b">", temperature=0.8, seed=1)      # -> bytes
    lm.score(b"ACGT...")["bits_per_byte"]
"""
from __future__ import annotations

from pathlib import Path

from .config import ModelConfig, PRESETS, TrainConfig, preset
from .errors import BytemodelError, CheckpointError, ConfigError, SourceError, TokenizerError
from .tokenizer import Tokenizer

__version__ = "0.1.0"

__all__ = ["train", "load", "LanguageModel", "ModelConfig", "TrainConfig", "PRESETS", "preset", "Tokenizer",
           "BytemodelError", "CheckpointError", "ConfigError", "SourceError", "TokenizerError",
           "latest_run"]


def train(source: str, out_dir: str | None = None, *, resume: bool = False, progress: bool = False,
          log=None, stop_at: int | None = None, **settings):
    """Train a model on a file or directory; settings are TrainConfig fields (preset, steps, ...).

    Returns a TrainResult (run_dir, checkpoint, step, val_bpb, train_loss, interrupted, history).
    """
    import dataclasses
    from .training import train as _train
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    bad = set(settings) - known
    if bad:
        raise ConfigError(f"unknown training setting(s): {', '.join(sorted(bad))}")
    if resume:
        settings.setdefault("steps", 0)  # 0: the run's own step count
    tc = TrainConfig(source=str(source) if source else "", out_dir=str(out_dir) if out_dir else "", **settings)
    return _train(tc, resume=resume, progress=progress, log=log or (lambda *a: None), stop_at=stop_at)


class LanguageModel:
    """A loaded checkpoint ready to generate and score."""

    def __init__(self, loaded, device: str = "cpu", precision: str = "fp32"):
        from .model import Model
        from .ops import get_backend
        self.cfg, self.tokenizer, self.path = loaded.cfg, loaded.tokenizer, loaded.path
        self.train_state = loaded.train
        self.model = Model(self.cfg, get_backend(device, precision, strict=False))
        self.model.load_flat(loaded.params)

    def generate(self, n_bytes: int = 4096, prompt: bytes | str = b"", temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0, stop_at_doc_end: bool = False,
                 on_bytes=None, speculative: bool = False, stats=None) -> bytes:
        """speculative: draft with the multi-token heads, verify in blocks (same distribution)."""
        from .generate import generate
        if isinstance(prompt, str):
            prompt = prompt.encode("utf-8")
        return generate(self.model, self.tokenizer, n_bytes, prompt, temperature, top_k, top_p, seed,
                        stop_at_doc_end, on_bytes, speculative, stats)

    def score(self, data: bytes) -> dict:
        """{'bytes', 'tokens', 'bits', 'bits_per_byte'} of data as a new document."""
        from .generate import score
        return score(self.model, self.tokenizer, data)

    def compress(self, data: bytes, **options) -> bytes:
        """data -> a .bmz container: range coded under this model (options: see bytemodel.compress)."""
        from .compress import compress
        return compress(self, data, **options)

    def decompress(self, blob: bytes, **options) -> bytes:
        """A .bmz container made with this checkpoint and backend -> the exact original bytes."""
        from .compress import decompress
        return decompress(self, blob, **options)


def load(path: str | Path | None = None, device: str = "cpu", precision: str = "fp32") -> LanguageModel:
    """Load a checkpoint file or run directory (default: the latest run under ./runs)."""
    from . import checkpoint
    if path is None:
        path = latest_run()
    return LanguageModel(checkpoint.load(path), device, precision)


def latest_run(root: str | Path = "runs") -> Path:
    """The most recently saved run directory under root."""
    from .checkpoint import CKPT_NAME
    root = Path(root)
    found = sorted(root.glob(f"*/{CKPT_NAME}"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    if not found:
        raise CheckpointError(f"no trained run found under {root}/ (train one first, or pass --checkpoint)")
    return found[-1].parent
