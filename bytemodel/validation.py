"""Checks on training settings and on the training state a checkpoint carries.

Settings come from flags, from the Python API, and on --resume from the checkpoint itself, which a
user (or a damaged disk, or a hostile file) may have changed; each must be refused with one line
before any work, never reach NumPy as a NaN or a negative seed, nor start a million threads.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from .errors import CheckpointError, ConfigError

MAX_WORKERS = 256   # each CPU worker holds a full gradient buffer (training) or a model replica and its
                    # caches (compress: --workers 2000 took 7.9 GB and 27x the time); more threads than
                    # this are never useful and a typo (or a crafted checkpoint) could ask for 10^6


def whole(v) -> bool:
    """A whole number (a Python or NumPy integer; not a bool, which is an int to Python)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def number(v) -> bool:
    """A real number (a Python or NumPy int or float; not a bool)."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def check_workers(workers) -> None:
    """CPU threads (training, compress, decompress): 0 or None (one per core) .. MAX_WORKERS."""
    if workers is None:
        return
    if not whole(workers) or not 0 <= workers <= MAX_WORKERS:
        raise ConfigError(f"workers must be 0 (one per core) .. {MAX_WORKERS}, got {workers!r}")


def check_train_numbers(tc) -> None:
    """The numeric settings TrainConfig.validate leaves to us: ranges that NaN and inf slip past."""
    if not whole(tc.seed) or tc.seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {tc.seed!r}")
    check_workers(tc.workers)
    for name in ("grad_clip", "weight_decay"):
        v = getattr(tc, name)
        if not (v >= 0 and math.isfinite(v)):
            raise ConfigError(f"{name.replace('_', '-')} must be a finite number >= 0, got {v}")
    for name in ("beta1", "beta2"):
        v = getattr(tc, name)
        if not 0 <= v < 1:
            raise ConfigError(f"{name} must be in [0, 1), got {v}")
    if not 0 <= tc.min_lr_ratio <= 1:
        raise ConfigError(f"min-lr-ratio must be in [0, 1], got {tc.min_lr_ratio}")


def field_defaults(cls) -> dict:
    """Each field of a settings dataclass (TrainConfig) -> its default."""
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)}


def setting_type(default, v) -> tuple[bool, str]:
    """Whether v has the type of a TrainConfig field whose default is `default` (an int may stand
    for a float; NumPy numbers count), and the words for that type."""
    if isinstance(default, bool):
        return isinstance(v, (bool, np.bool_)), "true or false"
    if isinstance(default, int):
        return whole(v), "a whole number"
    if isinstance(default, float):
        return number(v), "a number"
    return isinstance(v, type(default)), f"a {type(default).__name__}"


def setting_error(name: str, want: str, v) -> ConfigError:
    """A training setting of the wrong type, in the CLI's spelling of its name (TrainConfig.validate
    and the API's keywords say it alike)."""
    auto = " (-1: auto)" if name in ("dropout", "dropout_attn") else ""
    return ConfigError(f"{name.replace('_', '-')} must be {want}{auto}, got {v!r}")


def check_train_types(tc) -> None:
    """Each setting of the field's own type (setting_type), so a setting of the wrong type is one
    line, not a TypeError deep in the run (steps="5", lr="1e-3") nor taken as something else
    (steps=2.5 trained 2 steps, baseline="no" measured)."""
    for name, default in field_defaults(type(tc)).items():
        ok, want = setting_type(default, getattr(tc, name))
        if not ok:
            raise setting_error(name, want, getattr(tc, name))


def _typed(name: str, default, value, where: str):
    """`value` if it has the type of the field's default (setting_type: an int may stand for a float)."""
    if not setting_type(default, value)[0]:
        raise CheckpointError(f"{where}: training setting {name} is {value!r}, not a {type(default).__name__}")
    return float(value) if isinstance(default, float) else value


