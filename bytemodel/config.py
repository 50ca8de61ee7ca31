"""Configuration: the model (ModelConfig, the named presets) and training (TrainConfig).

The preset names are the same in the CLI, tests and benchmarks. Both dataclasses are stored in
every checkpoint.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .errors import ConfigError


MAX_DROPOUT = 0.9   # past this nearly every activation is dropped; a typo, not a setting
MAX_CONTEXT = 1 << 20   # tokens: RoPE tables and KV caches are sized by the context (10^18 would be a bomb)


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
    mtp: int = 1                 # tokens predicted per position: 1 = the LM head only; K > 1 adds
                                 # K-1 multi-token heads (bytemodel/mtp.py) for t+2..t+K
    mtp_design: str = "sequential"   # "sequential" (head k reads head k-1) or "independent"; chosen
                                     # by measurement (benchmarks/README.md, MTP section)
    mtp_weight: float = 0.3      # the heads' auxiliary loss weight (mean over heads)
    dropout: float = 0.0         # drop probability on the embedding and both residual branches of
                                 # every layer while training (0: none; checkpoints before it: 0)
    dropout_attn: float = 0.0    # drop probability on the attention probabilities while training
                                 # (0: none; checkpoints before it: 0; the NumPy backend only)

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
        if self.context > MAX_CONTEXT:
            raise ConfigError(f"context {self.context} exceeds the {MAX_CONTEXT:,} tokens bytemodel supports")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ConfigError(f"head dim {self.head_dim} must be even for RoPE")
        if not isinstance(self.mtp, int) or isinstance(self.mtp, bool) or not 1 <= self.mtp <= 16:
            raise ConfigError(f"mtp must be an integer in 1..16, got {self.mtp!r}")
        if self.mtp_design not in ("independent", "sequential"):
            raise ConfigError(f"mtp_design must be 'independent' or 'sequential', got {self.mtp_design!r}")
        if not (isinstance(self.mtp_weight, (int, float)) and 0 <= self.mtp_weight < float("inf")):
            raise ConfigError(f"mtp_weight must be a finite number >= 0, got {self.mtp_weight!r}")
        if not (isinstance(self.dropout, (int, float)) and not isinstance(self.dropout, bool)
                and 0 <= self.dropout <= MAX_DROPOUT):
            raise ConfigError(f"dropout must be a number in [0, {MAX_DROPOUT}], got {self.dropout!r}")
        if not (isinstance(self.dropout_attn, (int, float)) and not isinstance(self.dropout_attn, bool)
                and 0 <= self.dropout_attn <= MAX_DROPOUT):
            raise ConfigError(f"dropout_attn must be a number in [0, {MAX_DROPOUT}], got {self.dropout_attn!r}")
        for f in ("rope_theta", "norm_eps", "init_std"):
            v = getattr(self, f)
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"{f} must be a positive finite number, got {v!r}")

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


DISTRIBUTED_MODES = ("auto", "mpi", "off")   # see distributed.connect


@dataclass
class TrainConfig:
    """Every training setting; stored in the checkpoint. 0 / -1 / "auto" mean: chosen by the run
    (bytemodel/training/autoconf.py: per-preset lr, warmup, batch and eval_every; preset by corpus size and
    device; precision by GPU)."""
    source: str = ""
    out_dir: str = ""
    preset: str = "auto"       # tiny / small / base, or auto: by corpus size and device (training/autoconf.py)
    steps: int = 1000          # optimizer steps (with `minutes`: planned from the measured speed)
    batch_size: int = 0        # windows per step; 0: the preset's (autoconf.PRESET_TRAIN)
    context: int = 0           # 0: the preset's context
    lr: float = 0.0            # peak learning rate; 0: the preset's (autoconf.PRESET_TRAIN)
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    warmup: int = -1           # linear warmup steps; -1: the preset's (autoconf.PRESET_TRAIN); a
                               # warmup not shorter than the run is scaled to a tenth of it
    weight_decay: float = 0.1  # AdamW decoupled decay on matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0     # global-norm clip; 0 disables
    seed: int = 0              # init and sampler seed
    eval_every: int = 0        # steps between validations (and checkpoints); 0: the preset's
    eval_tokens: int = 0       # validation tokens scored each time (evenly spread windows); 0: at most
                               # autoconf.GPU_EVAL_TOKENS on a GPU, autoconf.CPU_EVAL_TOKENS on the CPU
    val_fraction: float = 0.1  # tail of the corpus held out
    patience: int = 5          # stop after this many validations without a new best; 0: never
    schedule: str = "plateau"  # learning rate after the warmup: plateau, the cosine halved from the best
                               # weights at each validation plateau (training/plateau.py; benchmarks/
                               # README.md, "The plateau schedule"), or cosine to the plan's end; a
                               # checkpoint without it ran cosine
    dropout: float = -1.0      # the model's dropout (ModelConfig.dropout); -1: auto, by the passes
                               # the run plans (training/autoconf.py; a time budget at its plan step)
    dropout_attn: float = -1.0  # ModelConfig.dropout_attn; -1: auto for a new run (autoconf.auto_dropout_attn),
                                # a fine-tune keeps its parent's
    minutes: float = 0.0       # time budget; > 0 plans `steps` from the measured step time (training/budget.py)
    device: str = "cpu"
    precision: str = "auto"    # auto: fp32 on the CPU, bf16 on GPUs of compute capability >= 8.0, else fp16
    reader: str = ""           # "" = detect from the file
    merges: int = 0            # BPE merges learned from the source (0 = plain bytes)
    tokenizer: str = ""        # a tok.json to use instead of learning merges ("" = none)
    workers: int = 0           # CPU threads, each running a slice of the batch (0 = one per core)
    distributed: str = "auto"  # auto: MPI when mpiexec/srun started several ranks; mpi: always; off
    shard_optimizer: bool = False  # ZeRO-1: each MPI rank keeps 1/N of the AdamW moments
    baseline: bool = True      # measure zstd -19 / xz -9e on the same data (summary and loss.png)
    plot: bool = True          # write loss.png in the run directory at the end
    model: dict = field(default_factory=dict)  # ModelConfig overrides
    # fine-tuning (bytemodel.finetune): start from another run's weights, with its tokenizer
    parent: str = ""           # the run directory or checkpoint the weights come from ("" = none)
    parent_sha256: str = ""    # the parent's weights checksum, recorded when the run starts
    examples: str = ""         # "pairs" or "chat": source is a JSONL file of examples ("" = plain data)
    val_source: str = ""       # held-out examples (JSONL); "" = hold out val_fraction of them

    def freeze(self) -> "TrainConfig":
        """A copy that refuses changes: a run's settings once resolved (training/prepare.py). What
        the run decides as it trains (its planned steps, why it stopped) is loop state instead."""
        out = dataclasses.replace(self)
        object.__setattr__(out, "_frozen", True)
        return out

    def __setattr__(self, name, value):
        if self.__dict__.get("_frozen"):
            raise dataclasses.FrozenInstanceError(f"the run's settings are resolved; cannot set {name}")
        object.__setattr__(self, name, value)

    def validate(self) -> None:
        from .validation import check_train_numbers, check_train_types
        check_train_types(self)     # first: the checks below compare numbers
        if self.steps <= 0:
            raise ConfigError(f"steps must be positive, got {self.steps}")
        for f in ("batch_size", "eval_every", "eval_tokens", "patience"):   # 0: auto, or off
            if getattr(self, f) < 0:
                raise ConfigError(f"{f.replace('_', '-')} must be >= 0, got {getattr(self, f)}")
        if self.context < 0:
            raise ConfigError(f"context must be positive, got {self.context}")
        if self.workers < 0:
            raise ConfigError(f"workers must be >= 0, got {self.workers}")
        if self.merges < 0:
            raise ConfigError(f"merges must be >= 0, got {self.merges}")
        if not (self.lr >= 0 and math.isfinite(self.lr)):
            raise ConfigError(f"lr must be a positive number, got {self.lr}")
        if not (self.minutes >= 0 and math.isfinite(self.minutes)):
            raise ConfigError(f"minutes must be >= 0, got {self.minutes}")
        if self.precision not in ("auto", "fp32", "fp16", "bf16"):
            raise ConfigError(f"unknown precision {self.precision!r}; choose one of auto, fp32, fp16, bf16")
        if not 0 < self.val_fraction < 1:
            raise ConfigError(f"val-fraction must be between 0 and 1, got {self.val_fraction}")
        if self.distributed not in DISTRIBUTED_MODES:
            raise ConfigError(f"unknown distributed mode {self.distributed!r}; choose one of "
                              f"{', '.join(DISTRIBUTED_MODES)}")
        if self.preset not in PRESETS and self.preset != "auto":
            raise ConfigError(f"unknown preset {self.preset!r}; choose one of auto, {', '.join(PRESETS)}")
        if not (self.dropout == -1 or 0 <= self.dropout <= MAX_DROPOUT):
            raise ConfigError(f"dropout must be auto or in [0, {MAX_DROPOUT}], got {self.dropout}")
        if not (self.dropout_attn == -1 or 0 <= self.dropout_attn <= MAX_DROPOUT):
            raise ConfigError(f"dropout-attn must be in [0, {MAX_DROPOUT}], got {self.dropout_attn}")
        if self.schedule not in ("cosine", "plateau"):
            raise ConfigError(f"unknown schedule {self.schedule!r}; choose cosine or plateau")
        if self.warmup < -1 or self.grad_clip < 0 or self.weight_decay < 0:
            raise ConfigError("warmup, grad-clip and weight-decay must be >= 0")
        check_train_numbers(self)   # seed, the workers bound, NaN and inf


_PATHS = ("source", "out_dir", "tokenizer", "parent", "val_source")   # a pathlib.Path stands for its str


def train_settings(settings: dict) -> dict:
    """The Python API's training keywords checked against TrainConfig's fields (bytemodel.train,
    bytemodel.finetune): an unknown name, or a value not of its field's type, is one ConfigError
    (before: steps="10" failed deep inside as a TypeError, and steps=2.5 trained 3 steps). An int
    stands for a float, a NumPy number for a Python one, a path-like for a path setting's str, and
    "auto" for dropout's and dropout_attn's -1."""
    import os
    from .validation import field_defaults, setting_error, setting_type
    defaults = field_defaults(TrainConfig)
    bad = sorted(set(settings) - set(defaults))
    if bad:
        raise ConfigError(f"unknown training setting(s): {', '.join(bad)}")
    out = {}
    for name, v in settings.items():
        default = defaults[name]
        if name in ("dropout", "dropout_attn") and isinstance(v, str) and v == "auto":
            v = -1.0
        if name in _PATHS and isinstance(v, os.PathLike):
            v = os.fspath(v)
        ok, want = setting_type(default, v)
        if ok and not isinstance(default, (str, dict)):   # a NumPy number as Python's (the checkpoint is JSON)
            v = type(default)(v)
        elif not ok and name in _PATHS:
            want += " or a path"
        if not ok:   # in check_train_types's words (TrainConfig.validate's)
            raise setting_error(name, want, v)
        out[name] = v
    return out
