"""What general-purpose compressors achieve on the same bytes: the bar a model should clear.

bits/byte = 8 * compressed size / original size, for zstd level 19 and xz (LZMA2) preset 9e,
in two ways:
- whole: the whole stream, as `zstd -19 FILE` would compress it;
- tail:  the held-out tail given the rest, 8 * (C(all) - C(head)) / len(tail): what the tail
         costs a compressor that has already seen the training part. This is the figure to set
         beside the model's validation bits/byte, which is also the cost of the tail after
         training on the head.
Measured on the concatenated documents the model trains on, up to MAX_BYTES (compressing more
is slow at these levels and changes the figure little).
"""
from __future__ import annotations

import lzma

MAX_BYTES = 16 * 2 ** 20


def _sizes(data: bytes) -> tuple[float, int]:
    """(zstd -19 size or nan where zstandard is not installed, xz -9e size)."""
    try:
        import zstandard
        z = len(zstandard.ZstdCompressor(level=19).compress(data))
    except ImportError:
        z = float("nan")
    x = len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    return z, x


def compress_bpb(data: bytes, tail_fraction: float = 0.1) -> dict:
    n = max(len(data), 1)
    z, x = _sizes(data)
    cut = len(data) - int(len(data) * tail_fraction)
    zh, xh = _sizes(data[:cut])
    tail = max(len(data) - cut, 1)
    return {"bytes": len(data), "zstd19": 8 * z / n, "xz9": 8 * x / n,
            "zstd19_tail": 8 * (z - zh) / tail, "xz9_tail": 8 * (x - xh) / tail}


def source_baselines(source: str, reader: str | None = None, tail_fraction: float = 0.1,
                     max_bytes: int = MAX_BYTES) -> dict:
    from .readers import read_documents
    buf = bytearray()
    for doc in read_documents(source, reader):
        buf += doc[: max_bytes - len(buf)]
        if len(buf) >= max_bytes:
            break
    return compress_bpb(bytes(buf), tail_fraction)