def stored_train_config(cls, train: dict, where: str, **given):
    """Rebuild a TrainConfig (class `cls`) from a checkpoint's training state, strictly.

    given: settings that replace the stored ones (steps, out_dir, device, precision).
    """
    stored = train.get("config")
    if not isinstance(stored, dict) or not stored:
        raise CheckpointError(f"{where} holds no training state to resume from")
    step = train.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"{where}: the training state has no valid step count ({step!r})")
    defaults = field_defaults(cls)
    unknown = sorted(set(stored) - set(defaults))
    if unknown:
        raise CheckpointError(f"{where}: unknown training setting(s) {', '.join(unknown)}")
    kw = {name: _typed(name, defaults[name], value, where) for name, value in stored.items()}
    for key in ("optim", "scaler"):
        if not isinstance(train.get(key, {}), dict):
            raise CheckpointError(f"{where}: the training state's {key} is not a JSON object")
    t = train.get("optim", {}).get("t")
    if isinstance(t, bool) or not isinstance(t, int) or t < 0:
        raise CheckpointError(f"{where}: the training state has no valid optimizer state (optim.t is {t!r}); "
                              f"it cannot be resumed")
    sc = train.get("scaler")
    if sc is not None:
        scale, good = sc.get("scale"), sc.get("good")
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (0 < scale < math.inf) \
                or isinstance(good, bool) or not isinstance(good, int) or good < 0:
            raise CheckpointError(f"{where}: the training state's loss scaler is not valid ({sc!r:.60})")
    kw.update({k: v for k, v in given.items()})
    return cls(**kw)


# what --resume takes from the command line; every other setting is the run's own
HONOURED_ON_RESUME = ("steps", "device", "precision", "tokenizer", "out_dir", "distributed", "shard_optimizer")


_FLAG = {"d_model": "--d-model", "n_layers": "--n-layers", "n_heads": "--n-heads", "n_kv_heads": "--n-kv-heads",
         "d_ff": "--d-ff", "rope_theta": "--rope-theta", "mtp": "--mtp", "mtp_weight": "--mtp-weight",
         "mtp_design": "--mtp-design", "tie_embeddings": "--tie-embeddings"}
_PRESET_ZERO = ("context",)     # stored as 0 ("the preset's"): the run keeps its model's value


def note_ignored_on_resume(stored: dict, given: dict, log, cfg=None) -> None:
    """Say which settings given with --resume the run keeps from its checkpoint instead, each with
    the value it keeps (the model's own, from ``cfg``, for model settings and a preset's context)."""
    model = cfg.to_dict() if cfg is not None else dict(stored.get("model") or {})
    for name in sorted(given):
        if name in HONOURED_ON_RESUME:
            continue
        if name == "model":
            for k, v in sorted((given[name] or {}).items()):
                if k in model and model[k] != v:
                    log(f"note: {_FLAG.get(k, k)} {v} ignored on --resume: the run keeps its own {model[k]}")
            continue
        kept = stored.get(name)
        if name in _PRESET_ZERO and not kept and name in model:
            kept = model[name]
        if name in stored and given[name] != kept:
            log(f"note: --{name.replace('_', '-')} {given[name]} ignored on --resume: "
                f"the run keeps its own {kept}")


def bytes_like(data, what: str) -> bytes:
    """The bytes an API call works on (LanguageModel's calls, readers.write_output,
    Tokenizer.encode): bytes-like (bytes, bytearray, memoryview, a uint8 NumPy array) as they are,
    a str as its UTF-8 bytes; anything else is one clear error (before:
    TypeError "string argument without an encoding" and the like; an int n, which bytes() reads
    as n zero bytes, was a prompt of zeros)."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:   # bytes() of an int64 array is 8 bytes an element: never what was meant
            raise ConfigError(f"{what} takes a NumPy array of uint8, not of {data.dtype} "
                              f"(.astype(np.uint8) if its values are bytes)")
        return data.tobytes()
    raise ConfigError(f"{what} takes bytes (or a str, read as UTF-8), not a {type(data).__name__}")
