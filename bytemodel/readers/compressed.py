"""Transparent decompression for readers of compressed text-like files (.fa.gz, .txt.xz, ...).

``open_decompressed(path)`` looks at the first bytes, not the name: gzip (also dictzip .dz), xz,
bzip2 and zstd streams are decompressed on the fly; anything else is read as it is.
``pieces(f, path)`` reads such a stream in bounded pieces and turns every decoder failure
(truncated, corrupt) into a one-line SourceError. ``open_compressed_write(path)`` picks the
compressor from the path's last extension (.gz .xz .bz2 .zst) for writers.
"""
from __future__ import annotations

import bz2
import gzip
import lzma
import os
import zlib
from pathlib import Path
from typing import BinaryIO, Iterator

from ..errors import SourceError
from .base import CHUNK, need, open_binary

GZIP = b"\x1f\x8b"
XZ = b"\xfd7zXZ\x00"
BZIP2 = b"BZh"
ZSTD = b"\x28\xb5\x2f\xfd"
COMPRESSED_SUFFIXES = (".gz", ".xz", ".bz2", ".zst")


def compression_of(head: bytes) -> str | None:
    """'gzip' | 'xz' | 'bzip2' | 'zstd' | None from a file's first bytes."""
    if head.startswith(GZIP):
        return "gzip"
    if head.startswith(XZ):
        return "xz"
    if head.startswith(BZIP2) and len(head) >= 4 and head[3:4] in b"123456789":
        return "bzip2"
    if head.startswith(ZSTD):
        return "zstd"
    return None


def open_decompressed(path: str | os.PathLike) -> BinaryIO:
    """Open a file for binary reading, decompressing gzip/xz/bzip2/zstd by magic bytes."""
    f = open_binary(path)
    head = f.read(6)
    f.seek(0)
    kind = compression_of(head)
    if kind == "gzip":
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    if kind == "xz":
        return lzma.LZMAFile(f, mode="rb")  # type: ignore[return-value]
    if kind == "bzip2":
        return bz2.BZ2File(f, mode="rb")  # type: ignore[return-value]
    if kind == "zstd":
        from .zstd import check_frames
        check_frames(f, path)
        zstandard = need("zstandard", "zstandard", "zstd")
        return zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True, closefd=True)
    return f


def pieces(f: BinaryIO, path: str | os.PathLike, size: int = CHUNK) -> Iterator[bytes]:
    """Read ``f`` in pieces of at most ``size`` bytes; decoder errors become SourceErrors."""
    errors: tuple[type[BaseException], ...] = (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError)
    try:
        import zstandard
        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    while True:
        try:
            b = f.read(size)
        except errors as e:
            msg = str(e) or type(e).__name__
            if isinstance(e, EOFError):
                msg = "compressed stream is truncated (" + msg + ")"
            raise SourceError(f"cannot decode {path}: {msg}") from None
        if not b:
            return
        yield b


def open_compressed_write(path: str | os.PathLike, raw: BinaryIO) -> BinaryIO:
    """Wrap an open binary file in the compressor its name asks for (.gz .xz .bz2 .zst), or not."""
    suffix = Path(path).suffix.lower()
    if suffix == ".gz":
        return gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6)  # type: ignore[return-value]
    if suffix == ".xz":
        return lzma.LZMAFile(raw, mode="wb")  # type: ignore[return-value]
    if suffix == ".bz2":
        return bz2.BZ2File(raw, mode="wb")  # type: ignore[return-value]
    if suffix == ".zst":
        zstandard = need("zstandard", "zstandard", "zstd")
        return zstandard.ZstdCompressor(level=19, write_checksum=True).stream_writer(raw, closefd=False)
    return raw


def strip_compressed_suffix(name: str) -> str:
    """'x.fa.gz' -> 'x.fa'; names without a compression suffix come back unchanged."""
    low = name.lower()
    for s in COMPRESSED_SUFFIXES:
        if low.endswith(s):
            return name[: -len(s)]
    return name
