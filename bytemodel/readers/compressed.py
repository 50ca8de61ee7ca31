"""Transparent decompression for readers of compressed text-like files (.fa.gz, .txt.xz, ...).

``open_decompressed(path)`` looks at the first bytes, not the name: gzip (also dictzip .dz), xz,
bzip2 and zstd streams are decompressed on the fly; anything else is read as it is.
``pieces(f, path)`` reads such a stream in bounded pieces and turns every decoder failure
(truncated, corrupt) into a one-line SourceError. ``open_compressed_write(path)`` picks the
compressor from the path's last extension (.gz .xz .bz2 .zst) for writers. ``check_frames``
walks a zstd file's frame headers first, so a truncated or garbled one is refused with the offset.
"""
from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import struct
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
ZSTD_SKIPPABLE_LOW, ZSTD_SKIPPABLE_HIGH = 0x184D2A50, 0x184D2A5F


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
    if kind in ("xz", "bzip2"):   # strictly: bytes after the last stream are refused, as gzip does
        from .multistream import open_strict
        return open_strict(f, kind)
    if kind == "zstd":
        check_frames(f, path)
        zstandard = need("zstandard", "zstandard", "zstd")
        return zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True, closefd=True)
    return f


def check_frames(f: BinaryIO, path: str | os.PathLike) -> int:
    """Walk every frame's headers of a seekable zstd file; returns the number of data frames.

    Raises SourceError for a file that is empty, does not start with a frame, ends inside a frame,
    uses a reserved block type, or has bytes after its last frame. Leaves ``f`` at offset 0.
    """
    start = f.tell()
    end = f.seek(0, io.SEEK_END)
    pos = f.seek(start)
    frames = 0

    def need_bytes(n: int, what: str) -> bytes:
        b = f.read(n)
        if len(b) < n:
            raise SourceError(f"truncated zstd stream {path}: file ends at byte {end} inside {what} "
                              f"of frame {frames + 1}")
        return b

    if end == start:
        raise SourceError(f"not a zstd stream: {path} is empty")
    while pos < end:
        if end - pos < 4:
            raise SourceError(f"corrupt zstd stream {path}: {end - pos} stray bytes at offset {pos}")
        (magic,) = struct.unpack("<I", f.read(4))
        if ZSTD_SKIPPABLE_LOW <= magic <= ZSTD_SKIPPABLE_HIGH:
            (size,) = struct.unpack("<I", need_bytes(4, "a skippable frame header"))
            if f.tell() + size > end:
                raise SourceError(f"truncated zstd stream {path}: skippable frame at offset {pos} "
                                  f"runs past the end of the file")
            pos = f.seek(size, io.SEEK_CUR)
            continue
        if magic != 0xFD2FB528:
            where = "does not start with a zstd frame" if pos == start else f"has unexpected bytes at offset {pos}"
            raise SourceError(f"corrupt zstd stream {path}: {where} (magic {magic:08x})")
        (fhd,) = need_bytes(1, "the frame header")
        if fhd & 0x08:
            raise SourceError(f"corrupt zstd stream {path}: reserved bit set in frame header at offset {pos}")
        single = bool(fhd & 0x20)
        fcs_size = (1 if single else 0, 2, 4, 8)[fhd >> 6]
        dict_size = (0, 1, 2, 4)[fhd & 0x03]
        need_bytes((0 if single else 1) + dict_size + fcs_size, "the frame header")
        while True:
            (b0, b1, b2) = need_bytes(3, "a block header")
            h = b0 | (b1 << 8) | (b2 << 16)
            last, btype, bsize = h & 1, (h >> 1) & 3, h >> 3
            if btype == 3:
                raise SourceError(f"corrupt zstd stream {path}: reserved block type at offset {f.tell() - 3}")
            content = 1 if btype == 1 else bsize
            if f.tell() + content > end:
                raise SourceError(f"truncated zstd stream {path}: file ends at byte {end} inside a block "
                                  f"of frame {frames + 1}")
            f.seek(content, io.SEEK_CUR)
            if last:
                break
        if fhd & 0x04:
            need_bytes(4, "the content checksum")
        frames += 1
        pos = f.tell()
    f.seek(start)
    if frames == 0:
        raise SourceError(f"not a zstd stream: {path} holds only skippable frames")
    return frames


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

