"""What general-purpose compressors achieve on the same bytes: the bar a model should clear.

bits/byte = 8 * compressed size / original size, for zstd level 19 and xz (LZMA2) preset 9.
Measured on the concatenated documents the model trains on, up to MAX_BYTES (compressing more
is slow at these levels and changes the figure little).
"""
from __future__ import annotations

import lzma

MAX_BYTES = 16 * 2 ** 20


def compress_bpb(data: bytes) -> dict:
    import zstandard
    n = max(len(data), 1)
    z = len(zstandard.ZstdCompressor(level=19).compress(data))
    x = len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    return {"bytes": len(data), "zstd19": 8 * z / n, "xz9": 8 * x / n}


def source_baselines(source: str, reader: str | None = None, max_bytes: int = MAX_BYTES) -> dict:
    from .readers import read_documents
    buf = bytearray()
    for doc in read_documents(source, reader):
        buf += doc[: max_bytes - len(buf)]
        if len(buf) >= max_bytes:
            break
    return compress_bpb(bytes(buf))
