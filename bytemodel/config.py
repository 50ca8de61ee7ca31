"""Model configuration and the named presets (the same names in the CLI, tests and benchmarks)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import ConfigError


@dataclass
class ModelConfig:
    vocab_size: int = 257        # the tokenizer's vocabulary: 256 bytes + merges + specials
    d_model: int = 128           # C
    n_layers: int = 4            # L
    n_heads: int = 4             # H; head dim D = d_model // n_heads
    n_kv_heads: int = 0          # K; 0 means K = H (plain multi-head attention)
    d_ff: int = 384              # F, the SwiGLU hidden width
    context: int = 256           # T, the longest window the model is trained on
    rope_theta: float = 10000.0  # RoPE base, as Llama
    norm_eps: float = 1e-5       # RMSNorm epsilon
    tie_embeddings: bool = False  # LM head = embedding^T when True
    init_std: float = 0.02       # normal init; output projections get / sqrt(2 L) (GPT-2)

    def __post_init__(self):
        if self.n_kv_heads == 0:
            self.n_kv_heads = self.n_heads
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def validate(self) -> None:
        for f in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "context"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"{f} must be a positive integer, got {v!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"head dim {self.head_dim} must be even for RoPE")
        if not (self.rope_theta > 0 and self.norm_eps > 0 and self.init_std > 0):
            raise ConfigError("rope_theta, norm_eps and init_std must be positive")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name: f.type for f in dataclasses.fields(cls)}
        unknown = set(d) - set(known)
        if unknown:
            raise ConfigError(f"unknown model setting(s): {', '.join(sorted(unknown))}")
        out = {}
        for k, v in d.items():
            default = getattr(cls, k)
            if isinstance(default, bool):
                if not isinstance(v, bool):
                    raise ConfigError(f"{k} must be true or false, got {v!r}")
            elif isinstance(default, int):
                if isinstance(v, bool) or not isinstance(v, int):
                    raise ConfigError(f"{k} must be an integer, got {v!r}")
            elif isinstance(default, float):
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise ConfigError(f"{k} must be a number, got {v!r}")
                v = float(v)
            out[k] = v
        return cls(**out)


# name -> settings; vocab_size comes from the tokenizer
PRESETS = {
    "tiny": dict(d_model=128, n_layers=4, n_heads=4, d_ff=384, context=256),
    "small": dict(d_model=384, n_layers=6, n_heads=6, d_ff=1024, context=512),
    "base": dict(d_model=768, n_layers=12, n_heads=12, d_ff=2048, context=1024),
}


def preset(name: str, vocab: int = 257, **overrides) -> ModelConfig:
    """A preset's config for a tokenizer of `vocab` ids, with any field overridden."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    d = dict(PRESETS[name], vocab_size=vocab)
    d.update({k: v for k, v in overrides.items() if v is not None})
    return ModelConfig.from_dict(d)
