"""Reading the weights of a Hugging Face model directory: safetensors only, any float dtype -> float32.

The safetensors file is an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
data_offsets}} (plus "__metadata__"), then the raw little-endian tensor bytes. It is read here
directly (rather than through safetensors.numpy) because NumPy has no bfloat16, the dtype most HF
checkpoints use: bf16 is the top half of a float32, so widening it is a 16-bit shift, exact.
Sharded checkpoints (model.safetensors.index.json) are read shard by shard. Pickled weights
(pytorch_model.bin) are refused: loading them could run code.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import CheckpointError
from ..fileguard import regular_file
from ..jsonguard import loads

_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"), "BF16": np.dtype("<u2")}
MAX_HEADER = 100 << 20  # a header longer than 100 MB is not a real checkpoint


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """{name: float32 array} of one .safetensors file; CheckpointError if it is not one."""
    regular_file(path, "weights file", CheckpointError)
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: too short to be a safetensors file")
            n = int.from_bytes(head, "little")
            if not 0 < n <= MAX_HEADER:
                raise CheckpointError(f"{path}: not a safetensors file (header length {n})")
            header = loads(f.read(n), f"{path}: the safetensors header", CheckpointError)
            data = np.fromfile(f, dtype=np.uint8)
    except OSError as e:
        raise CheckpointError(f"cannot read {path}: {e.strerror}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dt, shape, (a, b) = info["dtype"], [int(s) for s in info["shape"]], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: corrupt entry for tensor {name}") from None
        if dt not in _DTYPES:
            raise CheckpointError(f"{path}: tensor {name} is {dt}; only F32, F16, BF16 and F64 weights are read")
        size = _DTYPES[dt].itemsize
        if not (isinstance(a, int) and isinstance(b, int) and 0 <= a <= b <= len(data)) \
                or b - a != math.prod(shape) * size or any(s < 0 for s in shape):
            raise CheckpointError(f"{path}: tensor {name} lies outside the file (truncated or corrupt)")
        raw = data[a:b].view(_DTYPES[dt]).reshape(shape)
        if dt == "BF16":
            out[name] = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            out[name] = raw.astype(np.float32)
    return out


def read_dir_tensors(d: Path) -> dict[str, np.ndarray]:
    """All weights of a model directory: model.safetensors, or the shards its index names."""
    single, index = d / "model.safetensors", d / "model.safetensors.index.json"
    if single.is_file():
        return read_safetensors(single)
    if index.is_file():
        try:
            wm = loads(regular_file(index, "index", CheckpointError).read_bytes(), str(index), CheckpointError)["weight_map"]
            files = sorted(set(wm.values()))
        except (OSError, KeyError, TypeError, AttributeError):
            raise CheckpointError(f"{index}: not a valid safetensors index") from None
        out = {}
        for name in files:
            if not isinstance(name, str) or Path(name).name != name or not name.endswith(".safetensors"):
                raise CheckpointError(f"{index}: shard {name!r} is not a file name in {d}")
            out.update(read_safetensors(d / name))
        return out
    if any((d / n).exists() for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        raise CheckpointError(f"{d} holds pickled weights (pytorch_model.bin), which bytemodel does not load "
                              "(unpickling can run code); save the model with safetensors first")
    raise CheckpointError(f"{d}: no model.safetensors (or model.safetensors.index.json) found")


def tensor_names(path: Path) -> list[str]:
    """The tensor names in a safetensors file's header (without reading the tensors)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = loads(f.read(min(n, MAX_HEADER)), f"{path}: the safetensors header", CheckpointError)
    return [k for k in header if k != "__metadata__"]
